//! Packed segments (see `segments.rs`): appends, torn appends, reload, eviction by segment,
//! capacity, scrub and the sweep.

use super::*;
use crate::cache::segments::Place;

const OBJ: u64 = 60 << 10;

/// A cache packing objects of at most 64 KiB into segments of 256 KiB (a 32nd of 8 MiB): four
/// objects of [`OBJ`] bytes each.
fn packed_setup(capacity: u64) -> (PathBuf, CacheConfig, Arc<Stats>) {
    let (dir, mut config, stats) = setup(capacity);
    config.pack_max = 64 << 10;
    (dir, config, stats)
}

fn data(k: u64, len: u64) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + k * 13) as u8).collect()
}

/// Files in a directory of the cache and its subdirectories.
fn files_under(dir: &Path) -> usize {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.map(|e| e.unwrap().path())
        .map(|p| if p.is_dir() { files_under(&p) } else { 1 })
        .sum()
}

fn segment_of(e: &Entry) -> u32 {
    e.place().expect("packed").segment
}

fn read_back(cache: &Cache, e: &Entry) -> Vec<u8> {
    assert!(e.verify(cache, 0..e.chunk_count()).unwrap());
    e.read_bytes(0, e.version.size as usize, None)
        .unwrap()
        .to_vec()
}

#[test]
fn small_objects_are_appended_to_one_segment_and_read_back_exact() {
    let (dir, config, stats) = packed_setup(8 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let mut entries = Vec::new();
    for k in 0..4 {
        let e = cache.entry(&format!("s{k}"), v(OBJ)).unwrap();
        assert!(e.packed());
        fill_with(&cache, &e, &data(k, OBJ));
        entries.push(e);
    }
    // One segment, no data file of their own; objects start on pages, one after the other.
    assert_eq!(files_under(&dir.join("data")), 0);
    assert_eq!(files_under(&dir.join("segments")), 1);
    let places: Vec<Place> = entries.iter().map(|e| e.place().unwrap()).collect();
    assert!(places.iter().all(|p| p.segment == places[0].segment));
    assert_eq!(
        places.iter().map(|p| p.offset()).collect::<Vec<_>>(),
        [0, OBJ, 2 * OBJ, 3 * OBJ]
    );
    for (k, e) in entries.iter().enumerate() {
        assert_eq!(read_back(&cache, e), data(k as u64, OBJ));
        // As a peer reads it, and never handed to the kernel.
        let mut room = vec![0; OBJ as usize + 4096];
        assert!(e.read_verified(&cache, 0, &mut room, OBJ as usize).unwrap());
        assert_eq!(room[..OBJ as usize], data(k as u64, OBJ)[..]);
        assert!(e.data_file().is_err());
        assert!(e.map().is_none());
    }
    // The fifth goes to a second segment; larger files keep a file of their own.
    let e = cache.entry("s4", v(OBJ)).unwrap();
    assert_ne!(segment_of(&e), places[0].segment);
    let big = cache.entry("big", v(65 << 10)).unwrap();
    assert!(!big.packed());
    assert_eq!(files_under(&dir.join("data")), 1);
    // A smaller object read after larger ones on this thread (its kept buffer is larger).
    let tiny = cache.entry("tiny", v(100)).unwrap();
    fill_with(&cache, &tiny, &data(7, 100));
    assert_eq!(read_back(&cache, &tiny), data(7, 100));
    assert_eq!(
        tiny.read_bytes(10, 20, None).unwrap().to_vec(),
        data(7, 100)[10..30]
    );
    // A write past the object's region is refused.
    assert!(e.write_at(OBJ - 1, &[1, 2]).is_err());
    assert_eq!(cache.used_bytes(), 4 * OBJ + 100);
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_restart_brings_packed_objects_back_and_appends_to_a_new_segment() {
    let (dir, config, stats) = packed_setup(8 << 20);
    let first = {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        for k in 0..3 {
            let e = cache.entry(&format!("s{k}"), v(OBJ)).unwrap();
            fill_with(&cache, &e, &data(k, OBJ));
        }
        // Created and never filled: its region stays dead space (past the last object's, so
        // not known after a restart); a dropped object's region between two live ones is.
        let _ = cache.entry("empty", v(OBJ)).unwrap();
        cache.forget("s1", v(OBJ));
        let s1 = cache.entry("s1", v(OBJ)).unwrap();
        fill_with(&cache, &s1, &data(1, OBJ));
        segment_of(&cache.lookup("s0", v(OBJ)).unwrap())
    };
    let cache = Cache::open(&config, stats).unwrap();
    // s0 and s2 in the first segment, with s1's old region between them; s1 in the second.
    assert_eq!(cache.used_bytes(), 4 * OBJ);
    assert_eq!(cache.cached_files(), 3);
    for k in 0..3 {
        let e = cache.lookup(&format!("s{k}"), v(OBJ)).unwrap();
        assert!(e.is_complete() && e.packed());
        assert_eq!(segment_of(&e) == first, k != 1);
        assert_eq!(read_back(&cache, &e), data(k, OBJ));
    }
    // Reloaded segments take no more appends.
    let e = cache.entry("s3", v(OBJ)).unwrap();
    assert!(segment_of(&e) > first + 1);
    assert_eq!(cache.shared.segments.open_segment(), Some(segment_of(&e)));
    // A stray segment no record names is swept; the live ones stay.
    fs::write(cache.shared.segments.path(999), b"stray").unwrap();
    fs::write(dir.join("segments").join("junk"), b"x").unwrap();
    assert_eq!(cache.sweep_orphans().unwrap(), 2);
    assert_eq!(files_under(&dir.join("segments")), 3);
    // The first segment's last objects go: its dead bytes with it.
    cache.forget("s0", v(OBJ));
    cache.forget("s2", v(OBJ));
    assert_eq!(cache.used_bytes(), OBJ);
    assert!(!cache.shared.segments.path(first).exists());
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn torn_appends_are_never_served() {
    let (dir, config, stats) = packed_setup(8 << 20);
    let seg_path;
    {
        let cache = Cache::open(&config, stats.clone()).unwrap();
        for k in 0..3 {
            let e = cache.entry(&format!("s{k}"), v(OBJ)).unwrap();
            fill_with(&cache, &e, &data(k, OBJ));
        }
        let e = cache.lookup("s1", v(OBJ)).unwrap();
        seg_path = cache.shared.segments.path(segment_of(&e));
        // The record of s1 reached the log, its bytes did not (all of them, or a tail).
        let seg = OpenOptions::new().write(true).open(&seg_path).unwrap();
        seg.write_all_at(&vec![0; 1000], e.base() + OBJ - 1000)
            .unwrap();
    }
    // And the log's last record (s2's) was torn by the crash.
    let log = dir.join("index.log");
    let bytes = fs::read(&log).unwrap();
    fs::write(&log, &bytes[..bytes.len() - 7]).unwrap();
    let cache = Cache::open(&config, stats.clone()).unwrap();
    assert!(cache.lookup("s2", v(OBJ)).is_none());
    let s0 = cache.lookup("s0", v(OBJ)).unwrap();
    assert_eq!(read_back(&cache, &s0), data(0, OBJ));
    let s1 = cache.lookup("s1", v(OBJ)).unwrap();
    assert!(!s1.verify(&cache, 0..1).unwrap());
    assert!(!s1.is_complete());
    assert_eq!(stats.checksum_failures.load(Ordering::Relaxed), 1);
    assert_eq!(cache.used_bytes(), OBJ);
    // Refilled in place, it is served again.
    fill_with(&cache, &s1, &data(1, OBJ));
    assert_eq!(read_back(&cache, &s1), data(1, OBJ));
    // A segment cut short behind the cache: its objects are not loaded.
    drop((s0, s1, cache));
    fs::OpenOptions::new()
        .write(true)
        .open(&seg_path)
        .unwrap()
        .set_len(OBJ)
        .unwrap();
    let cache = Cache::open(&config, stats).unwrap();
    assert_eq!(cache.cached_files(), 0);
    assert_eq!(cache.used_bytes(), 0);
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn eviction_frees_whole_least_recently_used_segments() {
    // 2 MiB of capacity: segments of 64 KiB; 16 KiB objects, four a segment.
    let (dir, mut config, stats) = packed_setup(2 << 20);
    config.pack_max = 16 << 10;
    let cache = Cache::open(&config, stats.clone()).unwrap();
    let obj = 16 << 10;
    let mut by_seg: Vec<Vec<Arc<Entry>>> = Vec::new();
    for k in 0..128u64 {
        let e = cache.entry(&format!("s{k}"), v(obj)).unwrap();
        fill_with(&cache, &e, &data(k, obj));
        let seg = segment_of(&e) as usize;
        if by_seg.len() <= seg {
            by_seg.resize(seg + 1, Vec::new());
        }
        by_seg[seg].push(e);
    }
    assert_eq!(by_seg.len(), 32);
    assert!(by_seg.iter().all(|s| s.len() == 4));
    assert_eq!(cache.used_bytes(), 2 << 20);
    // Segment 0 is used again (one object is enough), segment 1 held open.
    cache.entry("s0", v(obj)).unwrap();
    by_seg[1][2].pin();
    // A new object needs room: the least recently used segment nobody holds goes whole.
    let e = cache.entry("new", v(obj)).unwrap();
    fill_with(&cache, &e, &data(99, obj));
    let gone = |seg: usize| {
        by_seg[seg]
            .iter()
            .all(|e| e.is_evicted() && cache.lookup(&e.path, e.version).is_none())
    };
    assert!(gone(2));
    assert!(!cache.shared.segments.path(2).exists());
    for seg in [0, 1, 3] {
        assert!(by_seg[seg].iter().all(|e| !e.is_evicted()), "segment {seg}");
    }
    assert_eq!(stats.evictions.load(Ordering::Relaxed), 4);
    assert_eq!(cache.used_bytes(), (2 << 20) - 3 * obj);
    by_seg[1][2].unpin();
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn dropped_objects_count_until_their_segment_goes() {
    let (dir, config, stats) = packed_setup(8 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let mut es = Vec::new();
    for k in 0..5 {
        let e = cache.entry(&format!("s{k}"), v(OBJ)).unwrap();
        fill_with(&cache, &e, &data(k, OBJ));
        es.push(e);
    }
    let first = segment_of(&es[0]);
    assert_eq!(cache.shared.segments.count().0, 2);
    // Three of the full segment's four objects go: their bytes are still on the disk.
    for e in &es[..3] {
        cache.forget(&e.path, e.version);
    }
    assert_eq!(cache.used_bytes(), 5 * OBJ);
    assert!(cache.shared.segments.path(first).exists());
    // A new version of the last one replaces it: the segment is empty, so freed.
    let e = cache.entry("s3", v(OBJ + 1)).unwrap();
    assert!(!cache.shared.segments.path(first).exists());
    assert_eq!(cache.used_bytes(), OBJ);
    assert_eq!(cache.shared.segments.count().0, 1);
    // The open segment is kept while empty.
    cache.forget("s4", v(OBJ));
    cache.forget("s3", e.version);
    assert_eq!(cache.shared.segments.count().0, 1);
    assert_eq!(cache.used_bytes(), OBJ);
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn scrub_finds_rot_in_a_packed_object() {
    let (dir, config, stats) = packed_setup(8 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    for k in 0..3 {
        let e = cache.entry(&format!("s{k}"), v(OBJ)).unwrap();
        fill_with(&cache, &e, &data(k, OBJ));
    }
    let e = cache.lookup("s2", v(OBJ)).unwrap();
    let seg = OpenOptions::new()
        .write(true)
        .open(cache.shared.segments.path(segment_of(&e)))
        .unwrap();
    seg.write_all_at(&[0xff ^ data(2, 1)[0]], e.base()).unwrap();
    let report = cache.scrub();
    assert_eq!((report.files, report.chunks, report.dropped), (3, 3, 1));
    assert!(!e.is_complete());
    assert!(cache.lookup("s0", v(OBJ)).unwrap().is_complete());
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn adopted_files_keep_a_file_of_their_own() {
    let (dir, config, stats) = packed_setup(8 << 20);
    let cache = Cache::open(&config, stats).unwrap();
    let staged = dir.join("staged");
    fs::write(&staged, data(1, 1000)).unwrap();
    let e = cache.adopt("//produced/0/1", v(1000), &staged).unwrap();
    assert!(!e.packed() && e.kept() && e.is_complete());
    assert_eq!(read_back(&cache, &e), data(1, 1000));
    let _ = fs::remove_dir_all(dir);
}
