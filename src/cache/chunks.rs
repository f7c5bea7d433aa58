//! The chunks' state machine of one cached file: Absent -> Filling (claimed by one filler:
//! single flight) -> Present, and back to Absent when a filler gives up or the entry left the
//! cache. A chunk of a large file read at random is filled a page at a time instead: Absent ->
//! Partial (its pages each absent, being filled by one filler, or present with their own
//! checksums) -> Present once its last page lands; a whole-chunk fill (readahead) that finds it
//! partial fills its absent pages, never the present ones again.
//! Readers that find a chunk or page being filled wait for it (bounded). The lock and condition
//! variable come from [`crate::core::sync::model`], so `--features shuttle` explores the
//! interleavings of claims, fills and waits (tests below).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use super::format::PageMask;
use super::format::PartialRecord;
use crate::core::sync::model::{Condvar, Mutex, MutexGuard};

/// How long a reader waits for another reader's fill of the same chunk before giving up.
pub(super) const FILL_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunk {
    Absent,
    Filling,
    Present {
        crc: u32,
        verified: bool,
    },
    /// Some of its pages present or being filled: which, in the chunks' page table.
    Partial,
}

/// Pages of a chunk (the last chunk of a file may have fewer): the unit a random read fills,
/// 16 KiB at the default chunk size, so a 110 KB record fetches about 1.1x its bytes.
pub const PAGES: u64 = 128;

/// The pages of one partial chunk, a bit each, with the checksums of the present ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Pages {
    present: PageMask,
    /// Claimed by a filler (single flight, as a chunk's `Filling`).
    pub(super) filling: PageMask,
    /// Present pages whose bytes were checked against their checksum in this daemon's lifetime.
    pub(super) verified: PageMask,
    /// The crc32c of each present page, in page order: a chunk read at random holds a page or
    /// two, so its table is 64 bytes and a few crcs, not one crc per page it could hold.
    crcs: Box<[u32]>,
}

impl Pages {
    pub(super) fn present(&self) -> PageMask {
        self.present
    }

    /// The crc32c of page `page`, if present.
    pub(super) fn crc(&self, page: u32) -> Option<u32> {
        let bit: PageMask = 1 << page;
        (self.present & bit != 0)
            .then(|| self.crcs[(self.present & (bit - 1)).count_ones() as usize])
    }

    /// The crc32cs of the present pages, in page order (as the log records them).
    pub(super) fn crcs(&self) -> &[u32] {
        &self.crcs
    }

    /// Makes `pages` present with their checksums (`crcs[p]` for page p).
    fn add(&mut self, pages: PageMask, crcs: &[u32; PAGES as usize]) {
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
    pub(super) fn remove(&mut self, pages: PageMask) {
        let kept = self.present & !pages;
        self.crcs = (0..PAGES as u32)
            .filter(|&p| kept & (1 << p) != 0)
            .filter_map(|p| self.crc(p))
            .collect();
        self.present = kept;
        self.verified &= !pages;
    }

    /// Pages as the log recorded them: `crcs` those of `present`'s pages in page order.
    fn restore(&mut self, present: PageMask, crcs: &[u32]) {
        self.present = present;
        self.crcs = crcs.into();
    }
}

/// How many chunks of one cache have a page table (about 250 bytes of the daemon's memory each
/// with its map slot and crcs, for as little as one page of cache), and how many may: past
/// that, a random read of an absent chunk fills it whole, as a sequential reader's would.
pub(super) struct PageTables {
    now: AtomicU64,
    max: u64,
}

impl PageTables {
    pub(super) fn new(max: u64) -> PageTables {
        PageTables {
            now: AtomicU64::new(0),
            max,
        }
    }

    pub(super) fn count(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    fn room(&self) -> bool {
        self.count() < self.max
    }

    fn add(&self, n: u64) {
        self.now.fetch_add(n, Ordering::Relaxed);
    }

    fn sub(&self, n: u64) {
        self.now.fetch_sub(n, Ordering::Relaxed);
    }
}

/// An entry's chunks: most training samples are one chunk, kept inline (a million cached files
/// should not mean a million extra allocations). Only a file of several chunks has pages.
pub(super) enum Chunks {
    One([Chunk; 1]),
    Many(Box<ManyChunks>),
}

pub(super) struct ManyChunks {
    chunks: Box<[Chunk]>,
    /// The pages of its `Partial` chunks, by chunk.
    pages: HashMap<u32, Pages>,
    /// Where its page tables are counted (`None` until it joins a cache's entry).
    tables: Option<Arc<PageTables>>,
    /// The data file's ctime print when its pages were last checked (0: none yet), for as
    /// long as the file is partly cached (see `Entry::guard_partial`).
    print: u32,
}

impl Drop for ManyChunks {
    fn drop(&mut self) {
        if let Some(t) = &self.tables {
            t.sub(self.pages.len() as u64);
        }
    }
}

impl From<Vec<Chunk>> for Chunks {
    fn from(v: Vec<Chunk>) -> Chunks {
        match v[..] {
            [one] => Chunks::One([one]),
            _ => Chunks::Many(Box::new(ManyChunks {
                chunks: v.into_boxed_slice(),
                pages: HashMap::new(),
                tables: None,
                print: 0,
            })),
        }
    }
}

impl Chunks {
    /// The print of a partly cached file's pages (`None` for a one-chunk file, never partial).
    pub(super) fn print_mut(&mut self) -> Option<&mut u32> {
        match self {
            Chunks::One(_) => None,
            Chunks::Many(m) => Some(&mut m.print),
        }
    }

    /// Marks every present chunk and page unverified: each is checked again before it is
    /// next served.
    pub(super) fn unverify(&mut self) {
        for c in self.iter_mut() {
            if let Chunk::Present { crc, .. } = *c {
                *c = Chunk::Present {
                    crc,
                    verified: false,
                };
            }
        }
        if let Chunks::Many(m) = self {
            for p in m.pages.values_mut() {
                p.verified = 0;
            }
        }
    }

    /// The page table (empty for a one-chunk file).
    pub(super) fn pages(&self) -> Option<&HashMap<u32, Pages>> {
        match self {
            Chunks::One(_) => None,
            Chunks::Many(m) => Some(&m.pages),
        }
    }

    /// The pages of chunk `idx`, if it has any.
    pub(super) fn page_set(&self, idx: u64) -> Option<&Pages> {
        self.pages()?.get(&(idx as u32))
    }

    /// The pages of chunk `idx`, made absent if it had none (`None` for a one-chunk file).
    pub(super) fn pages_mut(&mut self, idx: u64) -> Option<&mut Pages> {
        match self {
            Chunks::One(_) => None,
            Chunks::Many(m) => {
                let ManyChunks { pages, tables, .. } = &mut **m;
                Some(pages.entry(idx as u32).or_insert_with(|| {
                    if let Some(t) = tables {
                        t.add(1);
                    }
                    Pages::default()
                }))
            }
        }
    }

    /// Forgets the pages of chunk `idx` (it is absent, being filled whole, or present whole).
    pub(super) fn drop_pages(&mut self, idx: u64) {
        if let Chunks::Many(m) = self
            && m.pages.remove(&(idx as u32)).is_some()
            && let Some(t) = &m.tables
        {
            t.sub(1);
        }
    }

    /// Counts its page tables, now and as they come and go, in `tables`.
    pub(super) fn counted_in(mut self, tables: &Arc<PageTables>) -> Chunks {
        if let Chunks::Many(m) = &mut self {
            tables.add(m.pages.len() as u64);
            m.tables = Some(tables.clone());
        }
        self
    }

    /// Whether an absent chunk may be filled page by page: never a one-chunk file's (files
    /// that small are fetched whole), and a cache's page tables are bounded ([`PageTables`]).
    fn may_take_pages(&self) -> bool {
        match self {
            Chunks::One(_) => false,
            Chunks::Many(m) => m.tables.as_ref().is_none_or(|t| t.room()),
        }
    }

    /// The present pages of its partial chunks, as the log records them.
    pub(super) fn partial_records(&self) -> Vec<PartialRecord> {
        let Some(pages) = self.pages() else {
            return Vec::new();
        };
        let mut out: Vec<PartialRecord> = pages
            .iter()
            .filter(|(_, p)| p.present != 0)
            .map(|(&chunk, p)| PartialRecord {
                chunk,
                pages: p.present,
                crcs: p.crcs.to_vec(),
            })
            .collect();
        out.sort_by_key(|r| r.chunk);
        out
    }

    /// `chunks` with the logged pages of its partial ones (present, not yet verified).
    pub(super) fn with_partial(mut chunks: Chunks, partial: &[PartialRecord]) -> Chunks {
        for r in partial {
            let idx = u64::from(r.chunk);
            let Some(p) = chunks.pages_mut(idx) else {
                continue;
            };
            p.restore(r.pages, &r.crcs);
            chunks[idx as usize] = Chunk::Partial;
        }
        chunks
    }

    /// Every chunk absent, no page anywhere.
    pub(super) fn clear(&mut self) {
        if let Chunks::Many(m) = self {
            if let Some(t) = &m.tables {
                t.sub(m.pages.len() as u64);
            }
            m.pages.clear();
        }
        self.fill(Chunk::Absent);
    }
}

impl std::ops::Deref for Chunks {
    type Target = [Chunk];
    fn deref(&self) -> &[Chunk] {
        match self {
            Chunks::One(c) => c,
            Chunks::Many(m) => &m.chunks,
        }
    }
}

impl std::ops::DerefMut for Chunks {
    fn deref_mut(&mut self) -> &mut [Chunk] {
        match self {
            Chunks::One(c) => c,
            Chunks::Many(m) => &mut m.chunks,
        }
    }
}

pub(super) struct State {
    pub(super) chunks: Chunks,
    pub(super) present_bytes: u64,
    /// Set when the entry leaves the index (evicted or replaced): nothing is persisted again,
    /// and its data file is never opened again (its slot may hold another entry's file).
    pub(super) evicted: bool,
    /// Reloaded at start and its data file not looked at yet (see `Entry::file`).
    pub(super) unchecked: bool,
    /// A fingerprint of the data file's ctime when every chunk was last verified (0: not
    /// taken; see `Entry::is_verified`). In the padding after the flags: an entry stays within
    /// its malloc size class.
    pub(super) verified_ctime: u32,
    /// Readers waiting for a fill's end (see `ChunkStates::wait_while`): a fill that ends with
    /// none waiting wakes nobody (a condvar's notify is a futex system call whether or not
    /// anyone waits, one per pulled file). In the same padding.
    pub(super) waiting: u16,
}

impl State {
    /// Forgets every present chunk and page (the entry left the cache); pages being filled stay
    /// claimed until their fillers find the entry gone.
    pub(super) fn drop_present(&mut self) {
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
    pub(super) fn filling(&self, i: usize) -> bool {
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
pub(super) struct ChunkStates {
    state: Mutex<State>,
    filled: Condvar,
}

impl ChunkStates {
    pub(super) fn new(state: State) -> ChunkStates {
        ChunkStates {
            state: Mutex::new(state),
            filled: Condvar::new(),
        }
    }

    /// The state, for a few updates (ignoring poisoning: each critical section leaves it
    /// consistent, chunks are only marked present after their bytes are written).
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        crate::core::sync::model::lock(&self.state)
    }

    /// Claims every absent chunk of `range` for the caller to fill; partial ones are listed,
    /// not claimed (their present pages are not fetched again).
    pub(super) fn claim(&self, range: Range<u64>) -> Claim {
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
    pub(super) fn claim_pages(&self, idx: u64, want: PageMask) -> PageClaim {
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
    pub(super) fn complete_pages(
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
    pub(super) fn abandon_pages(&self, idx: u64, mine: PageMask) {
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
    pub(super) fn pages_present(&self, idx: u64, want: PageMask) -> bool {
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
    pub(super) fn wait_pages(&self, idx: u64, want: PageMask, wait: Duration) -> bool {
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
    pub(super) fn complete(&self, idx: u64, crc: u32, len: u64) -> bool {
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
    pub(super) fn abandon(&self, idx: u64) {
        let mut st = self.lock();
        st.chunks[idx as usize] = Chunk::Absent;
        self.wake(&st);
    }

    /// Waits up to `wait` until no chunk of `range` is being filled by someone else; `false` if
    /// that time passed first.
    pub(super) fn wait_fills(&self, range: Range<u64>, wait: Duration) -> bool {
        self.wait_while(wait, |st| {
            (range.start as usize..range.end as usize).any(|i| st.filling(i))
        })
    }

    pub(super) fn all_present(&self, range: Range<u64>) -> bool {
        let st = self.lock();
        st.chunks[range.start as usize..range.end as usize]
            .iter()
            .all(|c| matches!(c, Chunk::Present { .. }))
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

/// Interleavings of claims, fills, give-ups and waits, explored by shuttle's randomized
/// scheduler (`cargo test --features shuttle --lib chunks`; scripts/test.sh runs it).
#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests {
    use shuttle::sync::Arc;
    use shuttle::thread;

    use super::*;
    use crate::core::sync::model::Mutex;

    const CHUNKS: usize = 4;

    fn absent() -> ChunkStates {
        ChunkStates::new(State {
            chunks: vec![Chunk::Absent; CHUNKS].into(),
            present_bytes: 0,
            evicted: false,
            unchecked: false,
            verified_ctime: 0,
            waiting: 0,
        })
    }

    /// What a reader of the whole range does (as the fill engine's fill): claim, fill its share
    /// (giving up on it the first time when `flaky`), wait for the others, until all is present.
    fn reader(chunks: &ChunkStates, fills: &Mutex<[u32; CHUNKS]>, flaky: bool) {
        let mut failed_once = !flaky;
        loop {
            let claim = chunks.claim(0..CHUNKS as u64);
            for idx in claim.mine {
                if !failed_once {
                    failed_once = true;
                    chunks.abandon(idx);
                    continue;
                }
                fills.lock().unwrap()[idx as usize] += 1;
                assert!(chunks.complete(idx, idx as u32, 10));
            }
            assert!(chunks.wait_fills(0..CHUNKS as u64, Duration::from_secs(3600)));
            if chunks.all_present(0..CHUNKS as u64) {
                return;
            }
        }
    }

    #[test]
    fn each_chunk_is_filled_once_and_every_reader_sees_all() {
        shuttle::check_random(
            || {
                let chunks = Arc::new(absent());
                let fills = Arc::new(Mutex::new([0u32; CHUNKS]));
                let threads: Vec<_> = (0..3)
                    .map(|i| {
                        let (c, f) = (chunks.clone(), fills.clone());
                        thread::spawn(move || reader(&c, &f, i == 0))
                    })
                    .collect();
                for t in threads {
                    t.join().unwrap();
                }
                assert_eq!(
                    *fills.lock().unwrap(),
                    [1; CHUNKS],
                    "a chunk filled twice or never"
                );
                assert_eq!(chunks.lock().present_bytes, 10 * CHUNKS as u64);
            },
            2000,
        );
    }

    /// Fills pages `want` of chunk 0 that nobody else fills (each page one byte), checking in
    /// `writing` that no page is written by two fillers at once.
    fn fill_pages(c: &ChunkStates, writing: &Mutex<PageMask>, want: PageMask) {
        let claim = c.claim_pages(0, want);
        if claim.mine == 0 {
            return;
        }
        let mut now = writing.lock().unwrap();
        assert_eq!(*now & claim.mine, 0, "a page filled twice at once");
        *now |= claim.mine;
        drop(now);
        thread::yield_now();
        *writing.lock().unwrap() &= !claim.mine;
        let bytes = u64::from(claim.mine.count_ones());
        let crcs = [0; PAGES as usize];
        assert!(c.complete_pages(0, claim.mine, &crcs, bytes, !0, |_| 1));
    }

    /// Two readers of overlapping pages of chunk 0 and a whole-chunk filler (readahead): no page
    /// is filled by two fillers at once, every reader ends with its pages present, the chunk
    /// ends present whole, and the bytes counted present are what it holds (never twice).
    #[test]
    fn page_fills_and_a_whole_fill_agree() {
        shuttle::check_random(
            || {
                let chunks = Arc::new(absent());
                // Pages a filler is writing now.
                let writing = Arc::new(Mutex::new(0 as PageMask));
                let page_reader = |want: PageMask| {
                    let (c, w) = (chunks.clone(), writing.clone());
                    thread::spawn(move || {
                        loop {
                            fill_pages(&c, &w, want);
                            assert!(c.wait_pages(0, want, Duration::from_secs(3600)));
                            if c.pages_present(0, want) {
                                return;
                            }
                        }
                    })
                };
                let readers = [page_reader(0b0111), page_reader(0b1110)];
                let (c, w) = (chunks.clone(), writing.clone());
                let whole = thread::spawn(move || {
                    loop {
                        let claim = c.claim(0..1);
                        for idx in claim.mine {
                            assert!(c.complete(idx, 0, PAGES));
                        }
                        // A partial chunk is completed page by page, its present pages kept.
                        for _ in claim.partial {
                            fill_pages(&c, &w, !0);
                        }
                        assert!(c.wait_fills(0..1, Duration::from_secs(3600)));
                        if c.all_present(0..1) {
                            return;
                        }
                    }
                });
                for t in readers {
                    t.join().unwrap();
                }
                whole.join().unwrap();
                let st = chunks.lock();
                assert!(matches!(st.chunks[0], Chunk::Present { .. }));
                assert_eq!(
                    st.present_bytes, PAGES,
                    "a page's bytes counted twice or lost"
                );
            },
            2000,
        );
    }

    #[test]
    fn an_eviction_during_a_fill_leaves_the_chunk_absent() {
        shuttle::check_random(
            || {
                let chunks = Arc::new(absent());
                let c = chunks.clone();
                let filler = thread::spawn(move || {
                    let claim = c.claim(0..1);
                    claim.mine.iter().all(|&i| c.complete(i, 0, 10))
                });
                let c = chunks.clone();
                let evict = thread::spawn(move || c.lock().evicted = true);
                let kept = filler.join().unwrap();
                evict.join().unwrap();
                let st = chunks.lock();
                // Either the fill landed before the eviction, or it is void and not present.
                if !kept {
                    assert_eq!(st.chunks[0], Chunk::Absent);
                    assert_eq!(st.present_bytes, 0);
                }
            },
            1000,
        );
    }
}
