//! The filesystem core, as plain Rust calls returning plain structs; [`fuse`] is the one file
//! that speaks fuser and adapts these calls to the kernel protocol. This file holds
//! [`DyadFs`] itself and the read side (lookups, opens, reads); [`attr`] the attributes,
//! [`inodes`] the inode table, [`handles`] open handles, [`listing`] directory listings,
//! [`read`] the cache-filling read path, [`readahead`] work off the request's thread,
//! [`namespace`] the operations that change produced files, [`write`] staging them, [`close`]
//! the close that finishes one (sealed, then published), [`error`] the one errno table.
//!
//! A path resolves, in order, to a file being written on this node ([`write`]), an entry of the
//! backing tree (read-only: dyadfs never modifies it), or a produced name published by any node
//! (a [`Namespace`](crate::core::names::Namespace)). New files and directories may be created anywhere a name is free.

mod acl;
mod attr;
mod backing;
mod caller;
mod close;
mod control;
mod dir_ahead;
mod error;
pub mod fuse;
mod handles;
mod inodes;
pub mod io_modes;
pub mod listing;
mod lookup;
mod namespace;
pub mod prefetch;
pub mod quota;
pub mod read;
mod readahead;
mod remembered;
mod rename;
mod stat_ahead;
pub mod write;

#[cfg(test)]
mod ops_tests;
#[cfg(test)]
mod test_source;

pub use attr::{Attr, Changes, Kind, TimeSet};
pub use handles::Opened;
use handles::{CachedHandle, Handle};
pub use inodes::InodeShedder;
use inodes::{Inodes, Node, new_node};
pub use listing::DirEntry;
pub use lookup::Looked;
use readahead::Job;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::core::source::Source;
pub use backing::{BackingStat, BackingStore};
pub use error::Error;
use read::{Reader, WHOLE_FILE_MAX};

use crate::cache::{Cache, ReadBytes};
use crate::core::names::{self, FILE_SIZE_MAX, Name, Namespace};
use crate::core::sync::lock;
use crate::stats::{Stats, StatusReport};
use write::{Producer, Staged};

pub const ROOT_INO: u64 = 1;

/// What a path resolves to.
enum Found {
    Staged(Arc<Staged>),
    Backing(BackingStat),
    Produced(Name),
}

impl Found {
    /// Its attributes as inode `ino`.
    fn attr(&self, ino: u64) -> Result<Attr, Error> {
        match self {
            Found::Staged(s) => Attr::from_staged(ino, s),
            Found::Backing(b) => Ok(Attr::from_backing(ino, b)),
            Found::Produced(n) => Ok(Attr::from_name(ino, n)),
        }
    }

    /// When its attributes were read: what their TTL counts from (a stat of the shared file
    /// system may be a remembered one, see [`remembered`]).
    fn read_at(&self) -> Instant {
        match self {
            Found::Backing(b) => b.read,
            Found::Staged(_) | Found::Produced(_) => Instant::now(),
        }
    }
}

/// What an open found: a handle made already (a file being written), or the cache key and
/// attributes of a file to read.
enum ToOpen {
    Handle(Opened),
    Cached(String, Attr),
    /// The file being written that the path named was finished (published, or unlinked) after
    /// it was resolved: resolve again.
    Finished,
}

/// How many times an open resolves its path again when the file it found being written was
/// finished meanwhile; each time another writer opened, wrote and finished it in between.
const OPEN_RETRIES: usize = 8;

/// How long a produced name's attributes are trusted: another node may rename or replace it.
const PRODUCED_TTL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct FsConfig {
    /// How long attributes and names are trusted, by the kernel and by the daemon.
    pub metadata_ttl: Duration,
    /// Reply to opens of complete cached files with kernel passthrough when possible.
    pub passthrough: bool,
    /// `--pack-max auto`: small files are packed into segments only where the kernel offers
    /// no passthrough (decided at INIT, [`DyadFs::kernel_offers`]).
    pub pack_auto: bool,
    /// Files smaller than this are served by the daemon even when passthrough is on (their
    /// pages kept by the kernel), unless their bytes are in memory at the inode's first open:
    /// see `--passthrough-min`.
    pub passthrough_min: u64,
    /// Threads filling readahead chunks in the background.
    pub readahead_threads: usize,
    /// How long a lookup of a name nobody has published yet waits for a producer.
    pub wait: Duration,
    /// Inodes the daemon keeps for the kernel before asking it to forget the least recently
    /// used (see [`InodeShedder`]).
    pub max_inodes: usize,
    /// Bytes of shared-file-system attributes remembered past the kernel's forgetting of their
    /// inode, for the metadata TTL (see [`remembered`]); 0: none.
    pub backing_stat_cache: u64,
    /// Threads filling the files of prefetch lists, and how many files they may be ahead of
    /// the reader (and a quarter of the cache's capacity in bytes).
    pub prefetch_threads: usize,
    pub prefetch_window: usize,
    /// The kernel opens files without asking (`--no-open`, on a read-only mount): opens are
    /// answered ENOSYS, and each read is served by inode.
    pub no_open: bool,
}

/// What the kernel agreed to at INIT, as the adapter tells the core ([`DyadFs::kernel_offers`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Opens may hand the kernel a cache file to read directly (FUSE passthrough).
    pub passthrough: bool,
    /// The kernel opens files without asking (`--no-open` in effect).
    pub no_open: bool,
}

pub struct DyadFs<S: Source> {
    backing: BackingStore,
    remembered: Option<remembered::RememberedStats>,
    names: Arc<dyn Namespace>,
    producer: Arc<Producer>,
    reader: Reader<S>,
    config: FsConfig,
    inodes: Arc<RwLock<Inodes>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    dir_ahead: Arc<dir_ahead::DirAhead>,
    stat_ahead: Arc<stat_ahead::StatAhead>,
    next_fh: AtomicU64,
    readahead: crossbeam_channel::Sender<Job>,
    prefetch: Arc<prefetch::Prefetcher>,
    /// What `dyadfs status` reports of the cluster (set by a cluster's wiring).
    status: std::sync::OnceLock<StatusFn>,
    /// What the kernel agreed to (none until the session's INIT).
    kernel: std::sync::OnceLock<Capabilities>,
    /// Names processes were just told are absent (`--wait`: they are not waiting for them).
    told_absent: caller::ToldAbsent,
}

/// The cluster as this node sees it, for `dyadfs status`.
pub type StatusFn = Box<dyn Fn() -> StatusReport + Send + Sync>;

/// (directory, name) of a path; the root's entries are in directory "".
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn join(parent: &str, name: &OsStr) -> String {
    let name = name.to_string_lossy();
    if parent.is_empty() {
        name.into_owned()
    } else {
        format!("{parent}/{name}")
    }
}

/// Starts a background thread of the file system (`name`): it takes jobs from `next` (which
/// waits at most the duration it is given, so the thread notices the file system is gone) and
/// does each with `work`; it ends once the file system is dropped.
fn spawn_worker<S: Source, J>(
    fs: &Arc<DyadFs<S>>,
    name: String,
    next: impl Fn(Duration) -> Option<J> + Send + 'static,
    work: impl Fn(&DyadFs<S>, J) + Send + 'static,
) -> std::io::Result<()> {
    let weak = Arc::downgrade(fs);
    std::thread::Builder::new().name(name).spawn(move || {
        loop {
            let job = next(Duration::from_secs(1));
            let Some(fs) = weak.upgrade() else { return };
            if let Some(job) = job {
                work(&fs, job);
            }
        }
    })?;
    Ok(())
}

impl<S: Source> DyadFs<S> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backing: BackingStore,
        names: Arc<dyn Namespace>,
        producer: Arc<Producer>,
        source: Arc<S>,
        cache: Arc<Cache>,
        stats: Arc<Stats>,
        config: FsConfig,
    ) -> Result<Self, Error> {
        let root = backing.stat("").map_err(Error::Backing)?;
        if !root.is_dir() {
            return Err(Error::NotDir);
        }
        let mut inodes = Inodes {
            next: ROOT_INO + 1,
            ..Default::default()
        };
        inodes.by_path.insert(String::new(), ROOT_INO);
        inodes.nodes.insert(
            ROOT_INO,
            Arc::new(new_node(
                "",
                Attr::from_backing(ROOT_INO, &root),
                root.read,
                1,
            )),
        );
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..config.readahead_threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("readahead-{i}"))
                .spawn(move || rx.iter().for_each(|job| job()))
                .map_err(|e| Error::Cache(e.into()))?;
        }
        let window = prefetch::Window {
            files: config.prefetch_window.max(1),
            bytes: (cache.capacity() / 4).max(1),
        };
        Ok(DyadFs {
            remembered: remembered::RememberedStats::new(
                config.metadata_ttl,
                config.backing_stat_cache,
            ),
            backing,
            names,
            producer,
            reader: Reader {
                cache,
                stats,
                source,
            },
            config,
            inodes: Arc::new(RwLock::new(inodes)),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            dir_ahead: Arc::default(),
            stat_ahead: Arc::default(),
            next_fh: AtomicU64::new(1),
            readahead: tx,
            prefetch: Arc::new(prefetch::Prefetcher::new(window)),
            status: std::sync::OnceLock::new(),
            kernel: std::sync::OnceLock::new(),
            told_absent: Default::default(),
        })
    }

    /// How long the kernel may trust a node's name and attributes.
    pub fn ttl(&self, attr: &Attr) -> Duration {
        if attr.pending {
            // Asked again every time: it is a file once its name is produced.
            Duration::ZERO
        } else if attr.produced {
            self.config.metadata_ttl.min(PRODUCED_TTL)
        } else {
            self.config.metadata_ttl
        }
    }

    /// A way to take `dyadfs stats` snapshots from another thread (the metrics endpoint's).
    pub fn snapshots(&self) -> impl Fn() -> crate::stats::Snapshot + Send + Sync + 'static {
        let (cache, stats, inodes, prefetch, producer) = (
            self.reader.cache.clone(),
            self.reader.stats.clone(),
            self.inodes.clone(),
            self.prefetch.clone(),
            self.producer.clone(),
        );
        move || {
            let inodes = inodes.read().unwrap_or_else(|e| e.into_inner()).nodes.len();
            stats.snapshot(crate::stats::Gauges {
                cached_bytes: cache.used_bytes(),
                cached_files: cache.cached_files(),
                cache_segments: cache.segment_files(),
                capacity_bytes: cache.capacity(),
                inodes: inodes as u64,
                open_files: cache.open_files(),
                prefetch_pending: prefetch.pending(),
                kept_files: producer.kept_count(),
            })
        }
    }

    /// Sets what `dyadfs status` reports (a cluster's members); once.
    pub fn set_status(&self, f: StatusFn) {
        let _ = self.status.set(f);
    }

    pub fn passthrough_enabled(&self) -> bool {
        self.config.passthrough
    }

    /// What the kernel agreed to at INIT, told once by the adapter; the stats report it.
    pub fn kernel_offers(&self, caps: Capabilities) {
        if self.kernel.set(caps).is_err() {
            tracing::warn!("a second FUSE INIT: keeping what the first agreed to");
            return;
        }
        let stats = self.stats();
        stats.passthrough.store(caps.passthrough, Ordering::Relaxed);
        stats.no_open.store(caps.no_open, Ordering::Relaxed);
        let Capabilities {
            passthrough,
            no_open,
        } = caps;
        tracing::info!(passthrough, no_open, "FUSE session initialised");
        if self.config.pack_auto && self.config.passthrough && passthrough {
            // Cached files can be handed to the kernel: a file of its own each, passed through
            // (a cold read of it costs the daemon no READ request and no copy of its bytes).
            self.reader.cache.set_pack_max(0);
            tracing::info!("small files get cache files of their own (--pack-max auto)");
        }
    }

    /// What the kernel agreed to (nothing before INIT).
    fn kernel(&self) -> Capabilities {
        self.kernel.get().copied().unwrap_or_default()
    }

    /// The counters, shared (for threads outside the file system).
    pub fn stats_handle(&self) -> Arc<Stats> {
        self.reader.stats.clone()
    }

    pub fn stats(&self) -> &Stats {
        &self.reader.stats
    }

    /// What `path` is now: being written here, in the backing tree, or a published name
    /// (waited for up to `wait`).
    fn resolve(&self, path: &str, wait: Duration) -> Result<Found, Error> {
        if let Some(s) = self.producer.staged(path) {
            return Ok(Found::Staged(s));
        }
        match self.backing_stat(path) {
            Ok(meta) => return Ok(Found::Backing(meta)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {}
            Err(e) => return Err(Error::Backing(e)),
        }
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        let (dir, name) = split(path);
        if !wait.is_zero() {
            self.stats().name_waits.fetch_add(1, Ordering::Relaxed);
        }
        match self.names.get(dir, name, wait) {
            // A hard link: the record holds what the file's names share.
            Ok(Some(n)) if n.is_pointer() => match self.record(&n.meta.inode) {
                Ok(Some(r)) => Ok(Found::Produced(r)),
                Ok(None) => Err(Error::NotFound),
                Err(e) => {
                    tracing::warn!(%path, error = %e, "link record lookup failed");
                    Err(Error::NotFound)
                }
            },
            Ok(Some(n)) => Ok(Found::Produced(n)),
            Ok(None) => Err(Error::NotFound),
            Err(e) => {
                tracing::warn!(%path, error = %e, "name lookup failed");
                Err(Error::NotFound)
            }
        }
    }

    /// The shared file system's attributes of `path`: remembered ones while their TTL lasts,
    /// else read (and remembered).
    fn backing_stat(&self, path: &str) -> std::io::Result<BackingStat> {
        let stats = self.stats();
        if let Some(stat) = self.remembered.as_ref().and_then(|r| r.get(path)) {
            stats
                .backing_stats_remembered
                .fetch_add(1, Ordering::Relaxed);
            return Ok(stat);
        }
        let stat = self.backing.stat(path)?;
        stats.backing_stats.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = &self.remembered {
            r.keep(path, &stat);
        }
        Ok(stat)
    }

    /// A node's attributes, refreshed once their TTL has passed (at once while being written).
    fn fresh_attr(&self, node: &Node) -> Result<Attr, Error> {
        self.refreshed(node, false)
    }

    /// As [`Self::fresh_attr`]; `exact`: through the node's own path only (a lookup of that
    /// name), never through another name of a hard-linked file.
    fn refreshed(&self, node: &Node, exact: bool) -> Result<Attr, Error> {
        let (attr, at) = *lock(&node.attr);
        let path = Self::path_of(node);
        match self.producer.staged(&path) {
            None if at.elapsed() < self.ttl(&attr) => return Ok(attr),
            // Closed by its writer, finished by the release on its way: attributes of the
            // file as published, not of its staging copy a moment before.
            Some(s) => {
                s.await_release(write::RELEASE_WAIT);
            }
            None => {}
        }
        let (path, found) = if exact {
            let found = self.resolve(&path, Duration::ZERO)?;
            (path, found)
        } else {
            self.resolve_node(node)?
        };
        self.upsert(path, &found, 0)
    }

    /// Another name of a hard-linked file that still resolves, which becomes the node's path.
    fn another_name(&self, node: &Node, gone: &str) -> Result<(String, Found), Error> {
        let others: Vec<String> = lock(&node.aliases)
            .iter()
            .filter(|a| !a.starts_with(names::LINKS_DIR) && *a != gone)
            .cloned()
            .collect();
        for other in others {
            if let Ok(found) = self.resolve(&other, Duration::ZERO) {
                *node.path.write().unwrap_or_else(|e| e.into_inner()) = other.clone();
                return Ok((other, found));
            }
        }
        Err(Error::NotFound)
    }

    /// What an inode's path is now (through another name of a hard-linked file whose name
    /// went away), and that path.
    fn resolve_node(&self, node: &Node) -> Result<(String, Found), Error> {
        let path = Self::path_of(node);
        match self.resolve(&path, Duration::ZERO) {
            Err(Error::NotFound) if !lock(&node.aliases).is_empty() => {
                self.another_name(node, &path)
            }
            r => Ok((path, r?)),
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr, Error> {
        let node = self.node(ino)?;
        // A pending name (`--wait`) is what it was until its open finds it produced (which
        // gives the node the file's attributes): the kernel asks for them before letting that
        // open through, and asking its home each time would cost a round trip per wait.
        let cached = lock(&node.attr).0;
        if cached.pending {
            return Ok(cached);
        }
        match self.fresh_attr(&node) {
            Err(Error::NotFound) => self.unlinked_attr(ino, &node),
            r => r,
        }
    }

    /// `fstat` of a file being written that was unlinked while open: it has attributes still,
    /// and no link.
    fn unlinked_attr(&self, ino: u64, node: &Node) -> Result<Attr, Error> {
        let path = Self::path_of(node);
        let staged = lock(&self.handles).values().find_map(|h| match &**h {
            Handle::Staged { staged, .. }
                if staged.unlinked.load(Ordering::Relaxed) && *lock(&staged.path) == path =>
            {
                Some(staged.clone())
            }
            _ => None,
        });
        let staged = staged.ok_or(Error::NotFound)?;
        let mut a = Attr::from_staged(ino, &staged)?;
        a.nlink = 0;
        Ok(a)
    }

    pub fn readlink(&self, ino: u64) -> Result<PathBuf, Error> {
        let path = Self::path_of(&*self.node(ino)?);
        match self.backing.read_link(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.produced_target(&path),
            r => r.map_err(Error::Backing),
        }
    }

    /// Opens a file. `write`: open for writing (a produced file gets a new version, started
    /// from the current bytes unless `truncate`); backing files are read-only.
    pub fn open(&self, ino: u64, write: bool, truncate: bool) -> Result<Opened, Error> {
        let node = self.node(ino)?;
        let fresh = if write {
            None
        } else {
            self.fresh_backing_file(&node)
        };
        let (key, attr) = match fresh {
            Some((path, attr)) => {
                self.prefetch.opened(&path);
                (path, attr)
            }
            None => {
                let mut tries = 0;
                loop {
                    let (path, found) = self.resolve_node(&node)?;
                    if !write {
                        self.prefetch.opened(&path);
                    }
                    match self.open_found(path, found, write, truncate)? {
                        ToOpen::Handle(opened) => return Ok(opened),
                        ToOpen::Cached(key, attr) => break (key, attr),
                        ToOpen::Finished if tries < OPEN_RETRIES => tries += 1,
                        ToOpen::Finished => return Err(Error::Contended),
                    }
                }
            }
        };
        match attr.kind {
            Kind::Dir => return Err(Error::IsDir),
            Kind::File => {}
            _ => {
                return Err(Error::Backing(std::io::Error::from_raw_os_error(
                    libc::EINVAL,
                )));
            }
        }
        let cache = &self.reader.cache;
        // An entry outside the cache if the cache's file system cannot take the file: its
        // reads are served uncached.
        let entry = cache.entry_or_uncached(&key, attr.version);
        entry.pin(cache);
        // How this inode's earlier opens of the same version went (nothing for a new version).
        let before = lock(&node.kernel_version)
            .filter(|(v, _)| *v == attr.version)
            .map(|(_, keep_pages)| keep_pages);
        let keep_cache = before.is_some();
        let may_pass = self.config.passthrough && self.kernel().passthrough;
        let mut complete = entry.is_complete();
        let was_complete = complete;
        if complete {
            self.stats().local_hits.fetch_add(1, Ordering::Relaxed);
        } else if entry.version.size <= WHOLE_FILE_MAX
            && if entry.packed() {
                keep_cache
            } else {
                may_pass && !names::is_object(&key)
            }
        {
            // The first read fetches a small file whole anyway. Fetching it now lets this very
            // open be a passthrough open, so the reader's many small reads (np.load parses a
            // zip directory, then headers) never come to the daemon. A failed fetch is left to
            // the first read, which retries it and reports the error. Not for produced files:
            // the kernel binds one passthrough file per inode, so a reader holding one version
            // open in passthrough would keep the next version from being opened (EBUSY).
            // A packed file is never passed through: its first read fetches it and is served
            // from the fetch's own bytes, unless the kernel keeps its pages from an earlier open
            // (no read may come then, and the region its entry took in a segment would stay
            // unwritten and uncounted by the capacity): then it is fetched now.
            if let Err(e) = self.reader.fill(&entry, 0..entry.chunk_count()) {
                tracing::debug!(path = %entry.path, error = %e, "fetch at open failed");
            }
            complete = entry.is_complete();
        }
        // Below --passthrough-min the daemon serves the file with its pages kept by the kernel,
        // so that an open of it while the kernel still holds them reads nothing (a passthrough
        // open reads the cache file again and, on a writable mount, makes the next stat a
        // GETATTR) -- unless its bytes are in memory when the inode's first open of this version
        // comes: fetched or pulled by that open, or filled just before (prefetch), a
        // daemon-served read would copy them once more, so it passes through. The first open
        // decides for the inode's later ones: after a passthrough open the kernel holds no
        // pages, and the next daemon-served open would read every byte again. (Asked before the
        // verification below, which reads the file.)
        // A packed file (in a segment of the cache, see `cache::segments`) cannot be handed
        // to the kernel: the daemon serves it, the kernel keeping its pages.
        let packed = entry.packed();
        let keep_pages = before.unwrap_or_else(|| {
            packed
                || may_pass
                    && entry.version.size < self.config.passthrough_min
                    && was_complete
                    && entry.pages_cached() == Some(false)
        });
        *lock(&node.kernel_version) = Some((attr.version, keep_pages));
        // The kernel reads a passthrough file without us, so it must be verified first. A
        // small file is verified now (unless the daemon serves it anyway, `keep_pages`); a large
        // one (after a restart) is served by the daemon, which verifies each chunk it serves,
        // while the rest is verified in the background for later opens.
        // (A file that cannot be read back now is served by the daemon, whose reads fall back to
        // the source.) Every open of a complete file asks, whoever serves it: one whose data
        // file changed behind the daemon since it was verified (its ctime moved) has its chunks
        // checked again before they are served, by the daemon as by the kernel.
        let unchanged = complete && !entry.is_evicted() && entry.is_verified();
        let verified = may_pass
            && !packed
            && complete
            && !entry.is_evicted()
            && (unchanged
                || if keep_pages {
                    false
                } else if entry.version.size <= WHOLE_FILE_MAX {
                    entry.verify(cache, 0..entry.chunk_count()).unwrap_or(false)
                } else {
                    self.verify_in_background(entry.clone());
                    false
                });
        // A packed file the kernel holds no pages of is handed to its page cache whole with
        // this open (fetched now if it is not cached): the reads of a program that seeks
        // about in it (np.load: six READs for a 256 KiB .npz) then never reach the daemon.
        // Not when the kernel may hold pages of this version already (an earlier open of the
        // inode): they would be copied again; its reads the page cache misses still come.
        let store =
            if packed && before.is_none() && (1..=WHOLE_FILE_MAX).contains(&attr.version.size) {
                match self.reader.read(&entry, 0, attr.version.size as u32) {
                    Ok(bytes) if bytes.len() as u64 == attr.version.size => Some(bytes),
                    Ok(_) => None,
                    Err(e) => {
                        tracing::debug!(path = %entry.path, error = %e, "fetch at open failed");
                        None
                    }
                }
            } else {
                None
            };
        let fh = self.add_handle(Handle::Cached(CachedHandle {
            entry: entry.clone(),
            next_offset: AtomicU64::new(0),
            window: AtomicU64::new(0),
            map: Default::default(),
        }));
        Ok(Opened {
            fh,
            passthrough: verified.then_some(entry),
            keep_cache: keep_cache || store.is_some(),
            keep_pages,
            finishes: false,
            store,
        })
    }

    /// A backing file's path and attributes while they are fresh (the kernel trusts them as
    /// long): an open then costs no stat of the shared file system, which on Lustre or GPFS is
    /// a metadata server round trip per open of a cached file. A changed file is noticed once
    /// the TTL has passed, as its attributes are.
    fn fresh_backing_file(&self, node: &Node) -> Option<(String, Attr)> {
        let (attr, at) = *lock(&node.attr);
        (attr.kind == Kind::File && !attr.produced && at.elapsed() < self.ttl(&attr))
            .then(|| (Self::path_of(node), attr))
    }

    /// What an open does with what its path resolved to: a file being written (or a new
    /// version of a produced one) gets its handle at once; a file to read gives its cache key
    /// and attributes.
    fn open_found(
        &self,
        path: String,
        found: Found,
        write: bool,
        truncate: bool,
    ) -> Result<ToOpen, Error> {
        let (key, attr) = match found {
            Found::Staged(s) if !write => return Ok(ToOpen::Handle(self.staged_handle(s, false))),
            Found::Staged(s) => {
                // Under the finishing lock, which the close that finishes a file holds
                // throughout: either that close has not begun (this handle is one writer more,
                // and the last release finishes the file), or it is over and the file was
                // unstaged, its bytes sealed; a handle on it would write into the sealed
                // object and finish it again.
                let held = s.clone();
                let _finishing = lock(&held.finishing);
                if *lock(&s.ended) {
                    return Ok(ToOpen::Finished);
                }
                if truncate {
                    s.set_len(0)?;
                    s.dirty.store(true, Ordering::Relaxed);
                }
                return Ok(ToOpen::Handle(self.staged_handle(s, true)));
            }
            Found::Backing(meta) => {
                if write {
                    return Err(Error::ReadOnly);
                }
                let attr = self.upsert(path.clone(), &Found::Backing(meta), 0)?;
                (path, attr)
            }
            Found::Produced(n) => {
                if n.dir {
                    return Err(Error::IsDir);
                }
                if !n.is_file() {
                    return Err(Error::Invalid);
                }
                if n.size > FILE_SIZE_MAX {
                    // A forged name (none is produced so large): refused before its chunk
                    // table is allocated.
                    return Err(Error::TooLarge {
                        size: n.size,
                        max: FILE_SIZE_MAX,
                    });
                }
                if write {
                    let staged = self.new_version(&path, &n, !truncate)?;
                    self.upsert(path, &Found::Staged(staged.clone()), 0)?;
                    return Ok(ToOpen::Handle(self.staged_handle(staged, true)));
                }
                let attr = self.upsert(path, &Found::Produced(n.clone()), 0)?;
                (n.object, attr)
            }
        };
        Ok(ToOpen::Cached(key, attr))
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<ReadBytes, Error> {
        let handle = self.handle(fh)?;
        let handle = match &*handle {
            Handle::Cached(h) => h,
            Handle::Staged { staged, .. } => {
                let len = staged.file.metadata().map_err(Error::Write)?.len();
                let n = (u64::from(size)).min(len.saturating_sub(offset)) as usize;
                let mut buf = vec![0; n];
                staged
                    .file
                    .read_exact_at(&mut buf, offset)
                    .map_err(Error::Write)?;
                return Ok(ReadBytes::Owned(buf));
            }
        };
        let entry = &handle.entry;
        let large = entry.version.size > WHOLE_FILE_MAX;
        let map = large
            .then(|| handle.map.get_or_init(|| entry.map()).as_ref())
            .flatten();
        let data = self.reader.read_mapped(entry, offset, size, map)?;
        if large {
            self.read_ahead(handle, offset, data.len() as u64);
        }
        Ok(data)
    }

    /// A read of a file the kernel opened without asking (`--no-open`): opened for this read
    /// alone. Its cache entry is held for the read, not between reads, so eviction is free to
    /// take files the kernel has not closed.
    pub fn read_unopened(&self, ino: u64, offset: u64, size: u32) -> Result<ReadBytes, Error> {
        let opened = self.open(ino, false, false)?;
        let data = self.read(opened.fh, offset, size);
        self.release(opened.fh)?;
        data
    }

    /// Whether the kernel opens files without asking (`--no-open`).
    pub fn opens_unasked(&self) -> bool {
        self.config.no_open
    }

    /// The last close of an open file (the kernel sends it once every descriptor of the open
    /// is closed, including dups and forked copies, shortly after the last close returns). The
    /// last writable handle of a file being written finishes it, unless a close (`flush`) did.
    pub fn release(&self, fh: u64) -> Result<(), Error> {
        let handle = lock(&self.handles).remove(&fh);
        match handle.as_deref() {
            Some(Handle::Cached(h)) => h.entry.unpin(),
            Some(Handle::Staged {
                staged,
                writable: true,
            }) => return self.writer_closed(staged, close::Close::Release),
            _ => {}
        }
        Ok(())
    }

    /// (blocks, free blocks, available blocks, files, free files, block size, name length)
    /// of the backing file system: the space the dataset lives in.
    pub fn statfs(&self) -> Result<libc::statvfs, Error> {
        crate::sys::statvfs(&self.backing.path("")).map_err(Error::Backing)
    }
}
