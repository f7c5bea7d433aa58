//! The service's state: the datasets it caches (each a cache of its own, shared by every mount
//! of the same shared directory), the mounts it serves per user, and why a request is refused.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::proto::{self, DatasetStatus, Reply};
use crate::cache::{Cache, CacheConfig};
use crate::core::sync::lock;
use crate::daemon::config::MountConfig;
use crate::stats::Stats;

/// What `dyadfs node serve` is asked to be.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's cache directory on its NVMe: each dataset's cache is a directory in
    /// `datasets/`, and each mount's own small state one in `mounts/`.
    pub ssd: PathBuf,
    pub socket: PathBuf,
    /// What every mount the service serves is, but for its mount point and dataset (the
    /// defaults of `dyadfs mount`, read-only, opens asked; `capacity` the node's, shared).
    pub template: MountConfig,
    /// The most one dataset may hold, whatever its share (`--dataset-max`).
    pub dataset_max: Option<u64>,
    /// The most one user's datasets may hold together, whatever its share (`--user-max`).
    pub user_max: Option<u64>,
    /// Where to serve every dataset's counters as Prometheus metrics (`--metrics-listen`).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// What this node gives the site's other nodes at most.
    pub serving: super::site::ServingBudget,
}

/// Mounts one user may have served at once (each holds its own request threads); root's are
/// not bounded.
pub const MAX_MOUNTS_PER_USER: usize = 16;

/// The running service's state.
pub struct Node {
    pub config: NodeConfig,
    pub datasets: Mutex<HashMap<String, Arc<Dataset>>>,
    pub in_flight: AtomicUsize,
    /// Numbers the mounts' own directories.
    pub next_mount: AtomicU64,
    /// Mounts served now, per user.
    pub mounts_of: Mutex<HashMap<u32, usize>>,
    /// Bytes every dataset's cache together may hold (`--capacity`, or all but 10% of the
    /// cache's file system), known once [`Node::load`] ran.
    capacity: AtomicU64,
    /// The site this node serves datasets to and pulls them from (`--site-peers`).
    pub site: Option<super::site::Site>,
}

impl Node {
    pub fn new(config: NodeConfig, site: Option<super::site::Site>) -> Node {
        Node {
            site,
            config,
            datasets: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            next_mount: AtomicU64::new(0),
            mounts_of: Mutex::default(),
            capacity: AtomicU64::new(0),
        }
    }

    /// Opens every dataset cached before (the service restarted: what it held is served
    /// again), then settles the node's capacity and each dataset's share of it.
    pub fn load(&self) -> Result<(), Refusal> {
        let dir = self.config.ssd.join("datasets");
        let mut keys: Vec<String> = std::fs::read_dir(&dir)
            .map_err(io_refusal("the datasets' directory"))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        keys.sort();
        let mut datasets = lock(&self.datasets);
        for key in keys {
            let backing = std::fs::read_to_string(self.record(&key, "backing"))
                .map(|p| PathBuf::from(p.trim_end_matches('\n')))
                .unwrap_or_default();
            let d = self.open(&key, &backing)?;
            datasets.insert(key, d);
        }
        let used: u64 = datasets.values().map(|d| d.cache.used_bytes()).sum();
        let capacity = match self.config.template.capacity {
            Some(c) => c,
            None => crate::cache::default_capacity(&self.config.ssd, used)
                .map_err(io_refusal("the cache's file system"))?,
        };
        self.capacity.store(capacity, Ordering::Relaxed);
        tracing::info!(
            datasets = datasets.len(),
            used,
            capacity,
            "the node's cache loaded"
        );
        if used > capacity {
            // Said once, loudly: a restart evicting millions of files unannounced looked like
            // a slow start (the default capacity shrinks as other files fill the disk).
            tracing::warn!(
                used,
                capacity,
                evicting = used - capacity,
                given = self.config.template.capacity.is_some(),
                "the node's cache holds more than its capacity: the excess is evicted now \
                 (without --capacity, the capacity is what leaves 10% of the disk free)"
            );
        }
        self.share(&datasets);
        Ok(())
    }

    /// What the service's `/metrics` serves: every dataset's counters, labelled by its key.
    pub fn metrics(&self) -> String {
        let rows: Vec<_> = lock(&self.datasets)
            .values()
            .map(|d| (d.key.clone(), d.snapshot()))
            .collect();
        crate::metrics::render_datasets(&rows)
    }

    /// `dyadfs node status`.
    pub fn status(&self) -> proto::NodeStatus {
        let datasets = lock(&self.datasets);
        let mut list: Vec<_> = datasets.values().map(|d| d.status()).collect();
        list.sort_by(|a, b| a.key.cmp(&b.key));
        proto::NodeStatus {
            version: proto::VERSION,
            cache: self.config.ssd.clone(),
            capacity: self.capacity.load(Ordering::Relaxed),
            site: self.site.as_ref().map(|s| s.status()),
            users: Self::users(&datasets),
            datasets: list,
        }
    }

    /// The dataset `key`, its cache opened at its first attach and kept for the service's life;
    /// a new dataset takes its share of the node's capacity from the others.
    pub fn dataset(&self, key: &str, backing: &Path, uid: u32) -> Result<Arc<Dataset>, Refusal> {
        let mut datasets = lock(&self.datasets);
        let dataset = match datasets.get(key) {
            Some(d) => d.clone(),
            None => {
                std::fs::write(
                    self.record(key, "backing"),
                    format!("{}\n", backing.display()),
                )
                .map_err(io_refusal("the dataset's record"))?;
                let d = self.open(key, backing)?;
                datasets.insert(key.to_string(), d.clone());
                d
            }
        };
        let users = {
            let mut users = lock(&dataset.users);
            users
                .insert(uid)
                .then(|| users.iter().map(u32::to_string).collect::<Vec<_>>())
        };
        if let Some(users) = users {
            // Its users outlive the service: their shares are the same after its restart.
            let record = self.record(key, "users");
            if let Err(e) = std::fs::write(&record, users.join(" ") + "\n") {
                tracing::warn!(error = %e, "the dataset's users were not recorded");
            }
            self.share(&datasets);
        }
        Ok(dataset)
    }

    /// `dyadfs node evict`: dataset `key`'s files that are not open now leave the cache; a
    /// dataset no mount serves leaves whole (its directory and record deleted).
    pub fn evict(&self, key: &str) -> Result<Reply, Refusal> {
        let mut datasets = lock(&self.datasets);
        let Some(d) = datasets.get(key).cloned() else {
            return Err(Refusal(libc::ENOENT, format!("no dataset {key} here")));
        };
        let (files, bytes) = (d.cache.cached_files(), d.cache.used_bytes());
        let gone = d.mounts.load(Ordering::Relaxed) == 0;
        if gone {
            datasets.remove(key);
            if let Some(site) = &self.site {
                site.remove(key);
            }
            drop(d);
            let dir = self.config.ssd.join("datasets");
            std::fs::remove_dir_all(dir.join(key)).map_err(io_refusal("the dataset's cache"))?;
            let _ = std::fs::remove_file(self.record(key, "backing"));
            let _ = std::fs::remove_file(self.record(key, "users"));
            tracing::info!(dataset = key, files, bytes, "a dataset evicted");
            self.share(&datasets);
            return Ok(Reply::Evicted { files, bytes, gone });
        }
        d.cache.set_capacity(0);
        self.share(&datasets);
        // (Fills may have come meanwhile.)
        let files = files.saturating_sub(d.cache.cached_files());
        let bytes = bytes.saturating_sub(d.cache.used_bytes());
        tracing::info!(
            dataset = key,
            files,
            bytes,
            "a served dataset's closed files evicted"
        );
        Ok(Reply::Evicted { files, bytes, gone })
    }

    /// Shares the node's capacity fairly between users, then between each user's datasets
    /// ([`super::share`]); a dataset over its new room (a user or a dataset came) gives back
    /// its least recently used files at once. Every user of a dataset reads its one copy.
    fn share(&self, datasets: &HashMap<String, Arc<Dataset>>) {
        let capacity = self.capacity.load(Ordering::Relaxed);
        if datasets.is_empty() || capacity == 0 {
            return;
        }
        let list: Vec<&Arc<Dataset>> = datasets.values().collect();
        let users: Vec<Vec<u32>> = list.iter().map(|d| d.user_ids()).collect();
        let limits = super::share::Limits {
            user_max: self.config.user_max,
            dataset_max: self.config.dataset_max,
        };
        for (d, room) in list
            .iter()
            .zip(super::share::shares(capacity, &users, limits))
        {
            d.cache.set_capacity(room);
        }
    }

    /// Each user's datasets and the bytes it is charged for (`dyadfs node status`).
    fn users(datasets: &HashMap<String, Arc<Dataset>>) -> Vec<proto::UserStatus> {
        let list: Vec<(Vec<u32>, u64)> = datasets
            .values()
            .map(|d| (d.user_ids(), d.cache.used_bytes()))
            .collect();
        super::share::charged(&list)
            .into_iter()
            .map(|(uid, (datasets, bytes))| proto::UserStatus {
                uid,
                datasets,
                bytes,
            })
            .collect()
    }

    /// Dataset `key`'s record `what` beside its cache: `backing` (its path), `users` (who
    /// attached it).
    fn record(&self, key: &str, what: &str) -> PathBuf {
        self.config
            .ssd
            .join("datasets")
            .join(format!("{key}.{what}"))
    }

    /// Opens dataset `key`'s cache (made if new), its users from their record.
    fn open(&self, key: &str, backing: &Path) -> Result<Arc<Dataset>, Refusal> {
        let t = &self.config.template;
        let config = CacheConfig {
            dir: self.config.ssd.join("datasets").join(key),
            chunk_size: t.chunk_size as u32,
            // Its share is set once every dataset is counted (`share`).
            capacity: t.capacity,
            pack_max: t.pack_max.until_init(),
            max_partial_chunks: t.max_partial_chunks,
            open_files: t.open_files.unwrap_or(256),
        };
        std::fs::create_dir_all(&config.dir).map_err(io_refusal("the dataset's cache"))?;
        let stats = Arc::new(Stats::default());
        let cache = Cache::open(&config, stats.clone())
            .map_err(|e| Refusal(libc::EIO, format!("the dataset's cache: {e}")))?;
        // Its entries are in the cache's own line ("cache loaded"): counting the files with
        // bytes here took a lock per entry.
        tracing::info!(
            dataset = key,
            backing = %backing.display(),
            "a dataset's cache opened"
        );
        let cache = Arc::new(cache);
        if let Some(site) = &self.site {
            site.add(key, &cache, &stats);
        }
        Ok(Arc::new(Dataset {
            key: key.to_string(),
            backing: backing.to_path_buf(),
            cache,
            stats,
            mounts: AtomicU64::new(0),
            users: Mutex::new(recorded_users(&self.record(key, "users"))),
        }))
    }
}

/// The users a dataset's record names (none if it has no record, or a line that is not one).
fn recorded_users(record: &Path) -> BTreeSet<u32> {
    std::fs::read_to_string(record)
        .map(|t| {
            t.split_whitespace()
                .filter_map(|u| u.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// One dataset the node caches: a shared directory, whoever mounts it.
pub struct Dataset {
    pub key: String,
    /// Its path as the first user who attached it reached it.
    pub backing: PathBuf,
    pub cache: Arc<Cache>,
    pub stats: Arc<Stats>,
    pub mounts: AtomicU64,
    pub users: Mutex<BTreeSet<u32>>,
}

impl Dataset {
    /// Every user who attached it, by uid.
    pub fn user_ids(&self) -> Vec<u32> {
        lock(&self.users).iter().copied().collect()
    }

    /// Its counters as `dyadfs stats` keys (the node service's `/metrics`).
    pub fn snapshot(&self) -> crate::stats::Snapshot {
        let cache = &self.cache;
        self.stats.snapshot(crate::stats::Gauges {
            cached_bytes: cache.used_bytes(),
            cached_files: cache.cached_files(),
            cache_segments: cache.segment_files(),
            capacity_bytes: cache.capacity(),
            inodes: 0,
            open_files: cache.open_files(),
            prefetch_pending: 0,
            kept_files: 0,
            partial_chunks: cache.partial_chunks(),
        })
    }

    pub fn status(&self) -> DatasetStatus {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = &self.stats;
        DatasetStatus {
            key: self.key.clone(),
            backing: self.backing.clone(),
            cached_files: self.cache.cached_files(),
            cached_bytes: self.cache.used_bytes(),
            capacity: self.cache.capacity(),
            mounts: self.mounts.load(Ordering::Relaxed),
            users: self.user_ids(),
            local_hits: get(&s.local_hits),
            opens: get(&s.local_hits) + get(&s.peer_fetches) + get(&s.backing_fetches),
            bytes_from_backing: get(&s.bytes_from_backing),
            peer_fetches: get(&s.peer_fetches),
            bytes_from_peers: get(&s.bytes_from_peers),
            bytes_served_to_peers: get(&s.bytes_served_to_peers),
            rights_denied: get(&s.rights_denied),
        }
    }
}

/// Why an attach was refused: an errno and a line.
pub struct Refusal(pub i32, pub String);

impl From<Refusal> for Reply {
    fn from(Refusal(errno, message): Refusal) -> Reply {
        Reply::Refused { errno, message }
    }
}

pub fn io_refusal(what: &str) -> impl Fn(std::io::Error) -> Refusal + '_ {
    move |e| {
        Refusal(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("{what}: {e}"),
        )
    }
}

/// One of a user's [`MAX_MOUNTS_PER_USER`] mounts, given back when dropped.
pub struct MountSlot {
    node: Arc<Node>,
    uid: u32,
}

impl MountSlot {
    pub fn take(node: &Arc<Node>, uid: u32) -> Result<MountSlot, Refusal> {
        let mut of = lock(&node.mounts_of);
        let n = of.entry(uid).or_default();
        if uid != 0 && *n >= MAX_MOUNTS_PER_USER {
            return Err(Refusal(
                libc::EUSERS,
                format!(
                    "you have {} mounts served on this node already: unmount one",
                    MAX_MOUNTS_PER_USER
                ),
            ));
        }
        *n += 1;
        Ok(MountSlot {
            node: node.clone(),
            uid,
        })
    }
}

impl Drop for MountSlot {
    fn drop(&mut self) {
        let mut of = lock(&self.node.mounts_of);
        if let Some(n) = of.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                of.remove(&self.uid);
            }
        }
    }
}
