//! A file's chunks behind their lock (`ChunkStates`): the claims of chunks and pages (single
//! flight), their completion or abandonment, and the bounded waits of the readers behind them.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::chunk::{Chunk, Chunks};
use super::pages::PAGES;
use crate::cache::format::PageMask;
use crate::core::sync::model::{Condvar, Mutex, MutexGuard};

/// How long a reader waits for another reader's fill of the same chunk before giving up.
pub(in crate::cache) const FILL_WAIT: Duration = Duration::from_secs(120);

pub(in crate::cache) struct State {
    pub(in crate::cache) chunks: Chunks,
    pub(in crate::cache) present_bytes: u64,
    /// Set when the entry leaves the index (evicted or replaced): nothing is persisted again,
    /// and its data file is never opened again (its slot may hold another entry's file).
    pub(in crate::cache) evicted: bool,
    /// Reloaded at start and its data file not looked at yet (see `Entry::file`).
    pub(in crate::cache) unchecked: bool,
    /// A fingerprint of the data file's ctime when every chunk was last verified (0: not
    /// taken; see `Entry::is_verified`). In the padding after the flags: an entry stays within
    /// its malloc size class.
    pub(in crate::cache) verified_ctime: u32,
    /// Readers waiting for a fill's end (see `ChunkStates::wait_while`): a fill that ends with
    /// none waiting wakes nobody (a condvar's notify is a futex system call whether or not
    /// anyone waits, one per pulled file). In the same padding.
    pub(in crate::cache) waiting: u16,
}

impl State {
    /// Forgets every present chunk and page (the entry left the cache); pages being filled stay
    /// claimed until their fillers find the entry gone.
    pub(in crate::cache) fn drop_present(&mut self) {
        for i in 0..self.chunks.len() {
            match self.chunks[i] {
                Chunk::Present { .. } => self.chunks[i] = Chunk::Absent,
                Chunk::Partial => {
                    let idx = i as u64;
                    let filling = self.chunks.pages_mut(idx).map_or(0, |p| {
                        p.remove(PageMask::MAX);
                        p.filling
                    });
                    if filling == 0 {
                        self.chunks.drop_pages(idx);
                        self.chunks[i] = Chunk::Absent;
                    }
                }
                Chunk::Absent | Chunk::Filling => {}
            }
        }
    }

    /// Whether chunk `i`, or a page of it, is being filled.
    pub(in crate::cache) fn filling(&self, i: usize) -> bool {
        self.filling_pages(i, !0)
    }

    /// Whether chunk `i` is being filled whole, or one of its pages `want` is.
    fn filling_pages(&self, i: usize, want: PageMask) -> bool {
        match self.chunks[i] {
            Chunk::Filling => true,
            Chunk::Partial => self
                .chunks
                .page_set(i as u64)
                .is_some_and(|p| p.filling & want != 0),
            _ => false,
        }
    }
}

/// The outcome of claiming a range of chunks.
pub struct Claim {
    /// Chunks this caller must fill (now `Filling`).
    pub mine: Vec<u64>,
    /// Whether other fillers hold chunks of the range.
    pub others: bool,
    /// Partial chunks of the range: not claimed whole (their present pages stay), for the
    /// caller to complete page by page.
    pub partial: Vec<u64>,
}

/// The outcome of claiming pages of one chunk.
pub struct PageClaim {
    /// Pages this caller must fill (a bit each).
    pub mine: PageMask,
    /// Whether another filler holds some of the pages wanted (or the whole chunk).
    pub others: bool,
    /// The chunk is absent and the cache holds as many page tables as it may: it is to be
    /// filled whole (nothing was claimed).
    pub whole: bool,
}

/// The chunks of one entry, behind their lock, with the condition readers wait on.
pub(in crate::cache) struct ChunkStates {
    state: Mutex<State>,
    filled: Condvar,
}

impl ChunkStates {
    pub(in crate::cache) fn new(state: State) -> ChunkStates {
        ChunkStates {
            state: Mutex::new(state),
            filled: Condvar::new(),
        }
    }

    /// The state, for a few updates (ignoring poisoning: each critical section leaves it
    /// consistent, chunks are only marked present after their bytes are written).
    pub(in crate::cache) fn lock(&self) -> MutexGuard<'_, State> {
        crate::core::sync::model::lock(&self.state)
    }

    /// Claims every absent chunk of `range` for the caller to fill; partial ones are listed,
    /// not claimed (their present pages are not fetched again).
    pub(in crate::cache) fn claim(&self, range: Range<u64>) -> Claim {
        let mut st = self.lock();
        let mut claim = Claim {
            mine: Vec::new(),
            others: false,
            partial: Vec::new(),
        };
        for i in range {
            match st.chunks[i as usize] {
                Chunk::Absent => {
                    st.chunks[i as usize] = Chunk::Filling;
                    claim.mine.push(i);
                }
                Chunk::Partial => claim.partial.push(i),
                Chunk::Filling => claim.others = true,
                Chunk::Present { .. } => {}
            }
        }
        claim
    }

    /// Claims the pages of `want` in chunk `idx` that are absent, for the caller to fill. A chunk
    /// present whole claims none; one being filled whole claims none and says `others`.
    pub(in crate::cache) fn claim_pages(&self, idx: u64, want: PageMask) -> PageClaim {
        let mut st = self.lock();
        let i = idx as usize;
        let none = |others, whole| PageClaim {
            mine: 0,
            others,
            whole,
        };
        match st.chunks[i] {
            Chunk::Partial => {}
            Chunk::Absent if st.chunks.may_take_pages() => {}
            Chunk::Absent => return none(false, true),
            Chunk::Filling => return none(true, false),
            Chunk::Present { .. } => return none(false, false),
        }
        let Some(p) = st.chunks.pages_mut(idx) else {
            return none(false, false);
        };
        let mine = want & !p.present & !p.filling;
        let others = want & p.filling != 0;
        p.filling |= mine;
        st.chunks[i] = Chunk::Partial;
        PageClaim {
            mine,
            others,
            whole: false,
        }
    }

    /// Marks claimed pages `mine` of chunk `idx` present (`bytes` in all) with their checksums
    /// (`crcs[p]` for page p). Once every page of `all` is present the chunk is present whole,
    /// its checksum combined from its pages' (`len(p)`: page p's length). `false` (and the pages
    /// absent again) if the entry left the cache meanwhile.
    pub(in crate::cache) fn complete_pages(
        &self,
        idx: u64,
        mine: PageMask,
        crcs: &[u32; PAGES as usize],
        bytes: u64,
        all: PageMask,
        len: impl Fn(u32) -> u64,
    ) -> bool {
        let mut st = self.lock();
        let kept = !st.evicted;
        if let Some(p) = st.chunks.pages_mut(idx) {
            p.filling &= !mine;
            if kept {
                p.add(mine, crcs);
                p.verified |= mine;
            }
            let (present, filling, verified) = (p.present, p.filling, p.verified);
            let whole = present & all == all && filling == 0;
            if whole {
                // Every page present: its crcs are the chunk's pages' in order.
                let crc = p.crcs[1..]
                    .iter()
                    .zip(1..)
                    .fold(p.crcs[0], |acc, (&page_crc, page)| {
                        crc32c::crc32c_combine(acc, page_crc, len(page) as usize)
                    });
                st.chunks.drop_pages(idx);
                st.chunks[idx as usize] = Chunk::Present {
                    crc,
                    verified: verified & all == all,
                };
            } else if present == 0 && filling == 0 {
                st.chunks.drop_pages(idx);
                st.chunks[idx as usize] = Chunk::Absent;
            }
        }
        if kept {
            st.present_bytes += bytes;
        }
        self.wake(&st);
        kept
    }

    /// Gives back claimed pages `mine` of chunk `idx` that could not be filled.
    pub(in crate::cache) fn abandon_pages(&self, idx: u64, mine: PageMask) {
        let mut st = self.lock();
        if let Some(p) = st.chunks.pages_mut(idx) {
            p.filling &= !mine;
            if p.present == 0 && p.filling == 0 {
                st.chunks.drop_pages(idx);
                st.chunks[idx as usize] = Chunk::Absent;
            }
        }
        self.wake(&st);
    }

    /// Whether every page of `want` in chunk `idx` is present (the chunk whole, or those pages).
    pub(in crate::cache) fn pages_present(&self, idx: u64, want: PageMask) -> bool {
        let st = self.lock();
        match st.chunks[idx as usize] {
            Chunk::Present { .. } => true,
            Chunk::Partial => st
                .chunks
                .page_set(idx)
                .is_some_and(|p| p.present & want == want),
            _ => false,
        }
    }

    /// Waits up to `wait` until no page of `want` in chunk `idx` (nor the chunk whole) is being
    /// filled by someone else; `false` if that time passed first.
    pub(in crate::cache) fn wait_pages(&self, idx: u64, want: PageMask, wait: Duration) -> bool {
        self.wait_while(wait, |st| st.filling_pages(idx as usize, want))
    }

    /// Waits up to `wait` (woken by every fill's end) while `busy` holds; `false` if that time
    /// passed first.
    fn wait_while(&self, wait: Duration, busy: impl Fn(&State) -> bool) -> bool {
        let deadline = Instant::now() + wait;
        let mut st = self.lock();
        while busy(&st) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st.waiting += 1;
            st = self
                .filled
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            st.waiting -= 1;
        }
        true
    }

    /// Wakes the readers waiting for a fill's end, if any (asked under the lock they count
    /// themselves under, so none is missed).
    fn wake(&self, st: &State) {
        if st.waiting > 0 {
            self.filled.notify_all();
        }
    }

    /// Marks claimed chunk `idx` (of `len` bytes) present with its checksum; `false` (and the
    /// chunk absent again) if the entry left the cache meanwhile.
    pub(in crate::cache) fn complete(&self, idx: u64, crc: u32, len: u64) -> bool {
        let mut st = self.lock();
        let kept = !st.evicted;
        st.chunks[idx as usize] = if kept {
            st.present_bytes += len;
            Chunk::Present {
                crc,
                verified: true,
            }
        } else {
            Chunk::Absent
        };
        self.wake(&st);
        kept
    }

    /// Gives back a claimed chunk that could not be filled; waiters retry it themselves.
    pub(in crate::cache) fn abandon(&self, idx: u64) {
        let mut st = self.lock();
        st.chunks[idx as usize] = Chunk::Absent;
        self.wake(&st);
    }

    /// Waits up to `wait` until no chunk of `range` is being filled by someone else; `false` if
    /// that time passed first.
    pub(in crate::cache) fn wait_fills(&self, range: Range<u64>, wait: Duration) -> bool {
        self.wait_while(wait, |st| {
            (range.start as usize..range.end as usize).any(|i| st.filling(i))
        })
    }

    pub(in crate::cache) fn all_present(&self, range: Range<u64>) -> bool {
        let st = self.lock();
        st.chunks[range.start as usize..range.end as usize]
            .iter()
            .all(|c| matches!(c, Chunk::Present { .. }))
    }
}
