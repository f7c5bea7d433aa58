//! What the file system is told at its making ([`FsConfig`], from the mount's options) and
//! what the kernel agreed to at INIT ([`Capabilities`]).

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct FsConfig {
    /// How long attributes and names are trusted, by the kernel and by the daemon.
    pub metadata_ttl: Duration,
    /// Reply to opens of complete cached files with kernel passthrough when possible.
    pub passthrough: bool,
    /// `--pack-max auto`: small files are packed into segments only where the kernel offers
    /// no passthrough (decided at INIT, [`DyadFs::kernel_offers`](super::DyadFs::kernel_offers)).
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
    /// used (see [`InodeShedder`](super::InodeShedder)).
    pub max_inodes: usize,
    /// Bytes of shared-file-system attributes remembered past the kernel's forgetting of their
    /// inode, for the metadata TTL (see [`remembered`](super::remembered)); 0: none.
    pub backing_stat_cache: u64,
    /// Threads filling the files of prefetch lists, and how many files they may be ahead of
    /// the reader (and a quarter of the cache's capacity in bytes).
    pub prefetch_threads: usize,
    pub prefetch_window: usize,
    /// The kernel opens files without asking (`--no-open`, on a read-only mount): opens are
    /// answered ENOSYS, and each read is served by inode.
    pub no_open: bool,
}

/// What the kernel agreed to at INIT, as the adapter tells the core ([`DyadFs::kernel_offers`](super::DyadFs::kernel_offers)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Opens may hand the kernel a cache file to read directly (FUSE passthrough).
    pub passthrough: bool,
    /// The kernel opens files without asking (`--no-open` in effect).
    pub no_open: bool,
    /// Files opened for direct I/O may still be mapped shared (FUSE_DIRECT_IO_ALLOW_MMAP,
    /// Linux 6.6): large files being filled by pages are opened so (see [`Opened::direct`](super::Opened::direct)).
    pub direct_io_mmap: bool,
}
