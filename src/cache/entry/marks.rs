//! An entry's pins and marks, and its age in the index: two words beside its chunks.

use std::sync::atomic::{AtomicU32, Ordering};

/// Some of this entry's bytes were fetched from the backing store (stats).
pub(super) const FETCHED: u32 = 1 << 31;
/// Some of this entry's bytes were pulled from a peer (stats).
pub(super) const PULLED: u32 = 1 << 30;
/// A produced file's current object on its producer: the only copy, never evicted.
pub(super) const KEEP: u32 = 1 << 29;
/// Its pages were told to the publisher while it was partly cached (`Entry::mark_shared`).
pub(super) const SHARED: u32 = 1 << 28;
/// A whole header of it is in the log: a page fill may append its chunk's pages alone.
pub(super) const LOGGED: u32 = 1 << 27;
/// A background copy of it is under way (`Entry::set_copying`): readers wait for it a moment
/// only.
pub(super) const COPYING: u32 = 1 << 26;
const PINS: u32 = COPYING - 1;

/// Who holds an entry, what it is marked with, and when it was last used.
pub(super) struct Marks {
    /// Open handles holding it (the low bits) and its marks ([`FETCHED`], [`PULLED`],
    /// [`KEEP`], [`SHARED`], [`LOGGED`], [`COPYING`]).
    pins_marks: AtomicU32,
    /// The cache's tick when it was last used, in 32 bits: ages are taken modulo 2^32
    /// ([`Marks::age`]), so the counter's wrap changes no order.
    last_use: AtomicU32,
}

impl Marks {
    /// No pin, no mark, last used at `tick`.
    pub(super) fn new(tick: u64) -> Marks {
        Marks {
            pins_marks: AtomicU32::new(0),
            last_use: AtomicU32::new(tick as u32),
        }
    }

    pub(super) fn touch(&self, tick: u64) {
        self.last_use.store(tick as u32, Ordering::Relaxed);
    }

    /// Ticks since it was last used, as of tick `now`. A use after `now` (another thread
    /// touched it meanwhile) is age 0, not a wrapped-around "oldest".
    pub(super) fn age(&self, now: u64) -> u32 {
        let age = (now as u32).wrapping_sub(self.last_use.load(Ordering::Relaxed));
        if age > u32::MAX / 2 { 0 } else { age }
    }

    /// An open handle holds it, as of tick `tick`.
    pub(super) fn pin(&self, tick: u64) {
        self.pins_marks.fetch_add(1, Ordering::Relaxed);
        self.touch(tick);
    }

    pub(super) fn unpin(&self) {
        self.pins_marks.fetch_sub(1, Ordering::Relaxed);
    }

    pub(super) fn pinned(&self) -> bool {
        self.pins_marks.load(Ordering::Relaxed) & PINS != 0
    }

    /// Sets `mark`; whether it was not set before.
    pub(super) fn mark(&self, mark: u32) -> bool {
        self.pins_marks.fetch_or(mark, Ordering::Relaxed) & mark == 0
    }

    /// Whether `mark` is set.
    pub(super) fn has(&self, mark: u32) -> bool {
        self.pins_marks.load(Ordering::Relaxed) & mark != 0
    }

    /// Sets or clears `mark`.
    pub(super) fn set(&self, mark: u32, on: bool) {
        if on {
            self.pins_marks.fetch_or(mark, Ordering::Relaxed);
        } else {
            self.pins_marks.fetch_and(!mark, Ordering::Relaxed);
        }
    }
}
