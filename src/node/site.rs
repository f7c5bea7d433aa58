//! The site: the node services of a cluster's nodes as one cache that outlives jobs. Each
//! service joins the site's members (`--site-peers`, under the site key `--site-key`), and the
//! copies of every dataset it holds are published to the site's locator, so a job on other
//! nodes, of another user, pulls them from their holders instead of the shared file system.
//!
//! One locator, one control port and one data plane serve every dataset of the node: a file is
//! known to the site as `<dataset key>/<path>` (the key is the shared directory's identity, the
//! same on every node), and a peer's pull is served from that dataset's cache. A node's mounts
//! read through a [`ClusterSource`] whose locator and puller add the prefix.
//!
//! What the site never does: read the shared file system for a peer (a holder serves only what
//! it has; a file nobody holds is read by the mount that wants it, as its user), or serve a
//! user without the user's own mount having judged the open first (`fs::rights`): the site's
//! traffic carries bytes between services that hold the site key, never decisions.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::publishing::SiteEvents;
use crate::backing::BackingStore;
use crate::cache::Cache;
use crate::cluster::peers::{Handler, RpcPeers};
use crate::cluster::source::{
    CacheStore, ClusterSource, Locate, Pull, ServiceLink, page_map, recheck_chunk,
};
use crate::core::Version;
use crate::daemon::UserError;
use crate::daemon::config::MountConfig;
use crate::locator::membership::{Membership, NodeId};
use crate::locator::proto::PageMap;
use crate::locator::service::{Hooks, LocatorService};
use crate::locator::tiers::Reply;
use crate::stats::Stats;
use crate::transport::TransportError;
use crate::transport::auth::Secret;
use crate::transport::pull::{self, PullConfig, Puller, Sink, Want};
use crate::transport::server::{ChunkStore, Server, Serving};

/// What a node gives the site's other nodes at most (`--site-serve-rate`, bytes per second;
/// `--site-serve-threads`, at the lowest CPU priority).
#[derive(Debug, Clone, Default)]
pub struct ServingBudget {
    pub rate: Option<u64>,
    pub threads: usize,
}

/// Each dataset's store peers pull from, by key.
type Stores = Arc<Mutex<HashMap<String, Arc<CacheStore>>>>;

/// This node's part of the site.
pub struct Site {
    pub locator: Arc<LocatorService>,
    /// The control port's, gossip's and publishes' runtime: the service's whole life.
    runtime: tokio::runtime::Runtime,
    puller: Arc<Puller>,
    stores: Stores,
    /// What the one publisher reads: every dataset's cache events, their paths prefixed.
    events: Arc<SiteEvents>,
    /// The locator's counters.
    stats: Arc<Stats>,
}

impl Site {
    /// Joins the site `args.cluster` describes (its peers file, this node's id, the site key):
    /// the control port bound, gossip started, the peers told this node (re)started.
    pub fn join(
        args: &MountConfig,
        serving: &ServingBudget,
        stats: Arc<Stats>,
    ) -> Result<Site, UserError> {
        use crate::daemon::{members, wiring};
        let id = members::node_id(args)?;
        let members = members::members(args, id)?;
        let ids: std::collections::HashSet<u32> = members.members().map(|m| m.id).collect();
        let listen = args
            .cluster
            .listen
            .unwrap_or_else(|| members.member(id).expect("own id checked").addr);
        let key = args.cluster.secret_file.as_ref().ok_or_else(|| {
            UserError::Node("a site needs its key (--site-key): the admin provisions it".into())
        })?;
        let mut secret = Secret::load(key).map_err(UserError::Secret)?;
        if let Some(also) = &args.cluster.secret_also {
            secret = secret.accepting(Secret::load(also).map_err(UserError::Secret)?);
        }
        let secret = Arc::new(secret);
        wiring::check_key(&members, id, &secret, args.cluster.peer_timeout).map_err(
            |e| match e {
                UserError::WrongKey(peers) => UserError::Node(format!(
                    "this node's site key is not the site's: the running services {peers} answered \
                 with proofs it does not check (a wrong or stale --site-key?)"
                )),
                e => e,
            },
        )?;
        let runtime = wiring::control_runtime()?;
        let (worker, background) = wiring::data_planes(args, &stats)?;
        let stores = Stores::default();
        let locator = LocatorService::new(
            members,
            args.cluster.peer_timeout,
            stats.clone(),
            RpcPeers::new(id, Some(secret.clone())),
            hooks(&stores),
        );
        let server = Server {
            worker: worker.clone(),
            background: Some(background),
            store: Arc::new(SiteStore {
                stores: stores.clone(),
                budget: Budget::new(serving.rate),
            }),
            node_id: id,
            faults: Default::default(),
            rpc: Some(Arc::new(Handler(locator.clone()))),
            secret: Some(secret.clone()),
            conns: Default::default(),
            pending: Default::default(),
            members: Arc::new(ids),
            serving: Serving::yielding(serving.threads),
        };
        let handle = runtime.handle().clone();
        wiring::start_gossip(args, id, listen, &locator, Some(secret.clone()), &handle)?;
        wiring::start_control_port(&runtime, listen, server)?;
        let events = Arc::new(SiteEvents::default());
        crate::cluster::source::start_publisher(events.clone(), locator.clone(), &handle);
        let wait = args.cluster.peer_timeout.min(Duration::from_secs(2));
        let answered = runtime.block_on(locator.rejoin(wait));
        tracing::info!(node = id, %listen, answered, "joined the site");
        let puller = Arc::new(Puller::new(
            worker,
            PullConfig {
                node_id: id,
                chunk: args.chunk_size as u32,
                window: 4,
                timeout: args.cluster.peer_timeout,
                background: false,
                secret: Some(secret),
                eager_max: args.cluster.eager_max.min(args.chunk_size) as u32,
            },
        ));
        Ok(Site {
            locator,
            runtime,
            puller,
            stores,
            events,
            stats,
        })
    }

    /// `dyadfs node status`'s line of the site.
    pub fn status(&self) -> super::proto::SiteStatus {
        use std::sync::atomic::Ordering::Relaxed;
        super::proto::SiteStatus {
            node: self.locator.me(),
            members: self.locator.membership.members().count(),
            home_rack_files: self.stats.home_rack_files.load(Relaxed),
            home_global_files: self.stats.home_global_files.load(Relaxed),
            members_down: self.stats.members_down.load(Relaxed),
            failovers: self.stats.failovers.load(Relaxed),
            copies_published: self.stats.copies_published.load(Relaxed),
        }
    }

    /// Serves dataset `key`'s cache to the site: peers may pull what it holds, and what it
    /// holds (now and from now on) is published.
    pub fn add(&self, key: &str, cache: &Arc<Cache>, stats: &Arc<Stats>) {
        let store = Arc::new(CacheStore {
            cache: cache.clone(),
            stats: stats.clone(),
            // A holder serves what it has: it never reads the shared FS for a peer's user.
            fetcher: None,
        });
        crate::core::sync::lock(&self.stores).insert(key.to_string(), store);
        if let Some(from_cache) = cache.take_events() {
            self.events.add(key, from_cache);
        }
    }

    /// Dataset `key` leaves the node: unpublished, its store gone.
    pub fn remove(&self, key: &str) {
        let Some(store) = crate::core::sync::lock(&self.stores).remove(key) else {
            return;
        };
        self.events.remove(key, store.cache.held());
    }

    /// The source of a mount of dataset `key`: this node's cache misses are located in the
    /// site and pulled from a holder, else read from `backing` (as the mount's user).
    pub fn source(
        &self,
        key: &str,
        backing: BackingStore,
        stats: Arc<Stats>,
    ) -> ClusterSource<SiteLink, SitePull> {
        let prefix = format!("{key}/");
        ClusterSource {
            locator: SiteLink {
                link: ServiceLink {
                    service: self.locator.clone(),
                    runtime: self.runtime.handle().clone(),
                },
                prefix: prefix.clone(),
            },
            puller: SitePull {
                puller: self.puller.clone(),
                prefix,
            },
            backing,
            stats,
            maps: Default::default(),
            spent: Default::default(),
        }
    }
}

/// A site path's dataset store and the path within the dataset.
fn store_of<'a>(stores: &Stores, path: &'a str) -> Option<(Arc<CacheStore>, &'a str)> {
    let (key, rest) = path.split_once('/')?;
    let store = crate::core::sync::lock(stores).get(key).cloned()?;
    Some((store, rest))
}

/// What the locator does for this node: re-announce every dataset's copies, say which pages
/// of one it has, recheck a chunk a peer found bad. (It holds no names and produces nothing.)
fn hooks(stores: &Stores) -> Hooks {
    let (held, pages, bad) = (stores.clone(), stores.clone(), stores.clone());
    Hooks {
        holdings: Box::new(move |visit| {
            // (The stores listed first: a dataset's copies are visited outside the lock.)
            let stores: Vec<_> = crate::core::sync::lock(&held)
                .iter()
                .map(|(k, s)| (k.clone(), s.clone()))
                .collect();
            let mut site_path = String::new();
            for (key, store) in stores {
                store.cache.visit_held(&mut |path, version| {
                    site_path.clear();
                    site_path.extend([key.as_str(), "/", path]);
                    visit(&site_path, version);
                });
            }
        }),
        pages_of: Box::new(move |path, version, offset| {
            let (store, path) = store_of(&pages, path)?;
            page_map(&store.cache, path, version, offset)
        }),
        on_bad_chunk: Box::new(move |path, version, offset| {
            if let Some((store, path)) = store_of(&bad, path) {
                recheck_chunk(&store.cache, path, version, offset)
            }
        }),
        ..Hooks::default()
    }
}

/// Peers read this node's datasets: `<key>/<path>` from dataset `key`'s cache, within the
/// node's serving budget.
struct SiteStore {
    stores: Stores,
    budget: Budget,
}

impl ChunkStore for SiteStore {
    fn read_at(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        room: &mut [u8],
        len: usize,
    ) -> std::io::Result<Option<u32>> {
        match store_of(&self.stores, path) {
            Some((store, path)) => {
                self.budget.take(len as u64)?;
                store.read_at(path, version, offset, room, len)
            }
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such dataset on this node",
            )),
        }
    }
}

/// The most a pull waits for the serving budget before it is refused (its puller then tries
/// another holder, or reads the shared FS).
const BUDGET_WAIT: Duration = Duration::from_secs(1);

/// Bytes per second served to the site (a token bucket holding a second's worth): past it a
/// chunk waits its turn, at most [`BUDGET_WAIT`].
struct Budget {
    rate: Option<u64>,
    /// When the bucket was last counted, and the bytes it held then (negative: owed).
    bucket: Mutex<(Instant, f64)>,
}

impl Budget {
    fn new(rate: Option<u64>) -> Budget {
        let full = rate.unwrap_or(0) as f64;
        Budget {
            rate: rate.filter(|&r| r > 0),
            bucket: Mutex::new((Instant::now(), full)),
        }
    }

    /// Takes `bytes` from the budget, waiting for them if need be.
    fn take(&self, bytes: u64) -> std::io::Result<()> {
        let Some(rate) = self.rate else {
            return Ok(());
        };
        let rate = rate as f64;
        let wait = {
            let mut bucket = crate::core::sync::lock(&self.bucket);
            let now = Instant::now();
            let held = bucket.1 + now.duration_since(bucket.0).as_secs_f64() * rate;
            let left = held.min(rate) - bytes as f64;
            let wait = Duration::from_secs_f64((-left / rate).max(0.0));
            if wait > BUDGET_WAIT {
                *bucket = (now, held.min(rate));
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "this node's serving budget is spent: try another holder",
                ));
            }
            *bucket = (now, left);
            wait
        };
        std::thread::sleep(wait);
        Ok(())
    }
}

/// The site's locator as one dataset's mount asks it: its paths prefixed with the key.
pub struct SiteLink {
    link: ServiceLink,
    prefix: String,
}

impl SiteLink {
    fn path(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }
}

impl Locate for SiteLink {
    fn me(&self) -> NodeId {
        self.link.me()
    }

    fn membership(&self) -> &Membership {
        self.link.membership()
    }

    fn timeout(&self) -> Duration {
        self.link.timeout()
    }

    fn locate(&self, path: &str, version: Version, within: Duration) -> Reply {
        self.link.locate(&self.path(path), version, within)
    }

    fn fetch_failed(&self, path: &str, version: Version) {
        self.link.fetch_failed(&self.path(path), version)
    }

    fn suspects(&self) -> Vec<NodeId> {
        self.link.suspects()
    }

    fn pull_failed(&self, path: &str, version: Version, holder: NodeId, error: &TransportError) {
        self.link
            .pull_failed(&self.path(path), version, holder, error)
    }

    fn is_down(&self, node: NodeId) -> bool {
        self.link.is_down(node)
    }

    fn pages_of(
        &self,
        holder: NodeId,
        (path, version, offset): (&str, Version, u64),
        within: Duration,
    ) -> Option<Option<PageMap>> {
        let path = self.path(path);
        self.link.pages_of(holder, (&path, version, offset), within)
    }
}

/// The node's puller as one dataset's mount uses it: its paths prefixed with the key.
pub struct SitePull {
    puller: Arc<Puller>,
    prefix: String,
}

impl SitePull {
    fn want(&self, want: &Want) -> Want {
        Want {
            path: format!("{}{}", self.prefix, want.path),
            ..want.clone()
        }
    }
}

impl Pull for SitePull {
    fn pull(
        &self,
        peer: SocketAddr,
        want: &Want,
        sink: Sink<'_>,
        within: Duration,
    ) -> Result<u64, TransportError> {
        self.puller
            .pull_within(peer, &self.want(want), sink, within)
    }

    fn pull_batch(
        &self,
        peer: SocketAddr,
        wants: &[Want],
        sink: pull::BatchSink<'_>,
        within: Duration,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let wants: Vec<Want> = wants.iter().map(|w| self.want(w)).collect();
        self.puller.pull_batch(peer, &wants, sink, within)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_lets_a_second_through_then_paces_and_refuses_past_a_second() {
        let b = Budget::new(Some(1_000_000));
        let t = Instant::now();
        b.take(1_000_000).unwrap();
        assert!(t.elapsed() < Duration::from_millis(200), "a full bucket");
        b.take(250_000).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(200), "paced");
        let e = b.take(2_000_000).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        // Refused bytes are not owed: a small chunk still goes within its wait.
        b.take(100_000).unwrap();
        Budget::new(None).take(u64::MAX).unwrap();
    }

    #[test]
    fn a_site_path_names_its_dataset() {
        let stores = Stores::default();
        assert!(store_of(&stores, "k/a/b").is_none());
        assert!(store_of(&stores, "nokey").is_none());
    }
}
