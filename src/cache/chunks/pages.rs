//! The pages of a partial chunk (a large file's chunk read at random), and the bound on how
//! many chunks of one cache have them.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::cache::format::PageMask;

/// Pages of a chunk (the last chunk of a file may have fewer): the unit a random read fills,
/// 16 KiB at the default chunk size, so a 110 KB record fetches about 1.1x its bytes.
pub const PAGES: u64 = 128;

/// The pages of one partial chunk, a bit each, with the checksums of the present ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(in crate::cache) struct Pages {
    pub(super) present: PageMask,
    /// Claimed by a filler (single flight, as a chunk's `Filling`).
    pub(in crate::cache) filling: PageMask,
    /// Present pages whose bytes were checked against their checksum in this daemon's lifetime.
    pub(in crate::cache) verified: PageMask,
    /// The crc32c of each present page, in page order: a chunk read at random holds a page or
    /// two, so its table is 64 bytes and a few crcs, not one crc per page it could hold.
    pub(super) crcs: Box<[u32]>,
}

impl Pages {
    pub(in crate::cache) fn present(&self) -> PageMask {
        self.present
    }

    /// The crc32c of page `page`, if present.
    pub(in crate::cache) fn crc(&self, page: u32) -> Option<u32> {
        let bit: PageMask = 1 << page;
        (self.present & bit != 0)
            .then(|| self.crcs[(self.present & (bit - 1)).count_ones() as usize])
    }

    /// The crc32cs of the present pages, in page order (as the log records them).
    pub(in crate::cache) fn crcs(&self) -> &[u32] {
        &self.crcs
    }

    /// Makes `pages` present with their checksums (`crcs[p]` for page p).
    pub(super) fn add(&mut self, pages: PageMask, crcs: &[u32; PAGES as usize]) {
        let all = self.present | pages;
        self.crcs = (0..PAGES as u32)
            .filter(|&p| all & (1 << p) != 0)
            .map(|p| match pages & (1 << p) {
                0 => self.crc(p).unwrap_or_default(),
                _ => crcs[p as usize],
            })
            .collect();
        self.present = all;
    }

    /// Makes `pages` absent (and not verified).
    pub(in crate::cache) fn remove(&mut self, pages: PageMask) {
        let kept = self.present & !pages;
        self.crcs = (0..PAGES as u32)
            .filter(|&p| kept & (1 << p) != 0)
            .filter_map(|p| self.crc(p))
            .collect();
        self.present = kept;
        self.verified &= !pages;
    }

    /// Pages as the log recorded them: `crcs` those of `present`'s pages in page order.
    pub(super) fn restore(&mut self, present: PageMask, crcs: &[u32]) {
        self.present = present;
        self.crcs = crcs.into();
    }
}

/// How many chunks of one cache have a page table (about 250 bytes of the daemon's memory each
/// with its map slot and crcs, for as little as one page of cache), and how many may: past
/// that, a random read of an absent chunk fills it whole, as a sequential reader's would.
pub(in crate::cache) struct PageTables {
    now: AtomicU64,
    max: u64,
}

impl PageTables {
    pub(in crate::cache) fn new(max: u64) -> PageTables {
        PageTables {
            now: AtomicU64::new(0),
            max,
        }
    }

    pub(in crate::cache) fn count(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    pub(super) fn room(&self) -> bool {
        self.count() < self.max
    }

    pub(super) fn add(&self, n: u64) {
        self.now.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, n: u64) {
        self.now.fetch_sub(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partial chunk keeps a crc for each present page only, in page order, whatever order
    /// its pages come and go in.
    #[test]
    fn a_page_table_holds_the_crcs_of_its_present_pages_only() {
        let mut crcs = [0u32; PAGES as usize];
        for (p, c) in crcs.iter_mut().enumerate() {
            *c = 1000 + p as u32;
        }
        let mut p = Pages::default();
        p.add(1 << 70, &crcs);
        p.add((1 << 3) | (1 << 127), &crcs);
        p.add(1 << 0, &crcs);
        assert_eq!(p.crcs(), [1000, 1003, 1070, 1127]);
        assert_eq!(
            (p.crc(70), p.crc(4), p.crc(127)),
            (Some(1070), None, Some(1127))
        );
        p.verified = (1 << 3) | (1 << 70);
        p.remove((1 << 3) | (1 << 5));
        assert_eq!(p.present(), (1 << 0) | (1 << 70) | (1 << 127));
        assert_eq!((p.crcs(), p.verified), (&[1000, 1070, 1127][..], 1 << 70));
        // A page filled again takes its new checksum.
        let mut again = crcs;
        again[70] = 7;
        p.add(1 << 70, &again);
        assert_eq!(p.crcs(), [1000, 7, 1127]);
        // The table's own size, whatever it holds: its crcs live beside it.
        assert_eq!(std::mem::size_of::<Pages>(), 64);
    }
}
