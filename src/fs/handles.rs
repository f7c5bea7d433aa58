//! Open handles: a file read through the cache, or a file being written on this node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::write::Staged;
use super::{DyadFs, Error};
use crate::cache::Entry;
use crate::core::source::Source;
use crate::core::sync::lock;

pub(super) struct CachedHandle {
    pub(super) entry: Arc<Entry>,
    /// Where the next sequential read would start, where the current run of sequential reads
    /// started, and the current readahead window.
    pub(super) next_offset: AtomicU64,
    pub(super) run_start: AtomicU64,
    pub(super) window: AtomicU64,
    /// The entry's data file mapped for this handle's reads (large files read through the
    /// daemon): made on the first read, unmapped on release, so mappings never outnumber open
    /// handles.
    pub(super) map: std::sync::OnceLock<Option<Arc<crate::cache::Mapping>>>,
}

pub(super) enum Handle {
    /// A backing file or a sealed produced file: read through the cache.
    Cached(CachedHandle),
    /// A file being written on this node. A writable handle's last close finishes it.
    Staged { staged: Arc<Staged>, writable: bool },
}

/// What an open returns to the adapter.
pub struct Opened {
    pub fh: u64,
    /// The complete cached copy the kernel may read directly (passthrough), if allowed.
    pub passthrough: Option<Arc<Entry>>,
    /// Whether the kernel may keep the pages it already holds for this inode.
    pub keep_cache: bool,
    /// Rather served by the daemon, the kernel keeping its pages, than passed through, though
    /// `passthrough` may be offered (a small file whose bytes were not in memory at the inode's
    /// first open: see `--passthrough-min`).
    pub keep_pages: bool,
    /// A writable handle of a file being written: its `close()` may finish it (FUSE flush: see
    /// `super::close`).
    /// The kernel is told not to flush any other handle (no round trip per close).
    pub finishes: bool,
    /// The whole file, to hand the kernel's page cache with the open (a packed file the
    /// kernel holds no pages of: its reads then never come to the daemon).
    pub store: Option<crate::cache::ReadBytes>,
}

impl<S: Source> DyadFs<S> {
    pub(super) fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, Arc::new(h));
        fh
    }

    pub(super) fn handle(&self, fh: u64) -> Result<Arc<Handle>, Error> {
        let handles = lock(&self.handles);
        handles.get(&fh).cloned().ok_or(Error::BadHandle(fh))
    }

    pub(super) fn staged_handle(&self, staged: Arc<Staged>, writable: bool) -> Opened {
        if writable {
            staged.writers.fetch_add(1, Ordering::Relaxed);
            // A release still on its way will not be the last: nothing waits for it.
            staged.release_expected.store(false, Ordering::Relaxed);
        }
        let fh = self.add_handle(Handle::Staged { staged, writable });
        Opened {
            fh,
            passthrough: None,
            keep_cache: false,
            keep_pages: false,
            finishes: writable,
            store: None,
        }
    }
}
