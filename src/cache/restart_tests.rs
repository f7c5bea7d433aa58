//! The cache across restarts: what a restart finds of complete and partial entries, crash
//! leftovers, a corrupt or rewritten header log, tombstones, and data files gone meanwhile.

use super::*;

#[test]
fn reload_after_restart_keeps_complete_and_partial_entries() {
    let (dir, config, stats) = setup(100 << 20);
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        let a = cache.entry("a", v(3 << 20)).unwrap();
        fill(&cache, &a, 1);
        let b = cache.entry("dir/b", v(3 << 20)).unwrap();
        let claim = b.claim(1..2);
        assert_eq!(claim.mine, vec![1]);
        assert!(cache.reserve(&b, 1 << 20));
        let buf = vec![2u8; 1 << 20];
        b.write_at(1 << 20, &buf).unwrap();
        b.complete(1, crc32c::crc32c(&buf));
        b.persist().unwrap();
        assert_eq!(cache.used_bytes(), 4 << 20);
        // A second daemon on the same directory is refused.
        assert!(matches!(
            Cache::open(&config, stats.clone()),
            Err(CacheError::Locked(_))
        ));
    }
    let cache = Cache::open(&config, stats).unwrap();
    assert_eq!(cache.used_bytes(), 4 << 20);
    assert_eq!(cache.cached_files(), 2);
    let a = cache.entry("a", v(3 << 20)).unwrap();
    assert!(a.is_complete());
    assert!(a.verify(&cache, 0..3).unwrap());
    let b = cache.entry("dir/b", v(3 << 20)).unwrap();
    assert!(!b.is_complete());
    assert!(b.all_present(1..2));
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn crash_leftovers_are_discarded() {
    let (dir, config, stats) = setup(100 << 20);
    let (a_data, orphan_data) = {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        let a = cache.entry("a", v(1 << 20)).unwrap();
        fill(&cache, &a, 1);
        // Data written but never recorded in a header: a fill cut short by a crash.
        let orphan = cache.entry("orphan", v(10)).unwrap();
        orphan.write_at(0, b"0123456789").unwrap();
        (a.data_path(), orphan.data_path())
    };
    let stray = a_data.with_extension("meta.tmp");
    fs::write(&stray, b"foreign").unwrap();
    let log = dir.join("index.log");
    let cache = Cache::open(&config, stats.clone()).unwrap();
    assert_eq!(cache.sweep_orphans().unwrap(), 2);
    assert_eq!(cache.cached_files(), 1);
    assert!(!stray.exists() && !orphan_data.exists());
    // A record torn by a crash mid-append is ignored: the entry it described is dropped.
    let a = cache.entry("a", v(1 << 20)).unwrap();
    a.persist().unwrap();
    drop((a, cache));
    let bytes = fs::read(&log).unwrap();
    let one_record = bytes.len() / 2 - 6;
    fs::write(&log, &bytes[..bytes.len() - one_record - 3]).unwrap();
    let cache = Cache::open(&config, stats).unwrap();
    assert_eq!(cache.cached_files(), 0);
    assert_eq!(cache.used_bytes(), 0);
    cache.sweep_orphans().unwrap();
    assert!(!a_data.exists());
    let _ = fs::remove_dir_all(dir);
}

/// A corrupt record in the middle of the header log (a bad sector, not a crash) loses only
/// the entry it described: the entries recorded after it are reloaded and served.
#[test]
fn a_corrupt_record_mid_log_keeps_the_entries_after_it() {
    let (dir, config, stats) = setup(100 << 20);
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        for (p, byte) in [("a", 1), ("b", 2), ("c", 3)] {
            let e = cache.entry(p, v(1 << 20)).unwrap();
            fill(&cache, &e, byte);
        }
    }
    // The log as rewritten at the last start holds a, b, c in some order: corrupt the second
    // record's payload.
    let log = dir.join("index.log");
    let bytes = fs::read(&log).unwrap();
    let records = journal::decode(&bytes);
    assert_eq!(records.len(), 3);
    let first_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize + 4;
    let mut bad = bytes.clone();
    bad[12 + first_len + 10] ^= 0xff;
    fs::write(&log, &bad).unwrap();
    let lost = match &records[1] {
        journal::Record::Put(h) => h.path.clone(),
        other => panic!("{other:?}"),
    };
    let cache = Cache::open(&config, stats).unwrap();
    assert_eq!(
        cache.cached_files(),
        2,
        "the entries after the bad record are kept"
    );
    for (p, byte) in [("a", 1u8), ("b", 2), ("c", 3)] {
        let kept = cache.lookup(p, v(1 << 20));
        if *p == *lost {
            assert!(kept.is_none());
            continue;
        }
        let e = kept.unwrap_or_else(|| panic!("{p} was lost"));
        let mut buf = vec![0; 1 << 20];
        assert!(e.read_verified(&cache, 0, &mut buf, 1 << 20).unwrap());
        assert!(buf.iter().all(|&b| b == byte));
    }
    let _ = fs::remove_dir_all(dir);
}

/// A dropped entry stays dropped across a restart, even when another path took its data file.
#[test]
fn tombstones_and_slot_takeovers_survive_a_restart() {
    let (dir, config, stats) = setup(100 << 20);
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        let a = cache.entry("a", v(1 << 20)).unwrap();
        fill(&cache, &a, 1);
        let b = cache.entry("b", v(1 << 20)).unwrap();
        fill(&cache, &b, 2);
        cache.forget("a", v(1 << 20));
        // "b" replaced by a new version, half filled.
        let b2 = cache.entry("b", v(2 << 20)).unwrap();
        let claim = b2.claim(0..1);
        assert!(cache.reserve(&b2, 1 << 20));
        let buf = vec![3u8; 1 << 20];
        b2.write_at(0, &buf).unwrap();
        b2.complete(claim.mine[0], crc32c::crc32c(&buf));
        b2.persist().unwrap();
    }
    let cache = Cache::open(&config, stats).unwrap();
    assert_eq!(cache.cached_files(), 1);
    assert!(cache.lookup("a", v(1 << 20)).is_none());
    assert!(cache.lookup("b", v(1 << 20)).is_none());
    let b2 = cache.lookup("b", v(2 << 20)).unwrap();
    assert!(b2.all_present(0..1) && !b2.all_present(1..2));
    assert!(b2.verify(&cache, 0..1).unwrap());
    let _ = fs::remove_dir_all(dir);
}

/// A long-running daemon's log is rewritten with the live headers once it has grown past them,
/// and a restart after that reloads exactly the live entries.
#[test]
fn the_log_is_rewritten_when_it_grows() {
    let (dir, config, stats) = setup(100 << 20);
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        cache.shared.journal.set_slack(4096);
        let keep = cache.entry("keep", v(1 << 20)).unwrap();
        fill(&cache, &keep, 1);
        // Many versions of one path come and go: tombstones and stale headers pile up.
        for i in 0..200 {
            let e = cache
                .entry(
                    "churn",
                    Version {
                        size: 1 << 20,
                        mtime_ns: i,
                    },
                )
                .unwrap();
            fill(&cache, &e, 2);
            for _ in 0..5 {
                e.persist().unwrap();
            }
        }
        // Every new entry checks the log: it never grew far past its live size.
        let bytes = cache.shared.journal.bytes();
        assert!(bytes < 3 * 4096, "log {bytes} bytes");
    }
    let cache = Cache::open(&config, stats).unwrap();
    assert_eq!(cache.cached_files(), 2);
    assert!(cache.lookup("keep", v(1 << 20)).unwrap().is_complete());
    let last = Version {
        size: 1 << 20,
        mtime_ns: 199,
    };
    assert!(
        cache
            .lookup("churn", last)
            .unwrap()
            .verify(&cache, 0..1)
            .unwrap()
    );
    let _ = fs::remove_dir_all(dir);
}

/// A reloaded entry whose data file vanished (or was resized) behind the cache's back is
/// emptied at its first use and filled again, not served and not treated as an I/O error.
#[test]
fn a_missing_data_file_is_noticed_at_first_use_after_restart() {
    let (dir, config, stats) = setup(100 << 20);
    let data = {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        let a = cache.entry("a", v(2 << 20)).unwrap();
        fill(&cache, &a, 5);
        a.data_path()
    };
    fs::remove_file(&data).unwrap();
    let cache = Cache::open(&config, stats.clone()).unwrap();
    assert_eq!(cache.used_bytes(), 2 << 20);
    let a = cache.entry("a", v(2 << 20)).unwrap();
    assert!(a.is_complete());
    assert!(a.map().is_some());
    assert!(!a.is_complete());
    assert_eq!(cache.used_bytes(), 0);
    fill(&cache, &a, 6);
    assert!(a.read_bytes(0, 10, None).unwrap() == vec![6; 10]);
    drop((a, cache));
    let cache = Cache::open(&config, stats).unwrap();
    let a = cache.entry("a", v(2 << 20)).unwrap();
    assert!(a.verify(&cache, 0..2).unwrap());
    let _ = fs::remove_dir_all(dir);
}

/// Pages of a chunk (a random read's) survive a restart with their own checksums: present after
/// it, their neighbours still absent; a page corrupted on disk meanwhile is dropped alone when
/// checked, its neighbour kept, and the drop is what the next restart finds.
#[test]
fn pages_survive_a_restart_and_a_corrupt_one_is_dropped_alone() {
    let (dir, config, stats) = setup(100 << 20);
    let chunk = u64::from(config.chunk_size);
    let size = 3 * chunk;
    let page = {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        let e = cache.entry("big", v(size)).unwrap();
        let page = e.page_size();
        let claim = e.claim_pages(1, 0b110);
        assert_eq!((claim.mine, claim.others), (0b110, false));
        // Claimed already: a second filler gets nothing and waits for them.
        assert_eq!(e.claim_pages(1, 0b100).mine, 0);
        assert!(cache.reserve(&e, 2 * page));
        let mut crcs = [0u32; PAGES as usize];
        for p in [1u64, 2] {
            let bytes = vec![p as u8 + 7; page as usize];
            e.write_at(chunk + p * page, &bytes).unwrap();
            crcs[p as usize] = crc32c::crc32c(&bytes);
        }
        assert!(e.complete_pages(1, 0b110, &crcs));
        e.persist().unwrap();
        assert_eq!(cache.used_bytes(), 2 * page);
        page
    };
    let (p1, p2, p3) = (chunk + page, chunk + 2 * page, chunk + 3 * page);
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        assert_eq!(cache.used_bytes(), 2 * page);
        let e = cache.entry("big", v(size)).unwrap();
        assert!(e.bytes_present(p1, p3));
        assert!(!e.bytes_present(p3, p3 + 1) && !e.bytes_present(chunk, p1));
        assert!(!e.all_present(1..2));
        // Page 2 changes on disk behind the daemon.
        let data = fs::OpenOptions::new()
            .write(true)
            .open(e.data_path())
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&data, b"rot", p2 + 5).unwrap();
        assert!(!e.verify_bytes(&cache, p1, p3).unwrap());
        assert!(
            e.bytes_present(p1, p2),
            "the good neighbour was dropped too"
        );
        assert!(!e.bytes_present(p2, p3));
        assert_eq!(stats.checksum_failures.load(Ordering::Relaxed), 1);
        assert_eq!(cache.used_bytes(), page);
        assert!(e.verify_bytes(&cache, p1, p2).unwrap());
    }
    let cache = Cache::open(&config, stats).unwrap();
    let e = cache.entry("big", v(size)).unwrap();
    assert!(e.bytes_present(p1, p2) && !e.bytes_present(p2, p3));
    assert_eq!(cache.used_bytes(), page);
    let _ = fs::remove_dir_all(dir);
}

/// Pages verified once and changed on disk while the daemon runs are checked again before they
/// are served (issue 68: 24 of 24 changed pages were served, as they were verified when filled
/// and never looked at again), twice over; the daemon's own later fills of the same file are
/// no change.
#[test]
fn pages_changed_while_running_are_caught_each_time() {
    let (dir, config, stats) = setup(100 << 20);
    let chunk = u64::from(config.chunk_size);
    let cache = Cache::open(&config, stats.clone()).unwrap();
    let e = cache.entry("big", v(3 * chunk)).unwrap();
    let page = e.page_size();
    super::fill_pages(&cache, &e, 1, 0b1111);
    let (p0, p4) = (chunk, chunk + 4 * page);
    assert!(e.verify_bytes(&cache, p0, p4).unwrap());
    let data = fs::OpenOptions::new()
        .write(true)
        .open(e.data_path())
        .unwrap();
    for round in 1..=2u64 {
        // Another fill of ours between the check and the change, then the change: one byte of
        // page 1 (sleep: a coarse ctime clock would give the change the fill's ctime).
        super::fill_pages(&cache, &e, 2, 1 << (round + 3));
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::os::unix::fs::FileExt::write_all_at(&data, b"x", chunk + page + 3).unwrap();
        assert!(!e.verify_bytes(&cache, p0, p4).unwrap(), "round {round}");
        assert_eq!(stats.checksum_failures.load(Ordering::Relaxed), round);
        assert!(e.bytes_present(p0, chunk + page) && !e.bytes_present(chunk + page, p4));
        super::fill_pages(&cache, &e, 1, 0b10);
        assert!(
            e.verify_bytes(&cache, p0, p4).unwrap(),
            "round {round} refilled"
        );
    }
    // Unchanged since: served without a failure.
    assert!(e.verify_bytes(&cache, p0, p4).unwrap());
    assert_eq!(stats.checksum_failures.load(Ordering::Relaxed), 2);
    let _ = fs::remove_dir_all(dir);
}

/// A page fill appends its chunk's pages alone (tens of bytes), not the file's header, which
/// grows with the file and its partial chunks; a restart puts them back over the header, and a
/// chunk whose last page lands is logged whole.
#[test]
fn page_fills_log_their_chunks_pages_alone() {
    let (dir, config, stats) = setup(100 << 20);
    let chunk = u64::from(config.chunk_size);
    let size = 64 * chunk;
    let log = config.dir.join("index.log");
    let log_len = || fs::metadata(&log).unwrap().len();
    let fill_and_log = |cache: &Cache, e: &Entry, idx: u64, pages: PageMask| {
        fill_pages(cache, e, idx, pages);
        cache.pages_filled(e, idx);
    };
    let page = {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        let e = cache.entry("big", v(size)).unwrap();
        // Its first fill logs the whole header (nothing of it is in the log yet), as does the
        // fill of chunk 20's last page: whole, its checksum combined from its pages'.
        fill_and_log(&cache, &e, 0, 0b1000);
        fill_and_log(&cache, &e, 20, 0b1);
        fill_and_log(&cache, &e, 20, PageMask::MAX - 1);
        assert!(e.all_present(20..21));
        let header = log_len();
        for idx in 1..10 {
            let before = log_len();
            fill_and_log(&cache, &e, idx, 0b1000);
            let grew = log_len() - before;
            assert!(grew < 64, "a page fill appended {grew} bytes");
        }
        assert!(log_len() - header < 9 * 64);
        e.page_size()
    };
    let cache = Cache::open(&config, stats).unwrap();
    let e = cache.entry("big", v(size)).unwrap();
    for idx in 0..10 {
        let at = idx * chunk + 3 * page;
        assert!(e.bytes_present(at, at + page), "chunk {idx}'s page 3");
        assert!(!e.bytes_present(at - page, at));
        assert!(e.verify_bytes(&cache, at, at + page).unwrap());
    }
    assert!(e.all_present(20..21));
    assert!(e.verify(&cache, 20..21).unwrap());
    assert_eq!(cache.used_bytes(), 10 * page + chunk);
    let _ = fs::remove_dir_all(dir);
}

/// Whole-chunk fills of a large file whose header is logged append their chunks alone (a
/// header of a file of thousands of chunks rewritten per fill made the log grow with the square
/// of the file's size), and a restart finds those chunks present, the others absent.
#[test]
fn chunk_fills_log_their_chunks_alone() {
    let (dir, config, stats) = setup(100 << 20);
    let chunk = u64::from(config.chunk_size);
    let size = 4096 * chunk;
    let log = config.dir.join("index.log");
    let log_len = || fs::metadata(&log).unwrap().len();
    let fill_chunk = |cache: &Cache, e: &Entry, idx: u64| {
        assert_eq!(e.claim(idx..idx + 1).mine, vec![idx]);
        assert!(cache.reserve(e, chunk));
        let bytes = vec![idx as u8; chunk as usize];
        e.write_at(idx * chunk, &bytes).unwrap();
        assert!(e.complete(idx, crc32c::crc32c(&bytes)));
        cache.chunks_filled(e, &[idx]);
    };
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        let e = cache.entry("big", v(size)).unwrap();
        // The first fill logs the whole header: nothing of the entry is in the log yet.
        let before = log_len();
        fill_chunk(&cache, &e, 0);
        assert!(log_len() - before > 4096, "the header has a word per chunk");
        for idx in [7, 9, 4095] {
            let before = log_len();
            fill_chunk(&cache, &e, idx);
            let grew = log_len() - before;
            assert!(grew < 64, "a chunk fill appended {grew} bytes");
        }
    }
    let cache = Cache::open(&config, stats).unwrap();
    let e = cache.entry("big", v(size)).unwrap();
    for idx in [0, 7, 9, 4095] {
        assert!(e.all_present(idx..idx + 1), "chunk {idx}");
        assert!(e.verify(&cache, idx..idx + 1).unwrap());
    }
    assert!(!e.all_present(1..2) && !e.all_present(8..9));
    assert_eq!(cache.used_bytes(), 4 * chunk);
    let _ = fs::remove_dir_all(dir);
}

/// A scrub (`recheck`) checks a partial chunk's present pages too, already verified or not, and
/// drops a page rotten on disk alone.
#[test]
fn a_scrub_checks_the_pages_of_partial_chunks() {
    let (dir, config, stats) = setup(100 << 20);
    let chunk = u64::from(config.chunk_size);
    let cache = Cache::open(&config, stats.clone()).unwrap();
    let e = cache.entry("big", v(3 * chunk)).unwrap();
    let page = e.page_size();
    fill_pages(&cache, &e, 2, 0b11);
    assert_eq!(e.recheck(&cache, 0..3).unwrap(), (1, 0));
    let data = fs::OpenOptions::new()
        .write(true)
        .open(e.data_path())
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&data, b"rot", 2 * chunk + page + 9).unwrap();
    assert_eq!(e.recheck(&cache, 0..3).unwrap(), (1, 1));
    assert!(e.bytes_present(2 * chunk, 2 * chunk + page));
    assert!(!e.bytes_present(2 * chunk + page, 2 * chunk + 2 * page));
    assert_eq!(cache.used_bytes(), page);
    assert_eq!(cache.scrub().dropped, 0);
    let _ = fs::remove_dir_all(dir);
}

/// What a holder tells a peer of its pages comes in words of 32 pages, whatever its chunk
/// holds (four words a chunk): a page present, its neighbours absent, a whole chunk all ones.
#[test]
fn held_pages_are_told_in_words_of_32() {
    let (dir, config, stats) = setup(100 << 20);
    let chunk = u64::from(config.chunk_size);
    let cache = Cache::open(&config, stats).unwrap();
    let e = cache.entry("big", v(3 * chunk)).unwrap();
    fill_pages(&cache, &e, 1, 1 << 40 | 1 << 3);
    let mut whole = [0u32; PAGES as usize];
    assert_eq!(e.claim_pages(2, e.all_pages(2)).mine, e.all_pages(2));
    assert!(cache.reserve(&e, chunk));
    e.write_at(2 * chunk, &vec![0; chunk as usize]).unwrap();
    let page = crc32c::crc32c(&vec![0; e.page_size() as usize]);
    whole.fill(page);
    assert!(e.complete_pages(2, e.all_pages(2), &whole));
    assert!(e.all_present(2..3));
    let words = PAGES as usize / 32;
    let mut want = vec![0u32; 3 * words];
    want[words] = 1 << 3;
    want[words + 1] = 1 << 8;
    want[2 * words..].fill(u32::MAX);
    assert_eq!(e.held_pages(0, 100), want);
    // A window from a word on, and one past the file's end.
    assert_eq!(
        e.held_pages(words as u64 + 1, 2),
        want[words + 1..words + 3]
    );
    assert!(e.held_pages(100, 4).is_empty());
    let _ = fs::remove_dir_all(dir);
}

/// A restart appends to a log of whole records, most of them live, as it is; one with many dead
/// records, or a torn tail, is rewritten with its live headers only.
#[test]
fn a_restart_rewrites_the_log_only_when_much_of_it_is_dead_or_torn() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let (dir, config, stats) = setup(100 << 20);
    let log = dir.join("index.log");
    let file = || {
        let m = fs::metadata(&log).unwrap();
        (m.ino(), m.len())
    };
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        for i in 0..20 {
            fill(
                &cache,
                &cache.entry(&format!("f{i}"), v(1 << 20)).unwrap(),
                1,
            );
        }
    }
    // Whatever the fills logged, a restart leaves a log of live headers; the next one keeps it.
    drop(Cache::open(&config, stats.clone()).unwrap());
    let compact = file();
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        assert_eq!(file(), compact, "a compact log is kept as it is");
        assert_eq!(cache.cached_files(), 20);
        fill(&cache, &cache.entry("new", v(1 << 20)).unwrap(), 2);
        assert!(file().1 > compact.1, "appended to");
    }
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        assert_eq!(cache.cached_files(), 21);
        assert!(cache.lookup("new", v(1 << 20)).unwrap().is_complete());
        for i in 0..15 {
            cache.forget(&format!("f{i}"), v(1 << 20));
        }
    }
    let dead = file();
    let cache = Cache::open(&config, stats.clone()).unwrap();
    assert_eq!(cache.cached_files(), 6);
    let (ino, len) = file();
    assert!(
        ino != dead.0 && len < compact.1,
        "rewritten with its live headers"
    );
    drop(cache);
    // Bytes of a torn append at its end: rewritten, every entry kept.
    fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .unwrap()
        .write_all(&[9, 0, 0])
        .unwrap();
    let cache = Cache::open(&config, stats).unwrap();
    assert_eq!(cache.cached_files(), 6);
    assert_eq!(file().1, len);
    assert!(cache.lookup("f15", v(1 << 20)).unwrap().is_complete());
    let _ = fs::remove_dir_all(dir);
}
