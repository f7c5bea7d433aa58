//! Open handles: a file read through the cache, or a file being written on this node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::error::Error;
use super::write::Staged;
use crate::cache::Entry;
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
    /// Read by the daemon as the reader asks, without the kernel's page cache or readahead
    /// (FOPEN_DIRECT_IO): a large file not cached whole, filled by the pages its reads touch,
    /// where the kernel's readahead of each read (as large again, ahead of it) would fetch
    /// pages no read touches. Mapping it still goes through the page cache.
    pub direct: bool,
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

/// The open handles by their number (FUSE's `fh`); directory handles take their numbers here
/// too, so no two handles of either kind share one.
pub(super) struct Handles {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Handle>>>,
}

impl Handles {
    pub(super) fn new() -> Handles {
        Handles {
            next: AtomicU64::new(1),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A number no handle had.
    pub(super) fn number(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    pub(super) fn add(&self, h: Handle) -> u64 {
        let fh = self.number();
        lock(&self.open).insert(fh, Arc::new(h));
        fh
    }

    pub(super) fn get(&self, fh: u64) -> Result<Arc<Handle>, Error> {
        lock(&self.open)
            .get(&fh)
            .cloned()
            .ok_or(Error::BadHandle(fh))
    }

    pub(super) fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        lock(&self.open).remove(&fh)
    }

    /// How many are open.
    #[cfg(test)]
    pub(super) fn count(&self) -> usize {
        lock(&self.open).len()
    }

    /// The first `f` gives of an open handle.
    pub(super) fn find_map<T>(&self, f: impl FnMut(&Arc<Handle>) -> Option<T>) -> Option<T> {
        lock(&self.open).values().find_map(f)
    }

    /// A handle of file `staged`, being written here.
    pub(super) fn staged(&self, staged: Arc<Staged>, writable: bool) -> Opened {
        if writable {
            staged.writers.fetch_add(1, Ordering::Relaxed);
            // A release still on its way will not be the last: nothing waits for it.
            staged.release_expected.store(false, Ordering::Relaxed);
        }
        let fh = self.add(Handle::Staged { staged, writable });
        Opened {
            fh,
            passthrough: None,
            keep_cache: false,
            direct: false,
            keep_pages: false,
            finishes: writable,
            store: None,
        }
    }
}
