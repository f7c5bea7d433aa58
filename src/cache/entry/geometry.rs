//! A file's geometry in the cache: its chunks and their pages, from its size and the chunk
//! size alone.

use std::ops::Range;

use crate::cache::chunks::{PAGES, PageMask};

/// The chunks and pages of a file of `size` bytes cut into chunks of `chunk_size`.
#[derive(Clone, Copy)]
pub(in crate::cache) struct Geometry {
    size: u64,
    chunk_size: u64,
}

impl Geometry {
    pub(in crate::cache) fn new(size: u64, chunk_size: u64) -> Geometry {
        Geometry { size, chunk_size }
    }

    pub(in crate::cache) fn chunk_count(self) -> u64 {
        self.size.div_ceil(self.chunk_size)
    }

    /// The length of chunk `idx` (the last one may be shorter).
    pub(in crate::cache) fn chunk_len(self, idx: u64) -> u64 {
        self.chunk_size.min(self.size - idx * self.chunk_size)
    }

    /// Chunks covering bytes `[offset, offset + len)`, clipped to the file.
    pub(in crate::cache) fn chunks_for(self, offset: u64, len: u64) -> Range<u64> {
        let end = (offset + len).min(self.size);
        if offset >= end {
            return 0..0;
        }
        offset / self.chunk_size..end.div_ceil(self.chunk_size)
    }

    /// The length of a page (a chunk's last page may be shorter): a 128th of a chunk.
    pub(in crate::cache) fn page_size(self) -> u64 {
        self.chunk_size / PAGES
    }

    /// The length of page `page` of chunk `idx`.
    pub(in crate::cache) fn page_len(self, idx: u64, page: u32) -> u64 {
        let start = u64::from(page) * self.page_size();
        self.page_size()
            .min(self.chunk_len(idx).saturating_sub(start))
    }

    /// The pages chunk `idx` has (a bit each).
    pub(in crate::cache) fn all_pages(self, idx: u64) -> PageMask {
        let n = self.chunk_len(idx).div_ceil(self.page_size());
        if n >= PAGES {
            PageMask::MAX
        } else {
            (1 << n) - 1
        }
    }

    /// The pages of chunk `idx` that bytes `[offset, end)` touch.
    pub(in crate::cache) fn pages_for(self, idx: u64, offset: u64, end: u64) -> PageMask {
        let start = idx * self.chunk_size;
        let (from, to) = (offset.max(start), end.min(start + self.chunk_len(idx)));
        if from >= to {
            return 0;
        }
        let (first, last) = (
            (from - start) / self.page_size(),
            (to - 1 - start) / self.page_size(),
        );
        (first..=last).fold(0, |m, p| m | (1 << p))
    }

    /// The bytes of pages `pages` of chunk `idx`.
    pub(in crate::cache) fn page_bytes(self, idx: u64, pages: PageMask) -> u64 {
        (0..PAGES as u32)
            .filter(|p| pages & (1 << p) != 0)
            .map(|p| self.page_len(idx, p))
            .sum()
    }
}
