//! The filesystem core, as plain Rust calls returning plain structs; the kernel adapter
//! (`src/fuse/`, a room of its own) speaks the kernel's protocol and adapts these calls to it;
//! nothing here knows the kernel. This file holds [`DyadFs`] itself, path resolution and
//! attributes. Beside it, its parts, which know nothing of `DyadFs`: [`attr`] attributes,
//! [`found`] what a path resolves to, [`paths`] a path's parts, [`inodes`] the inode table,
//! [`handles`] open handles, [`listing`] a listing's entries, [`write`] staging produced files,
//! [`quota`], [`caller`], [`remembered`], [`error`] the one errno table. And groups of its
//! operations, which this file does not use: [`lookup`] lookups and waits for produced names,
//! [`nodes`] the inodes', [`open`] opens, reads and the last close, [`dirs`] open directories,
//! [`readahead`] work off the request's thread, [`namespace`] the operations that change
//! produced files, [`close`] the close that finishes one (sealed, then published), [`rename`].
//! The cache-filling read path is [`crate::fill`], the shared file system [`crate::backing`].
//!
//! A path resolves, in order, to a file being written on this node ([`write`]), an entry of the
//! backing tree (read-only: dyadfs never modifies it), or a produced name published by any node
//! (a [`Namespace`](crate::core::names::Namespace)). New files and directories may be created
//! anywhere a name is free.

mod attr;
pub mod caller;
mod close;
mod control;
mod dir_ahead;
mod dirs;
mod error;
mod found;
mod handles;
mod inodes;
pub mod listing;
mod lookup;
mod namespace;
mod nodes;
mod open;
mod paths;
pub mod prefetch;
pub mod quota;
mod readahead;
mod remembered;
mod rename;
mod stat_ahead;
mod waits;
pub mod write;

#[cfg(test)]
pub(crate) mod ops_tests;
#[cfg(test)]
mod shared_fs_tests;

pub use attr::{Attr, Changes, TimeSet};
use found::Found;
pub use handles::Opened;
use handles::{Handle, Handles};
pub use inodes::{InodeShedder, ROOT_INO};
use inodes::{Inodes, Node, new_node};
pub use listing::DirEntry;
use paths::split;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::backing::{BackingStat, SharedFs};
use crate::core::Kind;
use crate::core::source::Source;
use crate::fill::Reader;
pub use error::Error;

use crate::cache::Cache;
use crate::core::names::{self, Name, Namespace};
use crate::core::sync::lock;
use crate::stats::{Stats, StatusReport};
use write::Producer;

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
    /// Large files not cached whole are opened for direct I/O (`Opened::direct`), unless
    /// `--page-cache-large-files`.
    pub direct_large: bool,
    /// Threads filling readahead chunks in the background.
    pub readahead_threads: usize,
    /// How long a lookup of a name nobody has published yet waits for a producer.
    pub wait: Duration,
    /// Opens one user may keep waiting for names at once (`--max-waits-per-user`).
    pub max_waits_per_user: usize,
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
    /// Files opened for direct I/O may still be mapped shared (FUSE_DIRECT_IO_ALLOW_MMAP,
    /// Linux 6.6): large files being filled by pages are opened so (see [`Opened::direct`]).
    pub direct_io_mmap: bool,
}

pub struct DyadFs<S: Source> {
    backing: Arc<dyn SharedFs>,
    remembered: Option<remembered::RememberedStats>,
    names: Arc<dyn Namespace>,
    producer: Arc<Producer>,
    reader: Reader<S>,
    config: FsConfig,
    inodes: Arc<RwLock<Inodes>>,
    handles: Handles,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    dir_ahead: Arc<dir_ahead::DirAhead>,
    stat_ahead: Arc<stat_ahead::StatAhead>,
    readahead: crossbeam_channel::Sender<Job>,
    prefetch: Arc<prefetch::Prefetcher>,
    /// What `dyadfs status` reports of the cluster (set by a cluster's wiring).
    status: std::sync::OnceLock<StatusFn>,
    /// What the kernel agreed to (none until the session's INIT).
    kernel: std::sync::OnceLock<Capabilities>,
    /// Names processes were just told are absent (`--wait`: they are not waiting for them).
    told_absent: caller::ToldAbsent,
    /// Opens waiting for names (`--wait`), and the few threads that finish them.
    waits: waits::Waits,
}

/// Work for the background threads (readahead, verification).
type Job = Box<dyn FnOnce() + Send>;

/// The cluster as this node sees it, for `dyadfs status`.
pub type StatusFn = Box<dyn Fn() -> StatusReport + Send + Sync>;

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
        backing: Arc<dyn SharedFs>,
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
            handles: Handles::new(),
            dirs: Mutex::new(HashMap::new()),
            dir_ahead: Arc::default(),
            stat_ahead: Arc::default(),
            readahead: tx,
            prefetch: Arc::new(prefetch::Prefetcher::new(window)),
            status: std::sync::OnceLock::new(),
            kernel: std::sync::OnceLock::new(),
            told_absent: Default::default(),
            waits: Default::default(),
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
                partial_chunks: cache.partial_chunks(),
            })
        }
    }

    /// Sets what `dyadfs status` reports (a cluster's members); once.
    pub fn set_status(&self, f: StatusFn) {
        let _ = self.status.set(f);
    }

    /// Whether a large file not cached whole is opened for direct I/O ([`Opened::direct`]):
    /// unless `--page-cache-large-files`, where the kernel lets such files be mapped (known once
    /// INIT is done).
    pub(super) fn opens_large_files_directly(&self) -> bool {
        self.config.direct_large && self.kernel().direct_io_mmap
    }

    /// Whether large files not cached whole are opened for direct I/O while complete files
    /// pass through: then the kernel's readahead serves little but the faults of mapped large
    /// files (known once INIT is done).
    pub fn reads_large_files_directly(&self) -> bool {
        let k = self.kernel();
        self.opens_large_files_directly() && self.config.passthrough && k.passthrough && !k.no_open
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
            direct_io_mmap,
        } = caps;
        tracing::info!(
            passthrough,
            no_open,
            direct_io_mmap,
            "FUSE session initialised"
        );
        if self.config.pack_auto && self.config.passthrough && passthrough {
            // Cached files can be handed to the kernel: a file of its own each, passed through
            // (a cold read of it costs the daemon no READ request and no copy of its bytes).
            self.reader.cache.set_pack_max(0);
            tracing::info!("small files get cache files of their own (--pack-max auto)");
        }
    }

    /// Opens one user may keep waiting for names at once (`--max-waits-per-user`).
    pub fn max_waits_per_user(&self) -> usize {
        self.config.max_waits_per_user
    }

    /// Whether the kernel's INIT came (and [`Self::kernel`] says what it agreed to).
    pub fn initialised(&self) -> bool {
        self.kernel.get().is_some()
    }

    /// What the kernel agreed to (nothing before INIT).
    pub fn kernel(&self) -> Capabilities {
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
        if let Some(found) = self.resolve_here(path)? {
            return Ok(found);
        }
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        let (dir, name) = split(path);
        if !wait.is_zero() {
            self.stats().name_waits.fetch_add(1, Ordering::Relaxed);
        }
        self.found_name(path, self.names.get(dir, name, wait))
    }

    /// What `path` is on this node: being written here, or in the backing tree (`None`: it is
    /// neither, so a published name if anything).
    fn resolve_here(&self, path: &str) -> Result<Option<Found>, Error> {
        if let Some(s) = tracing::debug_span!("staged").in_scope(|| self.producer.staged(path)) {
            return Ok(Some(Found::Staged(s)));
        }
        match tracing::debug_span!("backing_stat").in_scope(|| self.backing_stat(path)) {
            Ok(meta) => Ok(Some(Found::Backing(meta))),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => Ok(None),
            Err(e) => Err(Error::Backing(e)),
        }
    }

    /// What the namespace said of `path` (`got`), as what it resolves to.
    fn found_name(&self, path: &str, got: std::io::Result<Option<Name>>) -> Result<Found, Error> {
        match got {
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
        if self.backing.surely_absent(path) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        }
        let stats = self.stats();
        let remembered = tracing::debug_span!("remembered")
            .in_scope(|| self.remembered.as_ref().and_then(|r| r.get(path)));
        if let Some(stat) = remembered {
            stats
                .backing_stats_remembered
                .fetch_add(1, Ordering::Relaxed);
            return Ok(stat);
        }
        // Counted whatever it answers: a name's absence costs the shared FS a stat too.
        stats.backing_stats.fetch_add(1, Ordering::Relaxed);
        let stat = tracing::debug_span!("shared_stat").in_scope(|| self.backing.stat(path))?;
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
        let staged = self.handles.find_map(|h| match &**h {
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

    /// (blocks, free blocks, available blocks, files, free files, block size, name length)
    /// of the backing file system: the space the dataset lives in.
    pub fn statfs(&self) -> Result<libc::statvfs, Error> {
        self.backing.statvfs().map_err(Error::Backing)
    }
}
