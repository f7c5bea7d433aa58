//! Integration tests: the real binary mounts real directories through the kernel's FUSE.
//! Every data test runs in passthrough mode and with `--no-passthrough`.

mod common;

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const CHUNK: usize = 2 * MIB;
const SPARSE_SIZE: u64 = 5 << 30;
const SPARSE_MARKS: [u64; 3] = [
    (4 << 30) + 12345,
    (4 << 30) + (700 << 20),
    SPARSE_SIZE - 4096,
];

/// A tree with nested dirs, an empty file, chunk-boundary sizes, small and large files, and a
/// sparse file larger than 4 GiB with data at high offsets.
fn make_tree(f: &Fixture) -> Vec<(String, Vec<u8>)> {
    let sizes = [
        1,
        4095,
        CHUNK - 1,
        CHUNK,
        CHUNK + 1,
        4 * CHUNK,
        8 * MIB + 1,
        5 * CHUNK + 777,
    ];
    let mut files = vec![("empty".to_string(), Vec::new())];
    for (i, size) in sizes.iter().enumerate() {
        files.push((format!("d{}/sub/f{i}.bin", i % 3), pattern(*size, i as u64)));
    }
    files.push(("a/b/c/d/deep.txt".into(), b"deep\n".to_vec()));
    for (p, d) in &files {
        f.write(p, d);
    }
    let sparse = File::create(f.backing.join("sparse.h5")).unwrap();
    sparse.set_len(SPARSE_SIZE).unwrap();
    for (i, off) in SPARSE_MARKS.iter().enumerate() {
        sparse
            .write_all_at(&pattern(4096, 100 + i as u64), *off)
            .unwrap();
    }
    files
}

fn check_tree(m: &Mounted, files: &[(String, Vec<u8>)]) {
    for (p, d) in files {
        assert!(fs::read(m.path(p)).unwrap() == *d, "{p} differs");
    }
    let sparse = File::open(m.path("sparse.h5")).unwrap();
    assert_eq!(sparse.metadata().unwrap().len(), SPARSE_SIZE);
    for (i, off) in SPARSE_MARKS.iter().enumerate() {
        let mut buf = vec![0; 4096];
        sparse.read_exact_at(&mut buf, *off).unwrap();
        assert!(
            buf == pattern(4096, 100 + i as u64),
            "sparse mark {i} differs"
        );
    }
    let mut hole = vec![1; 1000];
    sparse
        .read_exact_at(&mut hole, (4 << 30) + (300 << 20))
        .unwrap();
    assert!(hole.iter().all(|b| *b == 0));
}

#[test]
fn tree_is_byte_exact_and_hits_are_local() {
    for (i, mode) in MODES.iter().enumerate() {
        let f = Fixture::new(&format!("tree{i}"));
        let files = make_tree(&f);
        let m = f.mount(mode);
        let mut names: Vec<_> = fs::read_dir(&m.mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["a", "d0", "d1", "d2", "empty", "sparse.h5"]);
        assert!(fs::metadata(m.path("a/b/c/d")).unwrap().is_dir());

        check_tree(&m, &files);
        let first = m.stats();
        let total: usize = files.iter().map(|(_, d)| d.len()).sum();
        // The sparse file is never fetched whole: only the chunks around the marks.
        let from_backing = first["bytes_from_backing"].as_u64().unwrap();
        assert!(from_backing >= total as u64 && from_backing < (total + 10 * CHUNK) as u64);

        check_tree(&m, &files);
        let second = m.stats();
        assert_eq!(second["bytes_from_backing"], first["bytes_from_backing"]);
        assert!(second["local_hits"].as_u64().unwrap() >= files.len() as u64);
        let passthrough = mode.is_empty();
        assert_eq!(second["passthrough"], passthrough);
        assert_eq!(
            second["passthrough_opens"].as_u64().unwrap() > 0,
            passthrough
        );
        for key in [
            "local_hits",
            "backing_fetches",
            "bytes_from_backing",
            "bytes_from_local",
            "cached_bytes",
            "cached_files",
            "evictions",
        ] {
            assert!(second[key].is_u64(), "stats lack {key}");
        }
        m.unmount();
    }
}

#[test]
fn concurrent_threads_and_processes_fetch_each_chunk_once() {
    for (i, mode) in MODES.iter().enumerate() {
        let f = Fixture::new(&format!("conc{i}"));
        let big = pattern(24 * MIB + 5, 1);
        let small = pattern(3 * MIB, 2);
        f.write("big.bin", &big);
        f.write("small.bin", &small);
        let m = f.mount(mode);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let mut buf = Vec::new();
                    File::open(m.path("big.bin"))
                        .unwrap()
                        .read_to_end(&mut buf)
                        .unwrap();
                    assert!(buf == big);
                });
            }
        });
        let procs: Vec<_> = (0..4)
            .map(|_| {
                Command::new("cmp")
                    .arg(m.path("small.bin"))
                    .arg(f.backing.join("small.bin"))
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut p in procs {
            assert!(
                p.wait().unwrap().success(),
                "a reader process saw other bytes"
            );
        }
        assert_eq!(
            m.stat("bytes_from_backing"),
            (big.len() + small.len()) as u64,
            "single flight: every byte read from the backing store once"
        );
        assert_eq!(m.stat("backing_fetches"), 2);
    }
}

/// The kernel fails an open with EIO if one inode mixes passthrough opens and opens served by
/// the daemon: a file opened before it was cached and still open must not get passthrough
/// opens, and then may once that open is closed.
#[test]
fn opens_of_a_file_cached_while_open_do_not_mix_io_modes() {
    let f = Fixture::new("iomode");
    // Larger than what is fetched at open, so the first open is served by the daemon.
    let data = pattern(9 * MIB, 7);
    f.write("x.bin", &data);
    let m = f.mount(&[]);
    let mut first = File::open(m.path("x.bin")).unwrap();
    let mut got = Vec::new();
    first.read_to_end(&mut got).unwrap();
    assert!(got == data);
    // Cached now, while `first` (served by the daemon) is still open.
    for _ in 0..2 {
        assert!(fs::read(m.path("x.bin")).unwrap() == data);
    }
    let second = File::open(m.path("x.bin")).unwrap();
    drop(first);
    assert!(fs::read(m.path("x.bin")).unwrap() == data);
    drop(second);
    let before = m.stat("passthrough_opens");
    assert!(fs::read(m.path("x.bin")).unwrap() == data);
    if m.stats()["passthrough"].as_bool() == Some(true) {
        // The kernel releases a closed file asynchronously: an open right after the last close
        // may still find it open (served by the daemon). Once released, opens pass through.
        wait_until("passthrough once alone", Duration::from_secs(5), || {
            assert!(fs::read(m.path("x.bin")).unwrap() == data);
            m.stat("passthrough_opens") > before
        });
    }
}

/// A small file is fetched whole at its first open, so that open is already a passthrough open
/// (where the kernel offers passthrough) and its reads never reach the daemon.
#[test]
fn the_first_open_of_a_small_file_is_passthrough() {
    let f = Fixture::new("openfill");
    let data = pattern(2 * MIB + 3, 9);
    f.write("s.npz", &data);
    let m = f.mount(&[]);
    assert!(fs::read(m.path("s.npz")).unwrap() == data);
    assert_eq!(m.stat("bytes_from_backing"), data.len() as u64);
    assert_eq!(
        m.stat("local_hits"),
        0,
        "the first open is a fetch, not a hit"
    );
    if m.stats()["passthrough"].as_bool() == Some(true) {
        assert_eq!(m.stat("passthrough_opens"), 1);
        assert_eq!(m.stat("bytes_from_local"), 0, "no read came to the daemon");
    }
}

/// Under `--passthrough-min`, a cached file whose bytes are not in memory when the kernel first
/// opens it is served by the daemon with its pages kept: of three reads, one crosses the daemon
/// and the others read nothing. One fetched by its open passes through (the daemon would copy
/// its bytes once more), and so do the inode's later opens (after a passthrough open the kernel
/// holds no pages). At 0, the default, every open passes through. (Files with a cache file of
/// their own: `--pack-max 0`; packed ones are never passed through, see below.)
#[test]
fn small_files_are_served_with_their_pages_kept_under_passthrough_min() {
    let f = Fixture::new("ptmin");
    let data = pattern(200 * 1024, 6);
    f.write("s.bin", &data);
    for min in ["1M", "0"] {
        let m = f.mount(&["--passthrough-min", min, "--pack-max", "0"]);
        // Fetched by its first open (or, at 0, whatever happened before): passthrough.
        for _ in 0..3 {
            assert!(fs::read(m.path("s.bin")).unwrap() == data);
        }
        let passthrough = m.stats()["passthrough"].as_bool() == Some(true);
        if passthrough {
            assert_eq!(m.stat("passthrough_opens"), 3, "--passthrough-min {min}");
            assert_eq!(m.stat("bytes_from_local"), 0, "no read came to the daemon");
        }
        m.unmount();

        // Cached, its bytes on disk only, and a kernel that has not seen it (a new mount).
        drop_cached_pages(&f.ssd);
        let m = f.mount(&["--passthrough-min", min, "--pack-max", "0"]);
        for _ in 0..3 {
            assert!(fs::read(m.path("s.bin")).unwrap() == data);
        }
        if passthrough && min == "0" {
            assert_eq!(m.stat("passthrough_opens"), 3);
            assert_eq!(m.stat("bytes_from_local"), 0);
        } else {
            // Daemon-served (as every open is on a kernel without passthrough).
            assert_eq!(m.stat("passthrough_opens"), 0);
            assert_eq!(
                m.stat("bytes_from_local"),
                data.len() as u64,
                "the first read crossed the daemon, the others read the kernel's pages"
            );
        }
        m.unmount();
    }
}

/// `--read-only` (`-o ro`): nothing can be made under the mount, and a cached file read again
/// costs no attribute round trip; on a writable mount a passthrough read makes the kernel ask
/// for the attributes again at the next stat (its atime), on a read-only one it does not.
/// (A file with a cache file of its own, `--pack-max 0`: packed ones never pass through.)
#[test]
fn a_read_only_mount_refuses_writes_and_keeps_attributes_across_reads() {
    let f = Fixture::new("readonly");
    let data = pattern(300 * 1024, 5);
    f.write("s.bin", &data);
    for (args, read_only) in [
        (&["--pack-max", "0"][..], false),
        (
            &["--read-only", "--pack-max", "0", "--opens", "asked"][..],
            true,
        ),
        (
            &["-o", "ro", "--pack-max", "0", "--opens", "asked"][..],
            true,
        ),
    ] {
        let m = f.mount(args);
        assert!(fs::read(m.path("s.bin")).unwrap() == data);
        let before = m.stat("attr_requests");
        for _ in 0..3 {
            // fs::read stats the open file for its size, then reads it.
            assert!(fs::read(m.path("s.bin")).unwrap() == data);
        }
        let asked = m.stat("attr_requests") - before;
        if read_only {
            assert_eq!(asked, 0, "{args:?}: the kernel asked for attributes again");
            let e = fs::write(m.path("new.bin"), b"x").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{args:?}: {e}");
        } else if m.stats()["passthrough"].as_bool() == Some(true) {
            // Once per read on a quiet machine; seen twice in 3 under a full run's load (the
            // kernel's own bookkeeping): what this shows is that it asks at all, where a
            // read-only mount asks nothing.
            assert!(
                asked >= 1,
                "writable, passthrough: {asked} attribute requests in 3 reads"
            );
        }
        m.unmount();
    }
}

/// `n` preads at pseudo-random offsets and lengths (up to 3 MiB) from `seed`, each compared
/// with `data`.
fn random_preads_match(file: &File, data: &[u8], mut seed: u64, n: usize) {
    for _ in 0..n {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let off = (seed >> 20) as usize % data.len();
        let len = ((seed >> 8) as usize % (3 * MIB)).min(data.len() - off);
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, off as u64).unwrap();
        assert!(buf == data[off..off + len], "pread at {off}+{len}");
    }
}

/// Maps `file` (as numpy.memmap does) and compares the mapping with `data` (more than 17 MiB):
/// its first page, a stretch in the middle, then the whole. `kind`: `MAP_PRIVATE` (numpy's
/// read-only memmap) or `MAP_SHARED` (LMDB, Python's `mmap.mmap`).
fn mapping_matches(file: &File, data: &[u8], kind: libc::c_int) {
    // SAFETY: a read-only mapping of a file the caller keeps open for its lifetime.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            data.len(),
            libc::PROT_READ,
            kind,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: the mapping is data.len() bytes long and readable.
    let mapped = unsafe { std::slice::from_raw_parts(map as *const u8, data.len()) };
    assert!(mapped[..4096] == data[..4096]);
    assert!(mapped[17 * MIB..17 * MIB + 8192] == data[17 * MIB..17 * MIB + 8192]);
    assert!(mapped == data);
    // SAFETY: unmapping the mapping created above, no longer used.
    unsafe { libc::munmap(map, data.len()) };
}

/// `--no-open`: the kernel opens files without asking the daemon (no OPEN, RELEASE or FLUSH)
/// and keeps their pages between opens; every read it misses comes to the daemon by inode.
/// Whole, random and mapped reads stay byte-exact, also under eviction and after the backing
/// file changes; nothing can be written.
#[test]
fn files_opened_without_asking_are_read_by_inode() {
    let f = Fixture::new("noopen");
    let files = make_tree(&f);
    let data = pattern(30 * MIB + 123, 3);
    f.write("x.npy", &data);
    f.write("f.bin", &pattern(MIB, 1));
    let m = f.mount(&["--no-open", "--metadata-ttl", "500ms"]);
    assert_eq!(m.stats()["no_open"].as_bool(), Some(true));
    check_tree(&m, &files);
    let file = File::open(m.path("x.npy")).unwrap();
    random_preads_match(&file, &data, 777, 100);
    mapping_matches(&file, &data, libc::MAP_PRIVATE);
    drop(file);
    // Read once, a file's pages stay with the kernel: opening and reading it again asks
    // nothing (with opens, each open of a complete file counts a local hit).
    assert!(fs::read(m.path("f.bin")).unwrap() == pattern(MIB, 1));
    let asked = || m.stat("local_hits") + m.stat("bytes_from_local") + m.stat("bytes_from_backing");
    let before = asked();
    for _ in 0..3 {
        assert!(fs::read(m.path("f.bin")).unwrap() == pattern(MIB, 1));
    }
    assert_eq!(asked(), before, "a re-read came to the daemon");
    let e = fs::write(m.path("new.bin"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    // A changed file's cached pages are dropped once its attributes are refreshed.
    std::thread::sleep(Duration::from_millis(20)); // a new mtime, past the clock's tick
    f.write("f.bin", &pattern(MIB, 3));
    std::thread::sleep(Duration::from_millis(700)); // the metadata TTL runs out: the thing tested
    assert!(fs::read(m.path("f.bin")).unwrap() == pattern(MIB, 3));
    m.unmount();
    // Files the kernel holds are not held in the cache: twelve files through 4 MiB.
    let small: Vec<_> = (0..12)
        .map(|k| (format!("s/{k}.bin"), pattern(MIB, 40 + k)))
        .collect();
    for (p, d) in &small {
        f.write(p, d);
    }
    let m = f.mount(&["--no-open", "--capacity", "4M"]);
    let held: Vec<File> = small
        .iter()
        .map(|(p, _)| File::open(m.path(p)).unwrap())
        .collect();
    for (h, (p, d)) in held.iter().zip(&small) {
        let mut buf = vec![0; d.len()];
        h.read_exact_at(&mut buf, 0).unwrap();
        assert!(buf == *d, "{p}");
    }
    assert!(m.stat("evictions") >= 8);
    assert!(m.stat("cached_bytes") <= 4 * MIB as u64);
    assert_eq!(m.stat("uncached_reads"), 0);
}

/// The mount's readahead (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`), in KiB.
fn readahead_kib(m: &Mounted) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(m.path("")).ok()?.dev();
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    fs::read_to_string(knob).ok()?.trim().parse().ok()
}

/// By default, where complete files pass through and large ones are read by direct I/O, what
/// the kernel still reads ahead is mapped large files around their faults: the daemon lowers
/// the mount's readahead to 24 KiB, so that LMDB or np.memmap read at random fetch about what
/// they touch. Where the daemon serves files itself it leaves the kernel's 128 KiB, as it does
/// when told 0.
#[test]
fn mapped_large_files_are_read_around_their_faults_by_24_kib() {
    let f = Fixture::new("readaround");
    f.write("f.bin", &pattern(MIB, 1));
    for (args, kib) in [
        (&[][..], 24),
        (&["--no-passthrough"][..], 128),
        (&["--kernel-readahead", "0"][..], 128),
    ] {
        let m = f.mount(args);
        let passthrough = !args.contains(&"--no-passthrough");
        assert_eq!(m.stats()["passthrough"].as_bool(), Some(passthrough));
        // The daemon sets it on a thread of its own once INIT is done, and again if the kernel
        // lowered it after: once that thread is done, the daemon changes it no more.
        wait_until(
            &format!("{args:?}: the readahead thread is done"),
            Duration::from_secs(10),
            || !thread_names(m.pid).iter().any(|t| t == "readahead"),
        );
        assert_eq!(readahead_kib(&m), Some(kib), "{args:?}");
        m.unmount();
    }
}

/// Once INIT is done the daemon sets its mount's readahead (`--kernel-readahead`, which INIT
/// caps at the kernel's 128 KiB): a file it serves itself is read in requests of up to 1 MiB,
/// not 128 KiB (a 256 KiB packed sample took two READs, a large file eight per MiB).
#[test]
fn daemon_served_reads_come_in_requests_of_a_mebibyte() {
    let f = Fixture::new("readahead");
    let data = pattern(8 * MIB, 5);
    f.write("big.bin", &data);
    let trace = f.root.join("trace.json");
    let m = f.mount(&[
        "--no-open",
        "--kernel-readahead",
        "2M",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    wait_until(
        "the mount's readahead raised",
        Duration::from_secs(10),
        || readahead_kib(&m) == Some(2048),
    );
    assert!(fs::read(m.path("big.bin")).unwrap() == data);
    m.unmount();
    let events = trace_events(&trace);
    let sizes: Vec<u64> = events
        .iter()
        .filter(|e| e["name"] == "read")
        .map(|e| e["args"]["size"].as_u64().unwrap())
        .collect();
    assert_eq!(
        sizes.iter().max(),
        Some(&(MIB as u64)),
        "READ sizes {sizes:?}"
    );
    assert!(
        sizes.len() <= 16,
        "{} READs for 8 MiB: {sizes:?}",
        sizes.len()
    );
}

#[test]
fn random_reads_and_mmap_are_byte_exact() {
    for (i, mode) in MODES.iter().enumerate() {
        let f = Fixture::new(&format!("rand{i}"));
        let data = pattern(30 * MIB + 123, 3);
        f.write("x.npy", &data);
        let m = f.mount(mode);
        let file = File::open(m.path("x.npy")).unwrap();
        random_preads_match(&file, &data, 12345, 300);
        drop(file);
        // mmap (LMDB's shared map, then numpy.memmap's private one) before and after the file
        // is complete in the cache.
        for kind in [libc::MAP_SHARED, libc::MAP_PRIVATE] {
            mapping_matches(&File::open(m.path("x.npy")).unwrap(), &data, kind);
        }
    }
}

/// Random preads of a large file whose reader does not advise random access fetch about what
/// they touch: while the file is filled by pages it is opened for direct I/O, so the kernel
/// reads no further ahead than each read (through the page cache it asks as much again ahead
/// of each 256 KiB read: 1.6-1.8x the bytes read, as `--page-cache-large-files` still does). A
/// shared map of it still works, and buffered readers are told to read it a MiB at a time.
#[test]
fn random_preads_of_a_large_file_fetch_what_they_touch() {
    const LEN: usize = 256 << 10;
    let data = pattern(64 * MIB + 4321, 8);
    for (args, direct) in [(&[][..], true), (&["--page-cache-large-files"][..], false)] {
        // A fixture each: an empty cache.
        let f = Fixture::new(if direct { "direct" } else { "direct-off" });
        f.write("rows.mdb", &data);
        f.write("small.bin", &pattern(MIB, 9));
        let m = f.mount(args);
        let file = File::open(m.path("rows.mdb")).unwrap();
        let mut seed = 99u64;
        for _ in 0..40 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (seed >> 20) as usize % (data.len() - LEN);
            let mut buf = vec![0; LEN];
            file.read_exact_at(&mut buf, off as u64).unwrap();
            assert!(buf == data[off..off + LEN], "pread at {off}");
        }
        let (fetched, touched) = (m.stat("bytes_from_backing"), 40 * LEN as u64);
        assert_eq!(
            fetched <= touched * 5 / 4,
            direct,
            "{args:?}: fetched {fetched} bytes for {touched} read"
        );
        mapping_matches(&file, &data, libc::MAP_SHARED);
        drop(file);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fs::metadata(m.path("rows.mdb")).unwrap().blksize(), 1 << 20);
        assert_eq!(
            fs::metadata(m.path("small.bin")).unwrap().blksize(),
            128 << 10
        );
        m.unmount();
    }
}

/// The page tables of a mount's cache are bounded (`--max-partial-chunks`): past the bound, a
/// random read of a chunk not cached yet caches it whole; the chunks so cached are logged as
/// such and survive a restart (nothing fetched again), as the partial ones do.
#[test]
fn partly_cached_chunks_are_bounded_and_survive_a_restart() {
    const LEN: usize = 64 << 10;
    let data = pattern(64 * MIB + 777, 10);
    let f = Fixture::new("partial-bound");
    f.write("rows.h5", &data);
    let offsets: Vec<usize> = (0..24)
        .map(|k| (k * 2 * MIB + 5 * k * 4096 + 100) % (data.len() - LEN))
        .collect();
    let read_all = |m: &Mounted| {
        let file = File::open(m.path("rows.h5")).unwrap();
        for &off in &offsets {
            let mut buf = vec![0; LEN];
            file.read_exact_at(&mut buf, off as u64).unwrap();
            assert!(buf == data[off..off + LEN], "pread at {off}");
        }
    };
    let args = ["--max-partial-chunks", "2"];
    let m = f.mount(&args);
    read_all(&m);
    assert_eq!(m.stat("partial_chunks"), 2);
    // Two chunks by their pages, the other 22 whole.
    let fetched = m.stat("bytes_from_backing");
    assert!(fetched >= 22 * 2 * MIB as u64, "fetched {fetched}");
    m.unmount();
    let m = f.mount(&args);
    read_all(&m);
    assert_eq!(m.stat("bytes_from_backing"), 0, "refetched after a restart");
    assert_eq!(m.stat("partial_chunks"), 2);
    m.unmount();
}

#[test]
fn small_capacity_evicts_and_stays_byte_exact() {
    for (i, mode) in MODES.iter().enumerate() {
        let f = Fixture::new(&format!("evict{i}"));
        let files: Vec<_> = (0..12)
            .map(|k| (format!("s/{k}.bin"), pattern(MIB, k)))
            .collect();
        for (p, d) in &files {
            f.write(p, d);
        }
        for k in 0..5 {
            f.write(&format!("fresh/{k}.bin"), &pattern(MIB, 90 + k));
        }
        let m = f.mount(&[mode, &["--capacity", "4M"][..]].concat());
        for _ in 0..2 {
            for (p, d) in &files {
                assert!(fs::read(m.path(p)).unwrap() == *d, "{p}");
            }
        }
        assert!(m.stat("evictions") >= 8);
        assert!(m.stat("cached_bytes") <= 4 * MIB as u64);
        // Four open files fill the cache: a fifth is served uncached, still byte-exact. (All
        // are read for the first time, so the kernel's page cache cannot answer for the daemon.)
        let held: Vec<_> = (0..4)
            .map(|k| {
                let mut h = File::open(m.path(&format!("fresh/{k}.bin"))).unwrap();
                let mut buf = Vec::new();
                h.read_to_end(&mut buf).unwrap();
                assert!(buf == pattern(MIB, 90 + k));
                h
            })
            .collect();
        let before = m.stat("uncached_reads");
        assert!(fs::read(m.path("fresh/4.bin")).unwrap() == pattern(MIB, 94));
        assert!(m.stat("uncached_reads") > before);
        drop(held);
        assert!(m.stat("cached_bytes") <= 4 * MIB as u64);
    }
}

#[test]
fn warm_restart_reads_nothing_from_backing() {
    for (i, mode) in MODES.iter().enumerate() {
        let f = Fixture::new(&format!("warm{i}"));
        let files = make_tree(&f);
        let m = f.mount(mode);
        check_tree(&m, &files);
        m.unmount();
        let m = f.mount(mode);
        check_tree(&m, &files);
        assert_eq!(m.stat("bytes_from_backing"), 0);
        assert_eq!(m.stat("backing_fetches"), 0);
        assert!(m.stat("cached_files") >= files.len() as u64 - 1);
        if mode.is_empty() {
            // A large file's first open after the restart was served by the daemon while it
            // was verified in the background; later opens go to the kernel (passthrough).
            let (big, data) = files.iter().find(|(_, d)| d.len() > 8 * MIB).unwrap();
            wait_until("verified for passthrough", Duration::from_secs(10), || {
                let before = m.stat("passthrough_opens");
                assert!(fs::read(m.path(big)).unwrap() == *data);
                m.stat("passthrough_opens") > before
            });
            assert_eq!(m.stat("bytes_from_backing"), 0);
        }
    }
}

#[test]
fn crash_leftovers_and_corruption_are_never_served() {
    let f = Fixture::new("crash");
    let files: Vec<_> = (0..6)
        .map(|k| (format!("{k}.bin"), pattern(3 * MIB, k)))
        .collect();
    for (p, d) in &files {
        f.write(p, d);
    }
    let m = f.mount(&[]);
    for (p, d) in &files {
        assert!(fs::read(m.path(p)).unwrap() == *d);
    }
    // The daemon dies without unmounting.
    let pid = m.pid;
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_gone(pid);
    drop(m);
    assert!(!is_mounted(&f.mnt));
    // Damage the cache: flip a data byte of one file, tear the log's last record (a crash
    // mid-append: the last file read is forgotten), leave a foreign file.
    let dat = |p: &str| {
        let h = dyadfs::core::path_hash(p);
        f.ssd
            .join("data")
            .join(format!("{:02x}", h >> 56))
            .join(format!("{h:016x}.dat"))
    };
    let d0 = dat("0.bin");
    let file = fs::OpenOptions::new().write(true).open(&d0).unwrap();
    let mut byte = [0u8];
    File::open(&d0)
        .unwrap()
        .read_exact_at(&mut byte, 2 * MIB as u64 + 10)
        .unwrap();
    file.write_all_at(&[byte[0] ^ 0xff], 2 * MIB as u64 + 10)
        .unwrap();
    let log = f.ssd.join("index.log");
    let bytes = fs::read(&log).unwrap();
    fs::write(&log, &bytes[..bytes.len() - 20]).unwrap();
    let stray = d0.with_extension("meta.tmp");
    fs::write(&stray, b"half").unwrap();

    let m = f.mount(&[]);
    for (p, d) in &files {
        assert!(fs::read(m.path(p)).unwrap() == *d, "{p}");
    }
    assert_eq!(m.stat("checksum_failures"), 1);
    // The corrupted chunk and the file with the torn header came from backing again.
    assert_eq!(m.stat("bytes_from_backing"), (MIB + 3 * MIB) as u64);
    assert!(!stray.exists());
}

/// Flips bytes in every cached file under `ssd`, as another process on the NVMe would: one
/// (at a third of the file on the first pass, two thirds on the second) in each data file, and
/// one in each written page of each segment (packed files start on pages: every one of them
/// gets one). Returns how many files and segment pages.
fn flip_every_cached_file(ssd: &std::path::Path, pass: u64) -> usize {
    let open = |path: &std::path::Path| {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    };
    let flip = |f: &File, at: u64| {
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
    };
    let mut flipped = 0;
    for dir in fs::read_dir(ssd.join("data")).unwrap() {
        let dir = dir.unwrap().path();
        for file in fs::read_dir(&dir).into_iter().flatten() {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|e| e == "dat") {
                let f = open(&path);
                let len = f.metadata().unwrap().len();
                flip(&f, len * pass / 3);
                flipped += 1;
            }
        }
    }
    for seg in fs::read_dir(ssd.join("segments")).into_iter().flatten() {
        let f = open(&seg.unwrap().path());
        let len = f.metadata().unwrap().len();
        for page in (0..len).step_by(4096) {
            // The smallest file here is 3 KiB; a page never written reads zeros.
            let at = page + 1000 * pass;
            let mut probe = [0u8; 8];
            if at + 8 <= len && f.read_exact_at(&mut probe, at).is_ok() && probe != [0; 8] {
                flip(&f, at);
                flipped += 1;
            }
        }
    }
    flipped
}

/// The files of `files` that read other than their backing bytes.
fn served_changed(m: &Mounted, files: &[(String, Vec<u8>)]) -> Vec<String> {
    files
        .iter()
        .filter(|(p, d)| fs::read(m.path(p)).unwrap_or_else(|e| panic!("{p}: {e}")) != *d)
        .map(|(p, _)| p.clone())
        .collect()
}

/// A cache file changed behind the daemon is never served changed, also after a chunk of it
/// was once found bad and refetched: the fill that repaired it remembers the data file's ctime,
/// so a change while mounted after the repair is seen at the next open. (The files repaired by
/// their one read were remembered at their next open instead, after the change: 70 of these
/// 103 were served changed.) With `--no-passthrough` too, where small files are packed in
/// segments.
#[test]
fn a_cache_file_changed_again_after_a_repair_is_never_served_changed() {
    for (i, mode) in MODES.iter().enumerate() {
        let f = Fixture::new(&format!("rechange{i}"));
        let mut files: Vec<(String, Vec<u8>)> = (0..100)
            .map(|k| {
                let len = 3 * 1024 + k * 1500 + (k % 7) * 9000;
                (format!("s/{k:03}.bin"), pattern(len, 300 + k as u64))
            })
            .collect();
        for (k, len) in [CHUNK + 5, 3 * CHUNK, 5 * CHUNK + 777]
            .into_iter()
            .enumerate()
        {
            files.push((format!("large{k}.bin"), pattern(len, 400 + k as u64)));
        }
        for (p, d) in &files {
            f.write(p, d);
        }
        let m = f.mount(mode);
        assert_eq!(served_changed(&m, &files), Vec::<String>::new(), "{mode:?}");
        m.unmount();

        assert!(flip_every_cached_file(&f.ssd, 1) >= files.len());
        let m = f.mount(mode);
        let changed = served_changed(&m, &files);
        assert_eq!(changed, Vec::<String>::new(), "{mode:?}: changed unmounted");
        assert_eq!(m.stat("checksum_failures"), files.len() as u64, "{mode:?}");

        assert!(flip_every_cached_file(&f.ssd, 2) >= files.len());
        fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
        let changed = served_changed(&m, &files);
        assert!(
            changed.is_empty(),
            "{mode:?}: changed while mounted after a repair: {} of {} served changed: {changed:?}",
            changed.len(),
            files.len()
        );
        assert_eq!(m.stat("checksum_failures"), 2 * files.len() as u64);
        m.unmount();
    }
}

#[test]
fn a_changed_backing_file_is_served_fresh() {
    for (i, mode) in MODES.iter().enumerate() {
        let f = Fixture::new(&format!("change{i}"));
        f.write("f.bin", &pattern(MIB, 1));
        f.write("big.bin", &pattern(12 * MIB, 2));
        let m = f.mount(&[mode, &["--metadata-ttl", "500ms"][..]].concat());
        assert!(fs::read(m.path("f.bin")).unwrap() == pattern(MIB, 1));
        assert!(fs::read(m.path("big.bin")).unwrap() == pattern(12 * MIB, 2));
        assert!(fs::read(m.path("f.bin")).unwrap() == pattern(MIB, 1));
        std::thread::sleep(Duration::from_millis(20)); // a new mtime, past the clock's tick
        f.write("f.bin", &pattern(MIB, 3)); // same size, new content and mtime
        f.write("big.bin", &pattern(5 * MIB, 4)); // shrunk
        std::thread::sleep(Duration::from_millis(700)); // the 500 ms TTL runs out: the thing tested
        assert!(fs::read(m.path("f.bin")).unwrap() == pattern(MIB, 3));
        assert!(fs::read(m.path("big.bin")).unwrap() == pattern(5 * MIB, 4));
        assert_eq!(
            fs::metadata(m.path("big.bin")).unwrap().len(),
            5 * MIB as u64
        );
    }
}

/// Within the metadata TTL, an open of a cached backing file does not go to the shared file
/// system (a metadata round trip per open on Lustre): a file removed there is still served
/// from the cache until the TTL has passed, then it is gone.
#[test]
fn opens_within_the_ttl_do_not_ask_the_shared_fs() {
    let f = Fixture::new("ttlopen");
    f.write("f.bin", &pattern(MIB, 5));
    let m = f.mount(&["--metadata-ttl", "2s"]);
    assert!(fs::read(m.path("f.bin")).unwrap() == pattern(MIB, 5));
    fs::remove_file(f.backing.join("f.bin")).unwrap();
    assert!(fs::read(m.path("f.bin")).unwrap() == pattern(MIB, 5));
    assert_eq!(m.stat("local_hits"), 1);
    std::thread::sleep(Duration::from_millis(2200)); // the 2 s TTL runs out: the thing tested
    let e = fs::read(m.path("f.bin")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    m.unmount();
}

/// Once the kernel forgets a file's inode (its dentries dropped here; memory pressure or the
/// inode bound on a training node), looking the name up again within the metadata TTL asks the
/// shared file system nothing: the daemon remembers the stats it made (`--backing-stat-cache`).
/// With that off, the lookups ask again.
#[test]
fn a_name_the_kernel_forgot_is_looked_up_again_without_the_shared_fs() {
    for (i, remember) in [true, false].into_iter().enumerate() {
        let f = Fixture::new(&format!("forgot{i}"));
        f.write("d/f.bin", &pattern(64 << 10, 7));
        let m = f.mount(if remember {
            &[]
        } else {
            &["--backing-stat-cache", "0"]
        });
        assert!(fs::read(m.path("d/f.bin")).unwrap() == pattern(64 << 10, 7));
        let (inodes, asked) = (m.stat("inodes"), m.stat("backing_stats"));
        assert!(inodes >= 3, "the root, d and d/f.bin: {inodes}");
        fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        wait_until(
            "the kernel forgets d and d/f.bin once its dentries are dropped",
            Duration::from_secs(30),
            || m.stat("inodes") <= 1,
        );
        assert!(fs::read(m.path("d/f.bin")).unwrap() == pattern(64 << 10, 7));
        let (asked_again, remembered) = (
            m.stat("backing_stats") - asked,
            m.stat("backing_stats_remembered"),
        );
        if remember {
            assert_eq!(asked_again, 0, "the shared FS was asked again");
            assert!(remembered >= 2, "d and d/f.bin remembered: {remembered}");
        } else {
            assert!(asked_again >= 2, "d and d/f.bin asked again: {asked_again}");
            assert_eq!(remembered, 0);
        }
        m.unmount();
    }
}

#[test]
fn large_directory_lists_completely() {
    let f = Fixture::new("bigdir");
    let dir = f.backing.join("many");
    fs::create_dir_all(&dir).unwrap();
    for k in 0..20_000 {
        File::create(dir.join(format!("sample_{k:06}.npz"))).unwrap();
    }
    let m = f.mount(&[]);
    let t = Instant::now();
    let n = fs::read_dir(m.path("many")).unwrap().count();
    assert_eq!(n, 20_000);
    // Listed entries stat as the backing files do (each through a lookup).
    for e in fs::read_dir(m.path("many")).unwrap().take(100) {
        assert_eq!(e.unwrap().metadata().unwrap().len(), 0);
    }
    eprintln!("listed 20000 entries in {:?}", t.elapsed());
}

/// Every path under `root`, as `find` lists them, sorted.
fn walk(root: &std::path::Path) -> Vec<String> {
    let out = Command::new("find")
        .arg(".")
        .current_dir(root)
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut paths: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    paths.sort();
    paths
}

#[test]
fn a_walk_lists_the_backing_tree_with_directories_read_ahead() {
    let f = Fixture::new("walk");
    for d in 0..30 {
        for s in 0..4 {
            let dir = f.backing.join(format!("d{d:02}/s{s}"));
            fs::create_dir_all(&dir).unwrap();
            for k in 0..10 {
                File::create(dir.join(format!("f{k}"))).unwrap();
            }
        }
    }
    let want = walk(&f.backing);
    assert_eq!(want.len(), 1 + 30 + 120 + 1200);
    let m = f.mount(&[]);
    assert_eq!(walk(&m.path("")), want);
    // The walk's next directories were listed while `find` worked through the current one.
    let ahead = m.stat("dirs_read_ahead");
    assert!(ahead > 0, "no listing was read ahead");
    eprintln!("{ahead} of 150 directories read ahead");
    // An `ls` of one directory reads nothing ahead (once what the walk left is stale).
    std::thread::sleep(Duration::from_millis(2100)); // what the walk left goes stale (2 s)
    fs::read_dir(m.path("d29/s3")).unwrap().count();
    assert_eq!(m.stat("dirs_read_ahead"), ahead);
    assert_eq!(walk(&m.path("")), want);
    m.unmount();
}

#[test]
fn signals_unmount_cleanly_and_exit_zero() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let f = Fixture::new(&format!("sig{sig}"));
        f.write("x", b"x");
        let mut child = dyadfs()
            .arg("mount")
            .arg(&f.mnt)
            .args(["--foreground", "--ssd"])
            .arg(&f.ssd)
            .arg("--backing")
            .arg(&f.backing)
            .spawn()
            .unwrap();
        wait_until("mounted", Duration::from_secs(10), || is_mounted(&f.mnt));
        assert_eq!(fs::read(f.mnt.join("x")).unwrap(), b"x");
        // SAFETY: signalling the child this test started.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait().unwrap();
        assert!(status.success(), "exit status {status:?}");
        assert!(!is_mounted(&f.mnt));
    }
}

fn expect_error(out: std::process::Output, culprit: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {culprit}");
    assert!(
        err.contains(culprit),
        "error {err:?} does not name {culprit:?}"
    );
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.contains(culprit),
        "first line {first:?} does not name {culprit:?}"
    );
}

#[test]
fn bad_input_is_refused_and_nothing_is_mounted() {
    let f = Fixture::new("bad");
    f.write("x", b"x");
    let run = |mnt: &std::path::Path,
               ssd: &std::path::Path,
               backing: &std::path::Path,
               extra: &[&str]| {
        dyadfs()
            .arg("mount")
            .arg(mnt)
            .arg("--ssd")
            .arg(ssd)
            .arg("--backing")
            .arg(backing)
            .args(extra)
            .output()
            .unwrap()
    };
    let (mnt, ssd, backing) = (&f.mnt, &f.ssd, &f.backing);
    let missing = f.root.join("missing");
    expect_error(run(&missing, ssd, backing, &[]), "does not exist");
    let file = f.root.join("a-file");
    fs::write(&file, b"").unwrap();
    expect_error(run(&file, ssd, backing, &[]), "not a directory");
    let full = f.root.join("full");
    fs::create_dir_all(full.join("something")).unwrap();
    expect_error(run(&full, ssd, backing, &[]), "not empty");
    expect_error(run(mnt, &file.join("cache"), backing, &[]), "cache dir");
    expect_error(run(mnt, ssd, &missing, &[]), "backing dir");
    expect_error(run(mnt, ssd, &file, &[]), "backing dir");
    expect_error(run(mnt, ssd, backing, &["--capacity", "12Q"]), "12Q");
    expect_error(run(mnt, ssd, backing, &["--capacity", "lots"]), "lots");
    expect_error(run(mnt, ssd, backing, &["--replicate"]), "--replicate");
    // No /dev/fuse: a private mount namespace with an empty /dev.
    let out = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs none /dev && exec \"$0\" \"$@\"",
        ])
        .arg(env!("CARGO_BIN_EXE_dyadfs"))
        .arg("mount")
        .arg(mnt)
        .arg("--ssd")
        .arg(ssd)
        .arg("--backing")
        .arg(backing)
        .output()
        .unwrap();
    expect_error(out, "/dev/fuse");
    assert!(!is_mounted(mnt));

    let m = f.mount(&[]);
    expect_error(run(mnt, ssd, backing, &[]), "already mounted");
    // Another mount point over the same cache dir.
    let mnt2 = f.root.join("mnt2");
    fs::create_dir_all(&mnt2).unwrap();
    expect_error(run(&mnt2, ssd, backing, &[]), "in use");
    assert!(!is_mounted(&mnt2));
    // Stats of something that is not a dyadfs mount.
    let out = dyadfs().arg("stats").arg(&f.root).output().unwrap();
    expect_error(out, "not a dyadfs mount");
    m.unmount();
    assert!(!is_mounted(mnt));
}

/// Reads every file with 4 threads at once; returns the paths that failed or differed.
fn read_all_parallel(m: &Mounted, files: &[(String, Vec<u8>)]) -> Vec<String> {
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    files
                        .iter()
                        .skip(t)
                        .step_by(4)
                        .filter(|(p, d)| fs::read(m.path(p)).ok().as_ref() != Some(d))
                        .map(|(p, _)| p.clone())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    })
}

/// A scan that stats what it lists (`for e in os.scandir(d): e.stat()`) gets the entries'
/// attributes with the listing (READDIRPLUS) instead of one LOOKUP per entry; a walk that
/// stats nothing gets none; the kernel's references to the entries are counted, so dropping
/// its dentries forgets them in the daemon too.
#[test]
fn a_scan_that_stats_gets_attributes_with_the_listing_and_a_walk_does_not() {
    use std::os::unix::fs::MetadataExt;
    let f = Fixture::new("rdplus");
    for k in 0..3000u64 {
        f.write(&format!("wide/w{k:05}"), &pattern(1 + k as usize % 500, k));
    }
    let m = f.mount(&[]);
    // A walk: names and types only.
    assert_eq!(walk(&m.path("")).len(), 3000 + 2);
    assert_eq!(m.stat("listed_with_attrs"), 0);
    let inodes = m.stat("inodes");
    // A scan that stats each entry as it lists it (std's ReadDir reads a buffer at a time).
    let mut seen = 0;
    for e in fs::read_dir(m.path("wide")).unwrap() {
        let e = e.unwrap();
        let got = e.metadata().unwrap();
        let want = fs::metadata(f.backing.join("wide").join(e.file_name())).unwrap();
        assert_eq!((got.len(), got.mtime()), (want.len(), want.mtime()));
        assert!(got.is_file());
        seen += 1;
    }
    assert_eq!(seen, 3000);
    let listed = m.stat("listed_with_attrs");
    eprintln!("{listed} of 3000 entries came with the listing");
    assert!(listed > 1500, "only {listed} entries came with attributes");
    // Every entry given with attributes is a reference the kernel gives back.
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    wait_until("inodes given back", Duration::from_secs(30), || {
        m.stat("inodes") <= inodes + 10
    });
    // Everything listed first, then a stat each (lookups in listing order, read ahead); the
    // inode number a listing shows is the one the stat gives.
    use std::os::unix::fs::DirEntryExt;
    // (Names and numbers only: a std DirEntry keeps its directory open.)
    let listed: Vec<_> = fs::read_dir(m.path("wide"))
        .unwrap()
        .map(|e| e.map(|e| (e.file_name(), e.ino())).unwrap())
        .collect();
    assert_eq!(listed.len(), 3000);
    for (name, ino) in &listed {
        let got = fs::metadata(m.path("wide").join(name)).unwrap();
        let want = fs::metadata(f.backing.join("wide").join(name)).unwrap();
        assert_eq!((got.len(), got.mtime()), (want.len(), want.mtime()));
        assert_eq!(*ino, got.ino(), "{name:?}: d_ino is not st_ino");
    }
    m.unmount();
}

/// A real dataset has far more files than the usual descriptor limit (the daemon once failed
/// every open with EIO past ~1,000 cached files under `ulimit -n 1024`): 2,000 files through a
/// daemon limited to 128 descriptors, read by 4 threads at once, then again after a restart,
/// all without an error, with the daemon's descriptors under the limit and its inode table
/// under `--max-inodes`.
#[test]
fn more_files_than_descriptors_are_cached_and_served_after_a_restart() {
    const NOFILE: u32 = 128;
    for (i, mode) in MODES.iter().enumerate() {
        let f = Fixture::new(&format!("nofile{i}"));
        let files: Vec<(String, Vec<u8>)> = (0..2000u64)
            .map(|k| {
                let len = 1000 + (k as usize % 7) * 1500;
                (format!("d{}/f{k}.bin", k % 20), pattern(len, k))
            })
            .collect();
        for (p, d) in &files {
            f.write(p, d);
        }
        let fds = |m: &Mounted| fs::read_dir(format!("/proc/{}/fd", m.pid)).unwrap().count();
        // What the descriptors point at, by kind, for the message of a failed bound.
        let fd_kinds = |m: &Mounted| {
            let mut kinds = std::collections::BTreeMap::<String, usize>::new();
            for e in fs::read_dir(format!("/proc/{}/fd", m.pid))
                .unwrap()
                .flatten()
            {
                let target = fs::read_link(e.path()).map(|t| t.display().to_string());
                let kind = match target {
                    // Cache files are counted together (data/<2 hex digits>/<file>).
                    Ok(t) if t.starts_with('/') => match t.rsplit_once("/data/") {
                        Some((ssd, _)) => format!("{ssd}/data/*"),
                        None => t,
                    },
                    Ok(t) => t.split(':').next().unwrap_or_default().to_string(),
                    Err(_) => "closed meanwhile".to_string(),
                };
                *kinds.entry(kind).or_default() += 1;
            }
            kinds
        };
        // The inode table is bounded too: past --max-inodes the kernel is asked to forget.
        let args: Vec<&str> = mode
            .iter()
            .copied()
            .chain(["--max-inodes", "1024"])
            .collect();
        let m = f.mount_limited(&args, NOFILE);
        assert_eq!(read_all_parallel(&m, &files), Vec::<String>::new());
        assert_eq!(m.stat("cached_files"), files.len() as u64);
        assert!(
            fds(&m) < NOFILE as usize,
            "{} descriptors open: {:?}",
            fds(&m),
            fd_kinds(&m)
        );
        // (The kernel forgets asynchronously: slower on a loaded machine.)
        wait_until("inodes shed to the bound", Duration::from_secs(30), || {
            m.stat("inodes") <= 1024
        });
        // Forgotten inodes come back on the next lookup.
        assert_eq!(read_all_parallel(&m, &files[..500]), Vec::<String>::new());
        m.unmount();
        let m = f.mount_limited(mode, NOFILE);
        assert_eq!(read_all_parallel(&m, &files), Vec::<String>::new());
        assert_eq!(m.stat("backing_fetches"), 0);
        assert!(m.stat("local_hits") >= files.len() as u64);
        assert!(
            fds(&m) < NOFILE as usize,
            "{} descriptors open: {:?}",
            fds(&m),
            fd_kinds(&m)
        );
        m.unmount();
    }
}

/// A cache disk that fills up (a small tmpfs under a larger `--capacity`, as when other users
/// share it) serves every read anyway, uncached, instead of failing with EIO.
#[test]
fn a_full_cache_disk_serves_reads_uncached() {
    let f = Fixture::new("enospc");
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=6m,mode=0700", "tmpfs"])
        .arg(&f.ssd)
        .status()
        .unwrap();
    assert!(st.success(), "mounting a tmpfs for the cache");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _tmpfs = Unmount(f.ssd.clone());
    let files: Vec<(String, Vec<u8>)> = (0..12)
        .map(|k| (format!("f{k}"), pattern(MIB + 4096 * k, 300 + k as u64)))
        .collect();
    for (p, d) in &files {
        f.write(p, d);
    }
    let m = f.mount(&["--capacity", "1G"]);
    for _ in 0..2 {
        for (p, d) in &files {
            let got = fs::read(m.path(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
            assert!(got == *d, "{p} differs");
        }
    }
    assert!(m.stat("uncached_reads") > 0, "the disk never filled up");
    m.unmount();
}

/// A mount that is refused leaves nothing behind it did not find: a cache dir inside the mount
/// point (it left `inside/managed-root`, so the corrected mount failed with "not empty"), a
/// cache dir under a directory that does not exist (the whole chain was created and mounted),
/// a bad peers file and a missing secret (the cache dir was created). Each is one line.
#[test]
fn a_refused_mount_leaves_nothing_behind() {
    let f = Fixture::new("refused-clean");
    let refused = |ssd: &std::path::Path, extra: &[&str], says: &str| {
        let out = dyadfs()
            .arg("mount")
            .arg(&f.mnt)
            .arg("--ssd")
            .arg(ssd)
            .args(extra)
            .output()
            .unwrap();
        refused_in_one_line(&out, &f.mnt, &[says]);
        assert_eq!(
            fs::read_dir(&f.mnt).unwrap().count(),
            0,
            "the mount point was written"
        );
        assert!(!ssd.exists(), "{} was created", ssd.display());
    };
    refused(&f.mnt.join("inside"), &[], "inside the mount point");
    let nowhere = f.root.join("nonexistent/deeper/x");
    refused(&nowhere, &[], "nonexistent");
    assert!(!f.root.join("nonexistent").exists());
    let peers = f.root.join("peers");
    fs::write(&peers, "0 127.0.0.1:1 r0\n0 127.0.0.1:2 r0\n").unwrap();
    let fresh = f.root.join("fresh");
    let p = peers.to_str().unwrap();
    refused(
        &fresh,
        &["--peers", p, "--node-id", "0", "--insecure"],
        "peers file",
    );
    fs::write(&peers, "0 127.0.0.1:1 r0\n1 127.0.0.1:2 r0\n").unwrap();
    refused(&fresh, &["--peers", p, "--node-id", "0"], "--secret-file");
    // Values outside their range, and a cluster's options on a single node, were accepted
    // silently (`--wait 3h` capped at 1h, `--capacity 0`, a key file that does not exist).
    refused(
        &fresh,
        &["--listen", "127.0.0.1:9"],
        "--listen is for a cluster",
    );
    let missing = f.root.join("no-such.key");
    refused(
        &fresh,
        &["--secret-file", missing.to_str().unwrap()],
        "no-such.key",
    );
    for (arg, says) in [(["--wait", "3h"], "1h"), (["--capacity", "0"], "above 0")] {
        let out = dyadfs()
            .arg("mount")
            .arg(&f.mnt)
            .arg("--ssd")
            .arg(&fresh)
            .args(arg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            !out.status.success() && err.contains(says),
            "{arg:?}: {err}"
        );
        assert!(!fresh.exists() && !is_mounted(&f.mnt));
    }
    // And the corrected mount works.
    f.mount_managed(&fresh).unmount();
}

/// A mount point whose daemon was SIGKILLed is reported dead, with the command that clears
/// it, by every mount attempt on it (the second attempt said "already mounted": a stat was
/// answered from what the kernel kept); after `fusermount3 -u` the mount works again.
#[test]
fn a_dead_mount_is_always_reported_dead() {
    let f = Fixture::new("dead-mount");
    let m = f.mount(&[]);
    // SAFETY: killing the daemon this test started.
    unsafe { libc::kill(m.pid as i32, libc::SIGKILL) };
    wait_gone(m.pid);
    for attempt in 0..2 {
        let out = f.try_mount(&[]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "attempt {attempt} mounted: {err}");
        assert!(
            err.contains("dead FUSE mount") && err.contains("fusermount3 -u"),
            "attempt {attempt}: {err}"
        );
    }
    // `dyadfs stats` on it says the same (it said "Transport endpoint is not connected").
    let out = dyadfs().arg("stats").arg(&f.mnt).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && err.contains("dead FUSE mount"),
        "{err}"
    );
    std::mem::forget(m);
    succeeded(
        "fusermount3 -u",
        std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&f.mnt)
            .output()
            .unwrap(),
    );
    f.mount(&[]).unmount();
}

/// The daemon's descriptor table is sized for 65,536 descriptors (or its limit) from the start,
/// so no open of a lookup waits for the kernel to grow it (an RCU grace period, 15-30 ms on a
/// 16-core host, each time the count crossed a power of two).
#[test]
fn the_daemons_descriptor_table_is_sized_at_start() {
    let f = Fixture::new("fdsize");
    let m = f.mount(&[]);
    let proc_field = |file: &str, key: &str| -> u64 {
        let text = fs::read_to_string(format!("/proc/{}/{file}", m.pid)).unwrap();
        let line = text.lines().find(|l| l.starts_with(key)).unwrap();
        line[key.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let limit = proc_field("limits", "Max open files");
    let size = proc_field("status", "FDSize:");
    assert!(size >= limit.min(1 << 16), "FDSize {size}, limit {limit}");
    m.unmount();
}
