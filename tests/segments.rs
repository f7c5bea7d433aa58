//! Small files packed into the cache's segments (`--pack-max`, default 1M) under a real mount:
//! no cache file per sample, served by the daemon with the kernel keeping the pages, back after
//! a restart, never served torn or rotten after a crash, evicted by whole segments.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;

/// Files under `dir` and its subdirectories.
fn walk_files(dir: &Path) -> usize {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.map(|e| e.unwrap().path())
        .map(|p| if p.is_dir() { walk_files(&p) } else { 1 })
        .sum()
}

fn dataset(f: &Fixture, n: usize, size: usize) -> Vec<(String, Vec<u8>)> {
    let files: Vec<_> = (0..n)
        .map(|k| (format!("{k}.bin"), pattern(size + k, k as u64)))
        .collect();
    for (p, d) in &files {
        f.write(p, d);
    }
    files
}

/// The daemon serves a packed file (the kernel cannot be handed a region of a segment) with
/// its pages kept: of three reads the first crosses the daemon, the others read the kernel's
/// pages. After a restart it comes back from its segment, nothing read from the shared FS.
#[test]
fn packed_small_files_are_served_by_the_daemon_with_their_pages_kept() {
    let f = Fixture::new("packed");
    let files = dataset(&f, 5, 200 * 1024);
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    for restart in [false, true] {
        if restart {
            drop_cached_pages(&f.ssd);
        }
        let m = f.mount(&["--pack-max", "1M"]);
        for _ in 0..3 {
            for (p, d) in &files {
                assert!(fs::read(m.path(p)).unwrap() == *d, "{p}");
            }
        }
        assert_eq!(m.stat("passthrough_opens"), 0);
        // Each file crosses the daemon once: its open stores it in the kernel's pages. A READ
        // the kernel sent before the store landed crosses it again (seen once over io_uring,
        // one page): a page per file at most, where keeping no pages would cost 3x.
        let local = m.stat("bytes_from_local");
        let slack = files.len() as u64 * 4096;
        assert!(
            (total..=total + slack).contains(&local),
            "restart {restart}: {local} bytes from the cache for {total}"
        );
        let from_backing = if restart { 0 } else { total };
        assert_eq!(m.stat("bytes_from_backing"), from_backing);
        assert_eq!(m.stat("cache_segments"), 1);
        m.unmount();
        assert_eq!(
            walk_files(&f.ssd.join("data")),
            0,
            "no cache file per sample"
        );
        assert_eq!(walk_files(&f.ssd.join("segments")), 1);
    }
}

/// A packed file the kernel holds no pages of is handed to its page cache whole at its open:
/// reads that seek about in it (as `np.load` does in an `.npz`: the directory at the end, then
/// the member) send no READ, at its first open (fetched then) and after a restart alike.
#[test]
fn a_packed_file_is_stored_in_the_kernels_page_cache_at_its_first_open() {
    let f = Fixture::new("packed-store");
    let files = dataset(&f, 4, 256 * 1024);
    for restart in [false, true] {
        let trace = f.root.join(format!("trace-{restart}.json"));
        let m = f.mount(&["--pack-max", "1M", "--trace", trace.to_str().unwrap()]);
        for (p, d) in &files {
            let file = fs::File::open(m.path(p)).unwrap();
            for (at, len) in [(d.len() - 22, 22), (0, 30), (4096, 100_000), (0, d.len())] {
                let mut buf = vec![0; len];
                file.read_exact_at(&mut buf, at as u64).unwrap();
                assert!(buf == d[at..at + len], "{p} at {at}");
            }
        }
        m.unmount();
        let events = trace_events(&trace);
        let opens = events.iter().filter(|e| e["name"] == "open").count();
        let reads = events.iter().filter(|e| e["name"] == "read").count();
        assert_eq!(opens, files.len(), "restart {restart}");
        assert_eq!(reads, 0, "restart {restart}: READs reached the daemon");
    }
}

/// The daemon dies mid-epoch; a packed object's bytes rot on the disk, the log's last record
/// is torn and a stray segment is left. The next mount serves every file byte-exact: the rotten
/// one fails its checksum and is fetched again, the torn record's file is fetched again, and
/// the stray segment is deleted.
#[test]
fn after_a_crash_torn_or_rotten_packed_objects_are_never_served() {
    let f = Fixture::new("packcrash");
    let files = dataset(&f, 6, 100 * 1024);
    let m = f.mount(&["--pack-max", "1M"]);
    // One reader, in order: 0.bin is the first object of the first segment.
    for (p, d) in &files {
        assert!(fs::read(m.path(p)).unwrap() == *d, "{p}");
    }
    let pid = m.pid;
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_gone(pid);
    drop(m);
    let segment = f.ssd.join("segments").join("00000000.seg");
    let seg = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&segment)
        .unwrap();
    let mut byte = [0u8];
    seg.read_exact_at(&mut byte, 10).unwrap();
    seg.write_all_at(&[byte[0] ^ 0xff], 10).unwrap();
    let log = f.ssd.join("index.log");
    let bytes = fs::read(&log).unwrap();
    fs::write(&log, &bytes[..bytes.len() - 20]).unwrap();
    let stray = f.ssd.join("segments").join("000000ff.seg");
    fs::write(&stray, b"left by a crash").unwrap();

    let m = f.mount(&["--pack-max", "1M"]);
    for (p, d) in &files {
        assert!(fs::read(m.path(p)).unwrap() == *d, "{p}");
    }
    assert_eq!(m.stat("checksum_failures"), 1);
    let refetched = files[0].1.len() + files[5].1.len();
    assert_eq!(m.stat("bytes_from_backing"), refetched as u64);
    wait_until(
        "the sweep of the stray segment",
        std::time::Duration::from_secs(10),
        || !stray.exists(),
    );
    m.unmount();
}

/// A cache much smaller than the dataset: reads stay byte-exact while whole segments are
/// evicted, and the cache holds at most its capacity plus the open segment; also without
/// passthrough (`--no-passthrough`, where `--pack-max auto` packs), where the second round's
/// opens find files whose pages the kernel kept but the cache evicted (each such open takes a
/// region of a segment, which must be filled and counted, not left empty beside the capacity).
#[test]
fn a_small_cache_evicts_whole_segments_and_stays_byte_exact() {
    for mode in [&["--pack-max", "1M"][..], &["--no-passthrough"][..]] {
        let f = Fixture::new("packevict");
        let files = dataset(&f, 64, 200 * 1024);
        let m = f.mount(&[&["--capacity", "4M"][..], mode].concat());
        for round in 0..3 {
            for (p, d) in &files {
                assert!(
                    fs::read(m.path(p)).unwrap() == *d,
                    "{mode:?} round {round}: {p}"
                );
            }
        }
        assert!(m.stat("evictions") > 0);
        // Segments of a 32nd of the capacity, but at least --pack-max (1M): at most the
        // capacity in them, and the one appends go to.
        let segments = walk_files(&f.ssd.join("segments"));
        assert!((1..=5).contains(&segments), "{mode:?}: {segments} segments");
        assert_eq!(m.stat("cache_segments"), segments as u64, "{mode:?}");
        assert_eq!(walk_files(&f.ssd.join("data")), 0);
        m.unmount();
    }
}

/// `--pack-max auto` (the default) packs small files only where the kernel cannot be handed
/// cache files: with passthrough each gets a file of its own and is passed through (a cold
/// cached read costs the daemon nothing); without it (`--no-passthrough`, or a kernel without
/// FUSE passthrough) they are packed and served by the daemon.
#[test]
fn auto_packs_small_files_only_where_they_cannot_be_passed_through() {
    for mode in [&[][..], &["--no-passthrough"][..]] {
        let f = Fixture::new("packauto");
        let files = dataset(&f, 6, 100 * 1024);
        let m = f.mount(mode);
        for _ in 0..2 {
            for (p, d) in &files {
                assert!(fs::read(m.path(p)).unwrap() == *d, "{mode:?}: {p}");
            }
        }
        let passes = m.stats()["passthrough"] == true;
        let segments = walk_files(&f.ssd.join("segments"));
        let own_files = walk_files(&f.ssd.join("data"));
        if passes {
            assert_eq!((segments, own_files), (0, files.len()), "{mode:?}");
            assert!(m.stat("passthrough_opens") > 0, "{mode:?}");
        } else {
            assert_eq!((segments, own_files), (1, 0), "{mode:?}");
            assert_eq!(m.stat("passthrough_opens"), 0, "{mode:?}");
        }
        m.unmount();
    }
}
