//! Work done off the request's thread: sequential readahead of large files and background
//! verification of files the kernel reads directly.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::DyadFs;
use super::handles::CachedHandle;
use crate::cache::Entry;
use crate::core::source::Source;
use crate::fill::MAX_READAHEAD_CHUNKS;

pub(super) type Job = Box<dyn FnOnce() + Send>;

impl<S: Source> DyadFs<S> {
    /// On sequential reads of a large file, fills the next chunks in the background with a
    /// window that doubles per sequential read; a seek resets it.
    pub(super) fn read_ahead(&self, handle: &CachedHandle, offset: u64, len: u64) {
        let sequential = handle.next_offset.swap(offset + len, Ordering::Relaxed) == offset;
        let window = if sequential {
            (handle.window.load(Ordering::Relaxed) * 2).clamp(1, MAX_READAHEAD_CHUNKS)
        } else {
            0
        };
        handle.window.store(window, Ordering::Relaxed);
        let entry = handle.entry.clone();
        let start = entry.chunks_for(offset, len.max(1)).end;
        let end = (start + window).min(entry.chunk_count());
        if start >= end || entry.all_present(start..end) {
            return;
        }
        // One job per chunk: the readahead threads pull the window in parallel, so one
        // chunk's transfer overlaps another's disk write.
        for idx in start..end {
            let (reader, entry) = (self.reader.clone(), entry.clone());
            let _ = self.readahead.send(Box::new(move || {
                if let Err(e) = reader.fill_ahead(&entry, idx..idx + 1) {
                    tracing::debug!(path = %entry.path, error = %e, "readahead failed");
                }
            }));
        }
    }

    pub(super) fn verify_in_background(&self, entry: Arc<Entry>) {
        let cache = self.reader.cache.clone();
        let _ = self.readahead.send(Box::new(move || {
            // A failed chunk is dropped by verify and refetched on its next read.
            if let Err(e) = entry.verify(&cache, 0..entry.chunk_count()) {
                tracing::warn!(path = %entry.path, error = %e, "background verification failed");
            }
        }));
    }
}
