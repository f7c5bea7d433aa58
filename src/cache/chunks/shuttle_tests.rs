//! Interleavings of claims, fills, give-ups and waits, explored by shuttle's randomized
//! scheduler (`cargo test --features shuttle --lib chunks`; scripts/test.sh runs it).

use std::time::Duration;

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
