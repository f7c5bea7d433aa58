//! The read path against an in-memory source: single flight, whole-file and ranged fills,
//! the uncached fallback, failure recovery and version checks.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::*;
use crate::cache::CacheConfig;
use crate::core::Version;
use crate::core::mem_source::MemSource;

static TEST_ID: AtomicU64 = AtomicU64::new(0);

fn reader(source: MemSource, capacity: u64) -> (Reader<MemSource>, std::path::PathBuf) {
    reader_with(source, capacity, crate::cache::MAX_PARTIAL_CHUNKS)
}

/// A reader whose cache holds at most `max_partial` partly present chunks.
fn reader_with(
    source: MemSource,
    capacity: u64,
    max_partial: u64,
) -> (Reader<MemSource>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "dyadfs-read-test-{}-{}",
        std::process::id(),
        TEST_ID.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let stats = Arc::new(Stats::default());
    let cache = Cache::open(
        &CacheConfig {
            dir: dir.clone(),
            chunk_size: 1 << 20,
            capacity: Some(capacity),
            open_files: 4,
            pack_max: 0,
            max_partial_chunks: max_partial,
        },
        stats.clone(),
    )
    .unwrap();
    let r = Reader {
        cache: Arc::new(cache),
        stats,
        source: Arc::new(source),
    };
    (r, dir)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn small_file_is_fetched_whole_then_served_locally() {
    let (r, dir) = reader(MemSource::default(), 64 << 20);
    let data = pattern(3 * (1 << 20) + 17, 1);
    let v = r.source.add("f", data.clone());
    let e = r.cache.entry("f", v).unwrap();
    assert_eq!(r.read(&e, 10, 100).unwrap(), data[10..110]);
    assert!(
        e.is_complete(),
        "a small file is fetched whole on first read"
    );
    assert_eq!(
        r.source.reads.load(Ordering::Relaxed),
        1,
        "one contiguous source read"
    );
    let tail = r.read(&e, (data.len() - 5) as u64, 4096).unwrap();
    assert_eq!(tail, data[data.len() - 5..]);
    assert!(r.read(&e, data.len() as u64 + 10, 10).unwrap().is_empty());
    assert_eq!(r.source.bytes.load(Ordering::Relaxed), data.len() as u64);
    assert_eq!(r.stats.backing_fetches.load(Ordering::Relaxed), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// A read into a large file fetches the pages it touches (a 128th of a chunk), not its chunks:
/// a record of an HDF5 or LMDB file read at random costs about its own bytes.
#[test]
fn a_large_files_read_fetches_only_the_pages_it_touches() {
    let (r, dir) = reader(MemSource::default(), 64 << 20);
    let data = pattern(20 << 20, 2);
    let v = r.source.add("big", data.clone());
    let e = r.cache.entry("big", v).unwrap();
    let (chunk, page) = (e.chunk_size(), e.page_size());
    assert_eq!(page * PAGES, chunk);
    // 20 bytes across the boundary of pages 63 and 64 of chunk 6.
    let off = 6 * chunk + chunk / 2 - 10;
    let read = |at: u64, len: u64| {
        let got = r.read(&e, at, len as u32).unwrap();
        assert!(
            got == data[at as usize..(at + len) as usize],
            "bytes at {at}"
        );
    };
    read(off, 20);
    assert_eq!(
        r.source.bytes.load(Ordering::Relaxed),
        2 * page,
        "two pages straddled"
    );
    assert!(e.bytes_present(off - 1000, off + 1000));
    assert!(!e.all_present(6..7), "the chunk is not whole");
    assert!(!e.bytes_present(off - page - 1000, off - page));
    assert!(!e.bytes_present(off + page + 1000, off + page + 2000));
    // Read again: from the cache, nothing fetched.
    read(off, 20);
    assert_eq!(r.source.bytes.load(Ordering::Relaxed), 2 * page);
    // Every page of the chunk read: the chunk is present whole, with the checksum of its bytes.
    for p in 0..PAGES {
        read(6 * chunk + p * page, page);
    }
    assert!(e.all_present(6..7));
    // Its checksum, combined from its pages', is that of its bytes.
    assert_eq!(e.recheck(&r.cache, 6..7).unwrap(), (1, 0));
    assert_eq!(r.source.bytes.load(Ordering::Relaxed), chunk);
    let _ = std::fs::remove_dir_all(dir);
}

/// A cache's page tables are bounded: past `max_partial_chunks` partly present chunks, a random
/// read of an absent chunk fills it whole; a table goes when its chunk is whole or its entry
/// leaves the cache, and the next random read takes pages again.
#[test]
fn partly_present_chunks_are_bounded_per_cache() {
    let (r, dir) = reader_with(MemSource::default(), 64 << 20, 1);
    let data = pattern(20 << 20, 3);
    let v = r.source.add("big", data.clone());
    let e = r.cache.entry("big", v).unwrap();
    let (chunk, page) = (e.chunk_size(), e.page_size());
    let fetched = || r.source.bytes.load(Ordering::Relaxed);
    let read = |at: u64, len: u64| {
        let got = r.read(&e, at, len as u32).unwrap();
        assert!(
            got == data[at as usize..(at + len) as usize],
            "bytes at {at}"
        );
    };
    read(2 * chunk + 100, 20);
    assert_eq!((fetched(), r.cache.partial_chunks()), (page, 1));
    // No room for a second table: chunk 5 is filled whole.
    read(5 * chunk + 100, 20);
    assert_eq!((fetched(), r.cache.partial_chunks()), (page + chunk, 1));
    assert!(e.all_present(5..6));
    // Chunk 2 has its table: it goes on page by page, and once whole gives the table back.
    read(2 * chunk + 3 * page, 20);
    assert_eq!(fetched(), 2 * page + chunk);
    read(2 * chunk, chunk);
    assert!(e.all_present(2..3));
    assert_eq!((fetched(), r.cache.partial_chunks()), (2 * chunk, 0));
    read(7 * chunk + 100, 20);
    assert_eq!((fetched(), r.cache.partial_chunks()), (2 * chunk + page, 1));
    // The entry leaves the cache: its tables go with it.
    r.cache.forget("big", v);
    drop(e);
    assert_eq!(r.cache.partial_chunks(), 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn concurrent_readers_of_one_chunk_cause_one_source_read() {
    let source = MemSource {
        delay: Some(Duration::from_millis(50)),
        ..Default::default()
    };
    let (r, dir) = reader(source, 64 << 20);
    let data = pattern(4 << 20, 3);
    let v = r.source.add("f", data.clone());
    let e = r.cache.entry("f", v).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (r, e, data) = (&r, &e, &data);
            s.spawn(move || {
                let off = t * 100_000;
                assert_eq!(
                    r.read(e, off, 4096).unwrap(),
                    data[off as usize..off as usize + 4096]
                );
            });
        }
    });
    assert_eq!(r.source.reads.load(Ordering::Relaxed), 1);
    assert_eq!(r.stats.bytes_from_backing.load(Ordering::Relaxed), 4 << 20);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_failed_fill_is_retried_by_the_next_reader() {
    let source = MemSource::default();
    source.fail_next.store(1, Ordering::Relaxed);
    let (r, dir) = reader(source, 64 << 20);
    let data = pattern(1000, 4);
    let v = r.source.add("f", data.clone());
    let e = r.cache.entry("f", v).unwrap();
    assert!(matches!(r.read(&e, 0, 10), Err(FillError::Source(_))));
    assert_eq!(
        r.cache.used_bytes(),
        0,
        "the failed fill's reservation is released"
    );
    assert_eq!(r.read(&e, 0, 1000).unwrap(), data);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn full_cache_of_open_files_serves_uncached() {
    let (r, dir) = reader(MemSource::default(), 2 << 20);
    let a = pattern(2 << 20, 5);
    let b = pattern(1 << 20, 6);
    let va = r.source.add("a", a.clone());
    let vb = r.source.add("b", b.clone());
    let ea = r.cache.entry("a", va).unwrap();
    ea.pin();
    assert_eq!(r.read(&ea, 0, 2 << 20).unwrap(), a);
    let eb = r.cache.entry("b", vb).unwrap();
    for _ in 0..2 {
        assert_eq!(r.read(&eb, 0, 1 << 20).unwrap(), b);
    }
    assert_eq!(r.stats.uncached_reads.load(Ordering::Relaxed), 2);
    assert!(!eb.all_present(0..1));
    // Once `a` is closed it can be evicted and `b` is cached.
    ea.unpin();
    assert_eq!(r.read(&eb, 0, 1 << 20).unwrap(), b);
    assert!(eb.is_complete());
    assert_eq!(r.stats.evictions.load(Ordering::Relaxed), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_changed_source_is_never_mixed_into_the_old_copy() {
    let (r, dir) = reader(MemSource::default(), 64 << 20);
    let v1 = r.source.add("f", pattern(20 << 20, 7));
    let e = r.cache.entry("f", v1).unwrap();
    r.read(&e, 0, 10).unwrap();
    let mut changed = pattern(20 << 20, 8);
    changed[0] = 0;
    r.source.files.lock().unwrap().insert(
        "f".into(),
        (
            Version {
                size: 20 << 20,
                mtime_ns: 2,
            },
            changed,
        ),
    );
    let err = r.read(&e, 15 << 20, 10).unwrap_err();
    assert!(
        matches!(&err, FillError::Source(e) if e.raw_os_error() == Some(libc::ESTALE)),
        "{err:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The read path and cache against a reference model (the source's bytes): random sequences of
/// reads, opens/closes (pins), restarts, on-disk corruption across a restart and source
/// rewrites, under small capacities. Every read must return the model's bytes, and the cache
/// must never exceed its capacity.
mod model {
    use proptest::prelude::*;

    use super::*;

    const SIZES: [usize; 6] = [0, 1, (1 << 20) - 1, 1 << 20, (5 << 19) + 7, (9 << 20) + 3];

    #[derive(Debug, Clone)]
    enum Op {
        Read { file: usize, at: f64, len: u32 },
        Open { file: usize },
        Close,
        Restart,
        CorruptAndRestart { file: usize, at: f64 },
        Rewrite { file: usize, size: usize, seed: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..3usize, 0.0..1.0f64, 1..3_000_000u32)
                .prop_map(|(file, at, len)| Op::Read { file, at, len }),
            2 => (0..3usize).prop_map(|file| Op::Open { file }),
            2 => Just(Op::Close),
            1 => Just(Op::Restart),
            1 => (0..3usize, 0.0..1.0f64).prop_map(|(file, at)| Op::CorruptAndRestart { file, at }),
            1 => (0..3usize, 0..SIZES.len(), any::<u8>())
                .prop_map(|(file, size, seed)| Op::Rewrite { file, size: SIZES[size], seed }),
        ]
    }

    fn open_cache(dir: &std::path::Path, capacity: u64, stats: Arc<Stats>) -> Arc<Cache> {
        let config = CacheConfig {
            dir: dir.to_path_buf(),
            chunk_size: 1 << 20,
            capacity: Some(capacity),
            open_files: 4,
            pack_max: 0,
            max_partial_chunks: crate::cache::MAX_PARTIAL_CHUNKS,
        };
        Arc::new(Cache::open(&config, stats).unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn reads_match_the_model(
            capacity in prop_oneof![Just(2u64 << 20), Just(6 << 20), Just(64 << 20)],
            sizes in proptest::collection::vec(0..SIZES.len(), 3),
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let (mut r, dir) = reader(MemSource::default(), capacity);
            let mut model: Vec<(Vec<u8>, Version)> = Vec::new();
            for (i, s) in sizes.iter().enumerate() {
                let data = pattern(SIZES[*s], i as u8);
                let v = r.source.add_version(&format!("f{i}"), data.clone(), 1);
                model.push((data, v));
            }
            let mut pinned: Vec<Arc<Entry>> = Vec::new();
            let mut mtime = 1;
            for op in ops {
                match op {
                    Op::Read { file, at, len } => {
                        let (data, v) = &model[file];
                        let e = r.cache.entry(&format!("f{file}"), *v).unwrap();
                        let off = (at * data.len() as f64) as usize;
                        let got = r.read(&e, off as u64, len).unwrap();
                        let end = (off + len as usize).min(data.len());
                        prop_assert!(got == data[off.min(end)..end], "read f{} at {} len {}", file, off, len);
                    }
                    Op::Open { file } => {
                        let e = r.cache.entry(&format!("f{file}"), model[file].1).unwrap();
                        e.pin();
                        pinned.push(e);
                    }
                    Op::Close => {
                        if let Some(e) = pinned.pop() {
                            e.unpin();
                        }
                    }
                    Op::Restart | Op::CorruptAndRestart { .. } => {
                        if let Op::CorruptAndRestart { file, at } = op {
                            let (data, v) = &model[file];
                            if !data.is_empty() {
                                let e = r.cache.entry(&format!("f{file}"), *v).unwrap();
                                let pos = ((at * data.len() as f64) as usize).min(data.len() - 1);
                                e.write_at(pos as u64, &[data[pos] ^ 0x5a]).unwrap();
                            }
                        }
                        pinned.clear();
                        let stats = Arc::new(Stats::default());
                        // The old cache (and its directory lock) goes before the new one opens.
                        let source = r.source.clone();
                        drop(r);
                        r = Reader { cache: open_cache(&dir, capacity, stats.clone()), stats, source };
                    }
                    Op::Rewrite { file, size, seed } => {
                        mtime += 1;
                        let data = pattern(size, seed);
                        let v = r.source.add_version(&format!("f{file}"), data.clone(), mtime);
                        model[file] = (data, v);
                    }
                }
                prop_assert!(r.cache.used_bytes() <= capacity, "used {} > capacity {}", r.cache.used_bytes(), capacity);
            }
            drop(pinned);
            drop(r);
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn a_batch_fills_the_files_nobody_else_fills_and_a_failed_one_is_given_back() {
    let (r, dir) = reader(MemSource::default(), 64 << 20);
    let files: Vec<(Vec<u8>, Version)> = (0..5u8)
        .map(|k| {
            let data = pattern(1000 + usize::from(k), k);
            let v = r.source.add(&format!("f{k}"), data.clone());
            (data, v)
        })
        .collect();
    let entries: Vec<Arc<Entry>> = (0..5)
        .map(|k| r.cache.entry(&format!("f{k}"), files[k].1).unwrap())
        .collect();
    // f1 is being filled by another reader; f3 is cached already; the next read fails (f0's).
    let other = entries[1].claim(0..1);
    assert_eq!(other.mine, [0]);
    assert_eq!(r.read(&entries[3], 0, 10).unwrap(), files[3].0[..10]);
    r.source.fail_next.store(1, Ordering::Relaxed);
    let before = r.source.reads.load(Ordering::Relaxed);
    assert_eq!(r.fill_batch(&entries), 2);
    assert_eq!(r.source.reads.load(Ordering::Relaxed) - before, 2);
    for k in [2, 4] {
        assert!(entries[k].is_complete());
        assert_eq!(r.read(&entries[k], 0, 4096).unwrap(), files[k].0);
    }
    // The failed one is absent again (its reservation given back), the other filler's untouched.
    assert!(!entries[0].is_complete());
    assert_eq!(entries[0].claim(0..1).mine, [0]);
    entries[0].abandon(0);
    assert!(!entries[1].is_complete());
    entries[1].abandon(0);
    let held: u64 = [2, 3, 4].iter().map(|&k| files[k].1.size).sum();
    assert_eq!(r.cache.used_bytes(), held);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_read_that_fills_is_served_from_the_fill_byte_exact() {
    // Whole-file fills of a 3-chunk file, each read asking for another range of it: the
    // filling read's bytes are the fill's own, then the cache's.
    let data = pattern(3 * (1 << 20) + 17, 7);
    let ranges = [
        (0, 4096),
        (10, 100),
        ((1 << 20) - 5, 10),
        (2 << 20, 1 << 20),
        (3 << 20, 17),
        ((3 << 20) + 10, 4096),
    ];
    for (offset, len) in ranges {
        let (r, dir) = reader(MemSource::default(), 64 << 20);
        let v = r.source.add("f", data.clone());
        let e = r.cache.entry("f", v).unwrap();
        let end = (offset + len as usize).min(data.len());
        assert_eq!(r.read(&e, offset as u64, len).unwrap(), data[offset..end]);
        assert!(e.is_complete());
        assert_eq!(
            r.stats.bytes_from_local.load(Ordering::Relaxed),
            (end - offset) as u64
        );
        assert_eq!(r.read(&e, offset as u64, len).unwrap(), data[offset..end]);
        assert_eq!(r.source.reads.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn kept_bytes_are_whole_only_when_pieces_cover_the_range_in_order() {
    let data = pattern(300, 3);
    // In order, in pieces straddling the range's ends.
    let mut k = Kept::new(50, 250);
    k.take(0, &data[0..100]);
    k.take(100, &data[100..200]);
    k.take(200, &data[200..300]);
    assert_eq!(k.whole().unwrap(), data[50..250]);
    // A piece missing in the middle.
    let mut k = Kept::new(50, 250);
    k.take(0, &data[0..100]);
    k.take(200, &data[200..300]);
    assert!(k.whole().is_none());
    // Out of order: the later piece first is not taken, so the range stays unwhole.
    let mut k = Kept::new(0, 200);
    k.take(100, &data[100..200]);
    k.take(0, &data[0..100]);
    assert!(k.whole().is_none());
    // A piece handed twice (a retried one) copies nothing new.
    let mut k = Kept::new(0, 200);
    k.take(0, &data[0..100]);
    k.take(0, &data[0..100]);
    k.take(100, &data[100..200]);
    assert_eq!(k.whole().unwrap(), data[0..200]);
    // Pieces outside the range.
    let mut k = Kept::new(100, 150);
    k.take(0, &data[0..100]);
    k.take(150, &data[150..300]);
    assert!(k.whole().is_none());
}

/// A reader waits for a background copy's claim (replication) a moment only: its holder may be
/// frozen, a timeout the reader would not meet. Then it reads around it, uncached, whole file
/// or pages (a reader's claim is waited for as long as single flight needs).
#[test]
fn a_reader_reads_around_a_background_copy_instead_of_waiting() {
    let (r, dir) = reader(MemSource::default(), 64 << 20);
    let r = Arc::new(r);
    let small = pattern(100_000, 7);
    let large = pattern(12 << 20, 8);
    let vs = r.source.add("small", small.clone());
    let vl = r.source.add("large", large.clone());
    let es = r.cache.entry("small", vs).unwrap();
    let el = r.cache.entry("large", vl).unwrap();
    // A copy claims them and stalls (as on a frozen holder).
    for e in [&es, &el] {
        e.set_copying(true);
        assert!(!e.claim(0..e.chunk_count()).mine.is_empty());
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let (reader, es2, el2) = (r.clone(), es.clone(), el.clone());
    std::thread::spawn(move || {
        let a = reader.read(&es2, 0, 100_000).map(|b| b.to_vec());
        let b = reader.read(&el2, 5 << 20, 64 << 10).map(|b| b.to_vec());
        let _ = tx.send((a, b));
    });
    let (a, b) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the reads waited for the copy");
    assert_eq!(a.unwrap(), small);
    assert_eq!(b.unwrap(), &large[5 << 20..(5 << 20) + (64 << 10)]);
    assert_eq!(r.stats.uncached_reads.load(Ordering::Relaxed), 2);
    let _ = std::fs::remove_dir_all(dir);
}
