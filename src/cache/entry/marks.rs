//! An entry's geometry (its chunks' sizes), its age in the index, its pins and its marks.

use std::ops::Range;
use std::sync::atomic::Ordering;

use super::{Entry, FETCHED, KEEP, PINS, PULLED, SHARED, chunk_len};
use crate::cache::chunks::{Chunk, PAGES};
use crate::core::path_hash;

impl Entry {
    pub fn chunk_count(&self) -> u64 {
        self.version.size.div_ceil(self.shared.chunk_size)
    }

    pub fn chunk_len(&self, idx: u64) -> u64 {
        chunk_len(self.version.size, self.shared.chunk_size, idx)
    }

    pub fn chunk_size(&self) -> u64 {
        self.shared.chunk_size
    }

    /// Chunks covering bytes `[offset, offset + len)`, clipped to the file.
    pub fn chunks_for(&self, offset: u64, len: u64) -> Range<u64> {
        let end = (offset + len).min(self.version.size);
        if offset >= end {
            return 0..0;
        }
        offset / self.shared.chunk_size..end.div_ceil(self.shared.chunk_size)
    }

    /// The hash of its path: its slot in the index and the name of its data file.
    pub(in crate::cache) fn slot(&self) -> u64 {
        path_hash(&self.path)
    }

    pub(in crate::cache) fn touch(&self, tick: u64) {
        self.last_use.store(tick as u32, Ordering::Relaxed);
    }

    /// Ticks since it was last used, as of tick `now`. A use after `now` (another thread
    /// touched it meanwhile) is age 0, not a wrapped-around "oldest".
    pub(in crate::cache) fn age(&self, now: u64) -> u32 {
        let age = (now as u32).wrapping_sub(self.last_use.load(Ordering::Relaxed));
        if age > u32::MAX / 2 { 0 } else { age }
    }

    /// An open handle holds the entry: it is not evicted until `unpin`.
    pub fn pin(&self) {
        self.pins_marks.fetch_add(1, Ordering::Relaxed);
        self.touch(self.shared.next_tick());
    }

    pub fn unpin(&self) {
        self.pins_marks.fetch_sub(1, Ordering::Relaxed);
    }

    pub(in crate::cache) fn pinned(&self) -> bool {
        self.pins_marks.load(Ordering::Relaxed) & PINS != 0
    }

    /// Sets `mark`; whether it was not set before.
    pub(super) fn mark(&self, mark: u32) -> bool {
        self.pins_marks.fetch_or(mark, Ordering::Relaxed) & mark == 0
    }

    /// Records that bytes of it came from the backing store: `true` the first time.
    pub fn mark_fetched(&self) -> bool {
        self.mark(FETCHED)
    }

    /// Records that bytes of it came from a peer: `true` the first time.
    pub fn mark_pulled(&self) -> bool {
        self.mark(PULLED)
    }

    /// Records that its partial copy was told to the publisher: `true` the first time.
    pub fn mark_shared(&self) -> bool {
        self.mark(SHARED)
    }

    fn is_shared(&self) -> bool {
        self.pins_marks.load(Ordering::Relaxed) & SHARED != 0
    }

    /// Whether its partial copy is yet to be told to the publisher: it holds pages of a random
    /// reader's (a copy of whole chunks only is told once complete, as a small file is).
    pub fn share_pages(&self) -> bool {
        !self.is_shared() && self.has_pages() && self.mark_shared()
    }

    /// Whether some chunk is partly present (pages a random reader filled).
    pub fn has_pages(&self) -> bool {
        let st = self.state.lock();
        st.chunks
            .pages()
            .is_some_and(|p| p.values().any(|p| p.present() != 0))
    }

    /// Which pages are present, a word per 32 pages (every page of a present chunk), for words
    /// `from..` (at most `max`): what a peer asks before pulling pages of a copy that may be
    /// partial.
    pub fn held_pages(&self, from: u64, max: usize) -> Vec<u32> {
        const WORDS: u64 = PAGES / 32;
        let end = (self.chunk_count() * WORDS).min(from.saturating_add(max as u64));
        let st = self.state.lock();
        (from.min(end)..end)
            .map(|w| {
                let i = w / WORDS;
                let mask = match st.chunks[i as usize] {
                    Chunk::Present { .. } => self.all_pages(i),
                    Chunk::Partial => st.chunks.page_set(i).map_or(0, |p| p.present()),
                    _ => 0,
                };
                (mask >> (w % WORDS * 32)) as u32
            })
            .collect()
    }

    /// Whether it is a produced file's current object (never evicted).
    pub fn kept(&self) -> bool {
        self.pins_marks.load(Ordering::Relaxed) & KEEP != 0
    }

    pub fn set_kept(&self, keep: bool) {
        if keep {
            self.pins_marks.fetch_or(KEEP, Ordering::Relaxed);
        } else {
            self.pins_marks.fetch_and(!KEEP, Ordering::Relaxed);
        }
    }

    pub fn is_evicted(&self) -> bool {
        self.state.lock().evicted
    }
}
