//! The filesystem core, as plain Rust calls returning plain structs; the kernel adapter
//! (`src/fuse/`, a room of its own) speaks the kernel's protocol and adapts these calls to it;
//! nothing here knows the kernel. [`DyadFs`] is a facade over four components, each with its
//! own fields and its own folder: the namespace tree ([`tree`]: what a path resolves to, inodes,
//! handles, listings), open files ([`files`]: opens to read, reads, readahead), the producer side
//! ([`produce`]: opens to write, creation, writes, the close that publishes, rename, remove)
//! and prefetching ([`prefetch`]). This file holds the facade and its making; its operations
//! are in [`ops`] (one call each to a component) and [`lookup`] (lookups and the waits for
//! produced names). Beside them, parts that know nothing of `DyadFs`: [`attr`] attributes,
//! [`found`] what a path resolves to, [`paths`] a path's parts, [`inodes`] the inode table,
//! [`handles`] open handles, [`listing`] a listing's entries, [`write`] staging produced files,
//! [`waits`] waiting opens, [`dir_ahead`] and [`stat_ahead`] work ahead of walks and scans,
//! [`quota`], [`caller`], [`rights`] (a caller's rights asked of the shared file system),
//! [`remembered`], [`error`] the one errno table. The cache-filling read
//! path is [`crate::fill`], the shared file system [`crate::backing`].
//!
//! A path resolves, in order, to a file being written on this node ([`write`]), an entry of the
//! backing tree (read-only: dyadfs never modifies it), or a produced name published by any node
//! (a [`Namespace`](crate::core::names::Namespace)). New files and directories may be created
//! anywhere a name is free.

mod attr;
pub mod caller;
mod config;
mod dir_ahead;
mod error;
mod files;
mod found;
mod handles;
mod inodes;
pub mod listing;
mod lookup;
mod ops;
mod paths;
pub mod prefetch;
mod produce;
pub mod quota;
mod remembered;
pub mod rights;
mod stat_ahead;
mod tree;
mod waits;
mod workers;
pub mod write;

#[cfg(test)]
pub(crate) mod ops_tests;
#[cfg(test)]
mod shared_fs_tests;

pub use attr::{Attr, Changes, TimeSet};
pub use config::{Capabilities, FsConfig};
pub use handles::Opened;
pub use inodes::{InodeShedder, ROOT_INO};
pub use listing::DirEntry;

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use crate::backing::SharedFs;
use crate::cache::Cache;
use crate::core::names::Namespace;
use crate::core::source::Source;
use crate::fill::Reader;
use crate::stats::{Stats, StatusReport};
pub use error::Error;
use files::Files;
use produce::Produce;
use tree::Tree;
use write::Producer;

pub struct DyadFs<S: Source> {
    tree: Arc<Tree>,
    files: Files<S>,
    produce: Produce<S>,
    prefetch: Arc<prefetch::Filler<S>>,
    config: FsConfig,
    /// What `dyadfs status` reports of the cluster (set by a cluster's wiring).
    status: OnceLock<StatusFn>,
    /// Names processes were just told are absent (`--wait`: they are not waiting for them).
    told_absent: caller::ToldAbsent,
    /// Where set (the node service), every open and lookup asks it (see [`rights`]).
    rights: OnceLock<rights::Judge>,
    /// Opens waiting for names (`--wait`), and the few threads that finish them.
    waits: waits::Waits,
}

/// The cluster as this node sees it, for `dyadfs status`.
pub type StatusFn = Box<dyn Fn() -> StatusReport + Send + Sync>;

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
        let parts = tree::Parts {
            backing,
            names,
            producer,
            stats: stats.clone(),
        };
        let tree = Arc::new(Tree::new(parts, &config)?);
        let window = prefetch::Window {
            files: config.prefetch_window.max(1),
            bytes: (cache.capacity() / 4).max(1),
        };
        let prefetcher = Arc::new(prefetch::Prefetcher::new(window));
        let reader = Reader {
            cache,
            stats,
            source,
        };
        Ok(DyadFs {
            files: Files::new(tree.clone(), reader.clone(), prefetcher.clone(), &config)?,
            produce: Produce::new(tree.clone(), reader.clone()),
            prefetch: Arc::new(prefetch::Filler::new(
                tree.clone(),
                reader,
                prefetcher,
                config.prefetch_threads,
            )),
            tree,
            config,
            status: OnceLock::new(),
            told_absent: Default::default(),
            rights: OnceLock::new(),
            waits: Default::default(),
        })
    }

    /// Starts the file system's background threads (prefetch lists, directories read ahead of
    /// a walk, stats ahead of a scan); they end with it.
    pub fn start_prefetch(fs: &Arc<DyadFs<S>>) -> std::io::Result<()> {
        prefetch::Filler::start(&fs.prefetch)
    }

    pub fn start_dir_ahead(fs: &Arc<DyadFs<S>>) -> std::io::Result<()> {
        Tree::start_dir_ahead(&fs.tree)
    }

    pub fn start_stat_ahead(fs: &Arc<DyadFs<S>>) -> std::io::Result<()> {
        Tree::start_stat_ahead(&fs.tree)
    }

    /// A way to take `dyadfs stats` snapshots from another thread (the metrics endpoint's).
    pub fn snapshots(&self) -> impl Fn() -> crate::stats::Snapshot + Send + Sync + 'static {
        let cache = self.files.reader.cache.clone();
        let stats = self.tree.stats.clone();
        let (tree, prefetch, producer) = (
            self.tree.clone(),
            self.prefetch.clone(),
            self.produce.producer.clone(),
        );
        move || {
            stats.snapshot(crate::stats::Gauges {
                cached_bytes: cache.used_bytes(),
                cached_files: cache.cached_files(),
                cache_segments: cache.segment_files(),
                capacity_bytes: cache.capacity(),
                inodes: tree.inode_count() as u64,
                open_files: cache.open_files(),
                prefetch_pending: prefetch.pending(),
                kept_files: producer.kept_count(),
                partial_chunks: cache.partial_chunks(),
            })
        }
    }

    /// Has every open and lookup judged by `rights` as the caller (the node service); once.
    pub fn set_rights(&self, rights: Arc<dyn rights::Rights>) {
        let _ = self.rights.set(rights::Judge::new(rights));
    }

    /// Sets what `dyadfs status` reports (a cluster's members); once.
    pub fn set_status(&self, f: StatusFn) {
        let _ = self.status.set(f);
    }

    /// What the kernel agreed to at INIT, told once by the adapter; the stats report it.
    pub fn kernel_offers(&self, caps: Capabilities) {
        if !self.files.set_kernel(caps) {
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
            self.files.reader.cache.set_pack_max(0);
            tracing::info!("small files get cache files of their own (--pack-max auto)");
        }
    }

    /// Whether large files not cached whole are opened for direct I/O while complete files
    /// pass through: then the kernel's readahead serves little but the faults of mapped large
    /// files (known once INIT is done).
    pub fn reads_large_files_directly(&self) -> bool {
        self.files.reads_large_files_directly()
    }

    pub fn passthrough_enabled(&self) -> bool {
        self.files.passthrough_enabled()
    }

    /// Opens one user may keep waiting for names at once (`--max-waits-per-user`).
    pub fn max_waits_per_user(&self) -> usize {
        self.config.max_waits_per_user
    }

    /// Whether the kernel's INIT came (and [`Self::kernel`] says what it agreed to).
    pub fn initialised(&self) -> bool {
        self.files.initialised()
    }

    /// What the kernel agreed to (nothing before INIT).
    pub fn kernel(&self) -> Capabilities {
        self.files.kernel()
    }

    /// The counters, shared (for threads outside the file system).
    pub fn stats_handle(&self) -> Arc<Stats> {
        self.tree.stats.clone()
    }

    pub fn stats(&self) -> &Stats {
        &self.tree.stats
    }

    /// The cache this file system fills and reads (for tests of the core).
    #[cfg(test)]
    pub(crate) fn cache(&self) -> &Arc<Cache> {
        &self.files.reader.cache
    }
}
