//! The chunks' state machine of one cached file: Absent -> Filling (claimed by one filler:
//! single flight) -> Present, and back to Absent when a filler gives up or the entry left the
//! cache. Readers that find a chunk being filled wait for it (bounded). The lock and condition
//! variable come from [`crate::core::sync::model`], so `--features shuttle` explores the
//! interleavings of claims, fills and waits (tests below).

use std::ops::Range;
use std::time::{Duration, Instant};

use crate::core::sync::model::{Condvar, Mutex, MutexGuard};

/// How long a reader waits for another reader's fill of the same chunk before giving up.
pub(super) const FILL_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunk {
    Absent,
    Filling,
    Present { crc: u32, verified: bool },
}

/// An entry's chunks: most training samples are one chunk, kept inline (a million cached files
/// should not mean a million extra allocations).
pub(super) enum Chunks {
    One([Chunk; 1]),
    Many(Box<[Chunk]>),
}

impl From<Vec<Chunk>> for Chunks {
    fn from(v: Vec<Chunk>) -> Chunks {
        match v[..] {
            [one] => Chunks::One([one]),
            _ => Chunks::Many(v.into_boxed_slice()),
        }
    }
}

impl std::ops::Deref for Chunks {
    type Target = [Chunk];
    fn deref(&self) -> &[Chunk] {
        match self {
            Chunks::One(c) => c,
            Chunks::Many(c) => c,
        }
    }
}

impl std::ops::DerefMut for Chunks {
    fn deref_mut(&mut self) -> &mut [Chunk] {
        match self {
            Chunks::One(c) => c,
            Chunks::Many(c) => c,
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
}

/// The outcome of claiming a range of chunks.
pub struct Claim {
    /// Chunks this caller must fill (now `Filling`).
    pub mine: Vec<u64>,
    /// Whether other fillers hold chunks of the range.
    pub others: bool,
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
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims every absent chunk of `range` for the caller to fill.
    pub(super) fn claim(&self, range: Range<u64>) -> Claim {
        let mut st = self.lock();
        let mut claim = Claim {
            mine: Vec::new(),
            others: false,
        };
        for i in range {
            match st.chunks[i as usize] {
                Chunk::Absent => {
                    st.chunks[i as usize] = Chunk::Filling;
                    claim.mine.push(i);
                }
                Chunk::Filling => claim.others = true,
                Chunk::Present { .. } => {}
            }
        }
        claim
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
        self.filled.notify_all();
        kept
    }

    /// Gives back a claimed chunk that could not be filled; waiters retry it themselves.
    pub(super) fn abandon(&self, idx: u64) {
        self.lock().chunks[idx as usize] = Chunk::Absent;
        self.filled.notify_all();
    }

    /// Waits up to `wait` until no chunk of `range` is being filled by someone else; `false` if
    /// that time passed first.
    pub(super) fn wait_fills(&self, range: Range<u64>, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut st = self.lock();
        while st.chunks[range.start as usize..range.end as usize].contains(&Chunk::Filling) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .filled
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    pub(super) fn all_present(&self, range: Range<u64>) -> bool {
        let st = self.lock();
        st.chunks[range.start as usize..range.end as usize]
            .iter()
            .all(|c| matches!(c, Chunk::Present { .. }))
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
