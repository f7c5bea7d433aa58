use super::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use super::chunks::Chunk;

fn setup(capacity: u64) -> (PathBuf, CacheConfig, Arc<Stats>) {
    let dir = std::env::temp_dir().join(format!(
        "dyadfs-cache-test-{}-{}",
        std::process::id(),
        TEST_ID.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    let config = CacheConfig {
        dir: dir.clone(),
        chunk_size: 1 << 20,
        capacity: Some(capacity),
        open_files: 4,
        pack_max: 0,
        max_partial_chunks: crate::cache::MAX_PARTIAL_CHUNKS,
    };
    (dir, config, Arc::new(Stats::default()))
}

static TEST_ID: AtomicU64 = AtomicU64::new(0);

fn v(size: u64) -> Version {
    Version { size, mtime_ns: 42 }
}

/// Fills every chunk of an entry with `byte` (as the read path would).
fn fill(cache: &Cache, e: &Entry, byte: u8) {
    fill_with(cache, e, &vec![byte; e.version.size as usize]);
}

/// Fills every chunk of an entry with its bytes in `data` (as the read path would).
fn fill_with(cache: &Cache, e: &Entry, data: &[u8]) {
    let claim = e.claim(0..e.chunk_count());
    let bytes: u64 = claim.mine.iter().map(|&i| e.chunk_len(i)).sum();
    assert!(cache.reserve(e, bytes));
    for i in claim.mine {
        let at = (i * cache.chunk_size()) as usize;
        let chunk = &data[at..at + e.chunk_len(i) as usize];
        e.write_at(at as u64, chunk).unwrap();
        assert!(e.complete(i, crc32c::crc32c(chunk)));
    }
    e.persist().unwrap();
}

/// Fills pages `pages` of chunk `idx` of an entry (as a random read would), none of them
/// claimed by anyone else; not persisted.
fn fill_pages(cache: &Cache, e: &Entry, idx: u64, pages: PageMask) {
    assert_eq!(e.claim_pages(idx, pages).mine, pages);
    let page = e.page_size();
    assert!(cache.reserve(e, u64::from(pages.count_ones()) * page));
    let mut crcs = [0u32; PAGES as usize];
    for p in (0..PAGES).filter(|p| pages & (1 << p) != 0) {
        let bytes = vec![p as u8 + 1; page as usize];
        e.write_at(idx * cache.chunk_size() + p * page, &bytes)
            .unwrap();
        crcs[p as usize] = crc32c::crc32c(&bytes);
    }
    assert!(e.complete_pages(idx, pages, &crcs));
}

/// Writes an entry's data file back and drops it from the page cache, so that reads of it
/// come from the disk.
fn drop_pages(e: &Entry) {
    let file = e.data_file().unwrap();
    file.sync_all().unwrap();
    // SAFETY: advice on a file descriptor we own; no memory is involved.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// The data file of "a", `size` bytes of 7 filled through a cache that is then closed.
fn filled_data_file(config: &CacheConfig, stats: &Arc<Stats>, size: u64) -> PathBuf {
    let cache = Cache::open(config, stats.clone()).unwrap();
    let a = cache.entry("a", v(size)).unwrap();
    fill(&cache, &a, 7);
    a.data_path()
}

/// Changes the byte at `at` of a data file behind the cache's back (to 8).
fn flip_byte(data_path: &Path, at: u64) {
    write_byte(data_path, at, 8);
}

/// Writes `byte` at `at` of a data file behind the cache's back.
fn write_byte(data_path: &Path, at: u64, byte: u8) {
    let f = OpenOptions::new().write(true).open(data_path).unwrap();
    f.write_all_at(&[byte], at).unwrap();
}

#[test]
fn checksum_failure_drops_the_chunk() {
    let (dir, config, stats) = setup(100 << 20);
    let data_path = filled_data_file(&config, &stats, 2 << 20);
    // Flip one byte of the second chunk behind the cache's back.
    flip_byte(&data_path, (1 << 20) + 5);
    let cache = Cache::open(&config, stats.clone()).unwrap();
    let a = cache.entry("a", v(2 << 20)).unwrap();
    assert!(!a.verify(&cache, 0..2).unwrap());
    assert!(a.all_present(0..1));
    assert!(!a.all_present(1..2));
    assert_eq!(cache.used_bytes(), 1 << 20);
    assert_eq!(stats.checksum_failures.load(Ordering::Relaxed), 1);
    let _ = fs::remove_dir_all(dir);
}

/// A data file changed behind the cache after a bad chunk of it was dropped and filled again is
/// not taken as verified: the fill that completed it remembered the file's ctime, which the
/// change moved (it used to be taken at the next open, after the change, which it then hid).
#[test]
fn a_file_changed_after_its_repair_is_checked_again() {
    let (dir, config, stats) = setup(100 << 20);
    let data_path = filled_data_file(&config, &stats, 2 << 20);
    flip_byte(&data_path, (1 << 20) + 5);
    let cache = Cache::open(&config, stats.clone()).unwrap();
    let a = cache.entry("a", v(2 << 20)).unwrap();
    assert!(!a.is_verified());
    assert!(!a.verify(&cache, 0..2).unwrap());
    // Repaired; no open asks before the change (one that did would remember the file first).
    fill(&cache, &a, 7);
    // (Past the file system's timestamp granularity where it is coarse.)
    std::thread::sleep(std::time::Duration::from_millis(20));
    flip_byte(&data_path, 5);
    assert!(!a.is_verified(), "the change after the repair went unseen");
    assert!(!a.verify(&cache, 0..2).unwrap());
    assert!(!a.all_present(0..1) && a.all_present(1..2));
    assert_eq!(stats.checksum_failures.load(Ordering::Relaxed), 2);
    let _ = fs::remove_dir_all(dir);
}

/// A change to a chunk verified earlier is seen by the verification of the others: it used to
/// find that chunk verified, take the file's print as it was after the change and remember it
/// as the verified file's, so the next open handed the changed file to the kernel (a chaos
/// soak read wrong bytes of a 24 MiB file: one open's reads verified some chunks, the byte
/// changed, the background verification of the next open did the rest).
#[test]
fn a_change_to_a_chunk_verified_earlier_is_not_hidden_by_the_rest() {
    let (dir, config, stats) = setup(100 << 20);
    let cache = Cache::open(&config, stats.clone()).unwrap();
    let a = cache.entry("a", v(4 << 20)).unwrap();
    fill(&cache, &a, 7);
    let data_path = a.data_path();
    // The file is touched behind the cache (its bytes as they were): the next open rechecks.
    std::thread::sleep(Duration::from_millis(20));
    write_byte(&data_path, (2 << 20) + 5, 7);
    assert!(!a.is_verified());
    // That open's reads verify the first chunk...
    assert!(a.verify_bytes(&cache, 0, 1 << 20).unwrap());
    // ...which changes before the rest is verified (in the background).
    std::thread::sleep(Duration::from_millis(20));
    flip_byte(&data_path, 5);
    a.verify(&cache, 1..4).unwrap();
    assert!(!a.is_verified(), "a changed chunk was vouched for");
    assert!(!a.verify(&cache, 0..4).unwrap());
    assert!(!a.all_present(0..1) && a.all_present(1..4));
    assert_eq!(stats.checksum_failures.load(Ordering::Relaxed), 1);
    let _ = fs::remove_dir_all(dir);
}

/// A peer is served only verified bytes: after a restart, the bytes read for it are checked
/// against the stored checksums and a corrupt chunk is dropped instead of sent.
#[test]
fn bytes_read_for_a_peer_are_verified_on_the_way() {
    let (dir, config, stats) = setup(100 << 20);
    let data_path = filled_data_file(&config, &stats, 3 << 20);
    flip_byte(&data_path, (1 << 20) + 5);
    let cache = Cache::open(&config, stats.clone()).unwrap();
    let a = cache.entry("a", v(3 << 20)).unwrap();
    let mut buf = vec![0; 1 << 20];
    assert!(a.read_verified(&cache, 0, &mut buf, 1 << 20).unwrap());
    assert!(buf.iter().all(|&b| b == 7));
    let mut two = vec![0; 2 << 20];
    assert!(!a.read_verified(&cache, 1 << 20, &mut two, 2 << 20).unwrap());
    assert!(!a.all_present(1..2), "the corrupt chunk is dropped");
    assert!(a.all_present(2..3));
    assert_eq!(stats.checksum_failures.load(Ordering::Relaxed), 1);
    // A partial chunk is checked through verify; an absent one is refused.
    let mut tail = vec![0; 4096];
    assert!(a.read_verified(&cache, 2 << 20, &mut tail, 4096).unwrap());
    assert!(!a.read_verified(&cache, 1 << 20, &mut tail, 4096).unwrap());
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn lru_eviction_spares_open_files() {
    let (dir, config, stats) = setup(3 << 20);
    let cache = Cache::open(&config, stats.clone()).unwrap();
    let a = cache.entry("a", v(1 << 20)).unwrap();
    fill(&cache, &a, 1);
    let b = cache.entry("b", v(1 << 20)).unwrap();
    fill(&cache, &b, 2);
    let c = cache.entry("c", v(1 << 20)).unwrap();
    fill(&cache, &c, 3);
    a.pin(); // a is open and the oldest: b must go instead
    let d = cache.entry("d", v(1 << 20)).unwrap();
    fill(&cache, &d, 4);
    assert!(!a.is_evicted());
    assert!(b.is_evicted());
    assert!(!b.data_path().exists());
    assert_eq!(stats.evictions.load(Ordering::Relaxed), 1);
    assert_eq!(cache.used_bytes(), 3 << 20);
    // Everything else open too: nothing can be evicted, the reservation is refused.
    c.pin();
    d.pin();
    let e = cache.entry("e", v(1 << 20)).unwrap();
    assert!(!cache.reserve(&e, 1 << 20));
    assert_eq!(cache.used_bytes(), 3 << 20);
    let _ = fs::remove_dir_all(dir);
}

/// A capacity lowered while the cache holds more (the node service giving a new dataset its
/// share) evicts the least recently used files over it at once, never an open one; raised
/// again, it takes more.
#[test]
fn a_lowered_capacity_evicts_down_to_it() {
    let (dir, config, stats) = setup(4 << 20);
    let cache = Cache::open(&config, stats.clone()).unwrap();
    let files: Vec<_> = (0..4u8)
        .map(|i| {
            let e = cache.entry(&format!("f{i}"), v(1 << 20)).unwrap();
            fill(&cache, &e, i);
            e
        })
        .collect();
    files[0].pin();
    cache.set_capacity(2 << 20);
    assert_eq!(cache.capacity(), 2 << 20);
    assert_eq!(cache.used_bytes(), 2 << 20);
    assert!(!files[0].is_evicted(), "open: kept");
    assert!(files[1].is_evicted() && files[2].is_evicted());
    assert!(!files[3].is_evicted());
    cache.set_capacity(3 << 20);
    let e = cache.entry("g", v(1 << 20)).unwrap();
    fill(&cache, &e, 9);
    assert_eq!(cache.used_bytes(), 3 << 20);
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_new_version_replaces_the_old_copy() {
    let (dir, config, stats) = setup(100 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let old = cache.entry("a", v(1 << 20)).unwrap();
    fill(&cache, &old, 1);
    let new = cache
        .entry(
            "a",
            Version {
                size: 1 << 20,
                mtime_ns: 43,
            },
        )
        .unwrap();
    assert!(old.is_evicted());
    assert!(!new.all_present(0..1));
    assert_eq!(cache.used_bytes(), 0);
    let _ = fs::remove_dir_all(dir);
}

/// Chunks a peer asks for that are not in the page cache are read directly from the disk
/// into the (block-aligned) slot, rounded up to whole blocks: the bytes must be the same.
#[test]
fn cold_chunks_read_for_a_peer_are_exact() {
    let (dir, config, stats) = setup(100 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let size = (1 << 20) + 100;
    let a = cache.entry("a", v(size)).unwrap();
    let bytes: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
    fill_with(&cache, &a, &bytes);
    // Out of the page cache: written back, then dropped.
    drop_pages(&a);
    // Block-aligned memory, as a registered slot is.
    let mut room = super::mapping::Aligned::zeroed(1 << 20);
    let slot = room.room();
    assert!(a.read_verified(&cache, 0, slot, 1 << 20).unwrap());
    assert!(slot[..] == bytes[..1 << 20]);
    assert!(a.read_verified(&cache, 1 << 20, slot, 100).unwrap());
    assert!(slot[..100] == bytes[1 << 20..]);
    // Whole chunks are served with their stored checksum...
    assert_eq!(
        a.chunk_crc(0, 1 << 20),
        Some(crc32c::crc32c(&bytes[..1 << 20]))
    );
    assert_eq!(
        a.chunk_crc(1 << 20, 100),
        Some(crc32c::crc32c(&bytes[1 << 20..]))
    );
    assert_eq!(a.chunk_crc(0, 4096), None);
    // ...so bytes damaged on disk after their check no longer match it at the puller.
    a.write_at(10, &[bytes[10] ^ 1]).unwrap();
    assert!(a.read_verified(&cache, 0, slot, 1 << 20).unwrap());
    assert_ne!(
        Some(crc32c::crc32c(&slot[..1 << 20])),
        a.chunk_crc(0, 1 << 20)
    );
    let _ = fs::remove_dir_all(dir);
}

/// Many more entries than open descriptors: every one is written and read back byte-exact,
/// and an entry that left the cache never reopens its slot's path (a newcomer's file).
#[test]
fn more_entries_than_descriptors_and_dropped_entries_stay_closed() {
    let (dir, config, stats) = setup(100 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let entries: Vec<_> = (0..64u8)
        .map(|i| {
            let e = cache.entry(&format!("f{i}"), v(100)).unwrap();
            fill(&cache, &e, i);
            e
        })
        .collect();
    for (i, e) in entries.iter().enumerate() {
        assert!(e.verify(&cache, 0..1).unwrap());
        assert!(e.read_bytes(0, 100, None).unwrap() == vec![i as u8; 100]);
    }
    cache.shared.files.shed();
    assert_eq!(cache.open_files(), 0);
    let old = entries[0].clone();
    cache.forget("f0", v(100));
    let new = cache.entry("f0", v(100)).unwrap();
    fill(&cache, &new, 99);
    cache.shared.files.shed();
    let e = old.write_at(0, b"stale").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
    assert!(new.read_bytes(0, 100, None).unwrap() == vec![99; 100]);
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn an_entry_stays_in_its_malloc_size_class() {
    // 104 bytes + the Arc's two counts = 120, which malloc serves from 128-byte chunks; 8 more
    // bytes would cost 16 per cached file (16 MB a million).
    assert!(std::mem::size_of::<super::entry::Entry>() <= 104);
}

#[test]
fn ages_survive_the_tick_counter_wrapping() {
    let (dir, config, stats) = setup(1 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let e = cache.entry("a", v(1)).unwrap();
    e.touch(u64::from(u32::MAX) - 1);
    // Two ticks later, across the wrap of the 32-bit field.
    assert_eq!(e.age(u64::from(u32::MAX) + 1), 2);
    // Touched after the scan read the tick: just used, not the oldest.
    e.touch(100);
    assert_eq!(e.age(99), 0);
    drop(cache);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn an_entry_idle_for_billions_of_ticks_stays_the_oldest() {
    let (dir, config, stats) = setup(1 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let idle = cache.entry("idle", v(1)).unwrap();
    // Every 2^28 ticks some file is opened; "idle" never is again, for 2^33 ticks.
    for _ in 0..32 {
        cache.shared.tick.fetch_add(1 << 28, Ordering::Relaxed);
        cache.entry("busy", v(1)).unwrap();
    }
    let now = cache.shared.tick.load(Ordering::Relaxed);
    let busy = cache.entry("busy", v(1)).unwrap();
    assert!(
        idle.age(now) >= 1 << 30,
        "idle reads as age {}",
        idle.age(now)
    );
    assert!(busy.age(now) < idle.age(now));
    drop(cache);
    let _ = fs::remove_dir_all(&dir);
}

/// Entries are created outside the index's lock: threads asking for the same file at once
/// share one entry, and a sweep running meanwhile never deletes a data file being created.
#[test]
fn concurrent_creations_share_entries_and_survive_a_sweep() {
    let (dir, config, stats) = setup(100 << 20);
    let cache = Arc::new(Cache::open(&config, stats).unwrap());
    let sweeping = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sweeper = {
        let (cache, sweeping) = (cache.clone(), sweeping.clone());
        std::thread::spawn(move || {
            while sweeping.load(Ordering::Relaxed) {
                cache.sweep_orphans().unwrap();
            }
        })
    };
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let cache = cache.clone();
            std::thread::spawn(move || {
                (0..200)
                    .map(|i| cache.entry(&format!("f{i}"), v(4096)).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let all: Vec<Vec<Arc<Entry>>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    sweeping.store(false, Ordering::Relaxed);
    sweeper.join().unwrap();
    for (i, first) in all[0].iter().enumerate() {
        for other in &all[1..] {
            assert!(Arc::ptr_eq(first, &other[i]), "f{i} was created twice");
        }
        assert!(
            first.data_path().exists(),
            "the sweep deleted f{i}'s data file"
        );
        fill(&cache, first, i as u8);
    }
    assert_eq!(cache.cached_files(), 200);
    let _ = fs::remove_dir_all(dir);
}

/// Daemon-served reads of bytes not in the page cache go straight from the disk into aligned
/// memory (O_DIRECT); reads of cached bytes, and unaligned ones, through the page cache. Either
/// way every byte is the file's.
#[test]
fn reads_for_readers_are_byte_exact_cached_or_not() {
    let (dir, config, stats) = setup(100 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let size = (3 << 20) + 123;
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
    let e = cache.entry("p", v(size as u64)).unwrap();
    fill_with(&cache, &e, &data);
    let ranges = [
        (0, 4096),
        (3 * 4096, 100_000),
        (1 << 20, 1 << 20),
        (3 << 20, 123),
        (5, 77),
    ];
    for pass in ["cold", "cached"] {
        if pass == "cold" {
            drop_pages(&e);
        }
        for (off, len) in ranges {
            let got = e.read_bytes(off as u64, len, None).unwrap();
            assert!(*got == data[off..off + len], "{pass} read at {off}+{len}");
        }
    }
    let _ = fs::remove_dir_all(dir);
}

/// Adopts `file` as `path` on a thread of its own; its result, or `None` after `within`.
fn adopt_within(
    cache: &Arc<Cache>,
    path: &str,
    version: Version,
    file: PathBuf,
    within: Duration,
) -> Option<Result<Arc<Entry>, CacheError>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (cache, path) = (cache.clone(), path.to_string());
    std::thread::spawn(move || {
        let _ = tx.send(cache.adopt(&path, version, &file));
    });
    rx.recv_timeout(within).ok()
}

/// A sparse produced file is sealed without a pass over its holes: 1 TiB holding 4 bytes is
/// checksummed in moments, not in the minutes its zeros would take.
#[test]
fn adopting_a_sparse_file_reads_only_its_data() {
    let (dir, config, stats) = setup(2 << 40);
    let cache = Arc::new(Cache::open(&config, stats).unwrap());
    let staged = dir.join("staged");
    let f = File::create(&staged).unwrap();
    f.write_all_at(b"data", (5 << 20) + 7).unwrap();
    f.set_len(1 << 40).unwrap();
    let e = adopt_within(&cache, "o", v(1 << 40), staged, Duration::from_secs(10))
        .expect("sealed within 10 s")
        .unwrap();
    assert!(e.is_complete());
    let mut chunk = vec![0; 1 << 20];
    let zeros = crc32c::crc32c(&chunk);
    chunk[7..11].copy_from_slice(b"data");
    let st = e.state.lock();
    assert_eq!(st.chunks.len(), 1 << 20);
    for (i, c) in st.chunks.iter().enumerate() {
        let crc = if i == 5 {
            crc32c::crc32c(&chunk)
        } else {
            zeros
        };
        assert_eq!(
            *c,
            Chunk::Present {
                crc,
                verified: true
            },
            "chunk {i}"
        );
    }
}

/// A file larger than the cache may hold is refused (ENOSPC) before any pass over its bytes,
/// and the cache's bytes stay within its capacity.
#[test]
fn adopting_a_file_larger_than_the_capacity_fails_at_once() {
    let (dir, config, stats) = setup(8 << 20);
    let cache = Arc::new(Cache::open(&config, stats).unwrap());
    let staged = dir.join("staged");
    File::create(&staged).unwrap().set_len(1 << 40).unwrap();
    let r = adopt_within(&cache, "o", v(1 << 40), staged, Duration::from_secs(10))
        .expect("refused within 10 s");
    let e = io::Error::from(r.err().expect("refused"));
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert!(cache.used_bytes() <= 8 << 20);
    assert!(cache.lookup("o", v(1 << 40)).is_none());
}

#[test]
fn events_go_to_one_reader_complete_copies_first() {
    let (dir, config, stats) = setup(100 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let held = cache.entry("held", v(1 << 20)).unwrap();
    fill(&cache, &held, 1);
    let partial = cache.entry("partial", v(2 << 20)).unwrap();
    let mut events = cache.take_events().expect("the first reader");
    assert!(
        cache.take_events().is_none(),
        "a second reader gets nothing"
    );
    let complete = |path: &str, version| CacheEvent::Complete {
        path: path.into(),
        version,
    };
    assert_eq!(events.try_recv(), Some(complete("held", v(1 << 20))));
    assert_eq!(events.try_recv(), None, "a partial copy is not told");
    fill(&cache, &partial, 2);
    cache.filled(&partial);
    assert_eq!(events.try_recv(), Some(complete("partial", v(2 << 20))));
    cache.forget("held", v(1 << 20));
    assert_eq!(
        events.try_recv(),
        Some(CacheEvent::Dropped {
            path: "held".into(),
            version: v(1 << 20)
        })
    );
    let _ = fs::remove_dir_all(dir);
}

/// The copies held when the events are taken are told as they are read, never a copy's
/// `Complete` after its `Dropped`: one dropped before it is read is not told (its `Dropped`
/// is), one dropped after is told, then dropped; and the changes come first.
#[test]
fn held_copies_are_told_as_they_are_read_never_after_their_drop() {
    let (dir, config, stats) = setup(100 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let e = cache.entry(name, v(1 << 20)).unwrap();
        fill(&cache, &e, i as u8 + 1);
    }
    let mut events = cache.take_events().unwrap();
    assert_eq!(events.backlog(), 3);
    cache.forget("b", v(1 << 20));
    let dropped = |p: &str| CacheEvent::Dropped {
        path: p.into(),
        version: v(1 << 20),
    };
    assert_eq!(events.try_recv(), Some(dropped("b")), "a change first");
    let first = events.try_recv().unwrap();
    let CacheEvent::Complete { path, .. } = &first else {
        panic!("{first:?}")
    };
    assert_ne!(path, "b", "a copy dropped before it was read is not told");
    let told = path.clone();
    cache.forget(&told, v(1 << 20));
    let mut rest: Vec<CacheEvent> = std::iter::from_fn(|| events.try_recv()).collect();
    assert_eq!(rest.remove(0), dropped(&told), "its drop is told after it");
    let left = ["a", "c"].into_iter().find(|p| *p != told).unwrap();
    assert_eq!(
        rest,
        [CacheEvent::Complete {
            path: left.into(),
            version: v(1 << 20)
        }]
    );
    assert_eq!(events.backlog(), 0);
    let _ = fs::remove_dir_all(dir);
}

#[path = "restart_tests.rs"]
mod restart;
#[path = "segment_tests.rs"]
mod segments;

/// A cache of no capacity (a nearly full file system, no --capacity) makes nothing per file
/// read: no data file, no entry; reads through such an entry are served uncached.
#[test]
fn a_cache_of_no_capacity_makes_no_file_per_read() {
    let (dir, config, stats) = setup(0);
    let cache = Cache::open(&config, stats).unwrap();
    for i in 0..8 {
        let e = cache.entry_or_uncached(&format!("f{i}"), v(4096));
        assert!(e.is_evicted(), "an entry outside the cache");
        assert!(!cache.reserve(&e, 4096));
    }
    assert_eq!(cache.index.lock().entries().count(), 0, "entries made");
    let files = fs::read_dir(dir.join("data"))
        .map(|d| {
            d.flat_map(|e| fs::read_dir(e.unwrap().path()).unwrap())
                .count()
        })
        .unwrap_or(0);
    assert_eq!(files, 0, "data files made");
    let _ = fs::remove_dir_all(&dir);
}
