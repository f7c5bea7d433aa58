//! Sizes nobody else bounds (issue 31): a producer's sparse file, a daemon asked to stop
//! while requests are held, and a produced directory whose listing is past the frame limit.
//! Each operation that could hang runs on its own thread under a timeout, so a regression
//! fails the test instead of hanging it.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::IntoRawFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

/// `close(fd)`'s errno (0: it succeeded): the flush that seals a produced file reports there.
fn close(file: File) -> i32 {
    // SAFETY: the descriptor is ours (taken out of `file`) and closed once.
    if unsafe { libc::close(file.into_raw_fd()) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    }
}

/// `truncate -s 10T` of a file being written is refused at the truncate (no cache could hold
/// it), instead of being sealed at close by checksumming 10 TiB of zeros while the writer sits
/// in uninterruptible sleep; the file keeps what was written and publishes it.
#[test]
fn a_produced_file_larger_than_the_cache_fails_at_its_truncate() {
    let f = Fixture::new("sizes-huge");
    let m = f.mount_managed_with(&f.ssd, &["--capacity", "256M"]);
    let path = m.path("huge");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut file = File::create(&path).unwrap();
        file.write_all(b"x").unwrap();
        let truncated = file.set_len(10 << 40).map_err(|e| e.raw_os_error());
        tx.send(("truncate", truncated.err().flatten().unwrap_or(0)))
            .unwrap();
        tx.send(("close", close(file))).unwrap();
    });
    let within = Duration::from_secs(10);
    let truncate = rx.recv_timeout(within).expect("the truncate returns");
    assert!(
        matches!(truncate.1, libc::EFBIG | libc::ENOSPC),
        "truncate to 10 TiB: errno {}",
        truncate.1
    );
    assert_eq!(
        rx.recv_timeout(within).expect("the close returns"),
        ("close", 0)
    );
    assert_eq!(fs::read(m.path("huge")).unwrap(), b"x");
    assert!(m.stat("cached_bytes") <= 256 << 20);
}

/// A sparse file within the capacity is sealed at once: its holes cost nothing to checksum.
#[test]
fn a_sparse_produced_file_seals_at_once() {
    let f = Fixture::new("sizes-sparse");
    let m = f.mount_managed_with(&f.ssd, &["--capacity", "40G"]);
    let path = m.path("sparse");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut file = File::create(&path).unwrap();
        file.write_all(b"head").unwrap();
        file.set_len(32 << 30).unwrap();
        let t = Instant::now();
        let errno = close(file);
        tx.send((errno, t.elapsed())).unwrap();
    });
    let (errno, took) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the close returns");
    assert_eq!(errno, 0);
    println!("sealing 32 GiB of holes took {took:?}");
    assert_eq!(fs::metadata(m.path("sparse")).unwrap().len(), 32 << 30);
}

/// Whether process `pid` has exited (gone, or a zombie its parent has not reaped).
fn exited(pid: u32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty() || stat.split(' ').nth(2) == Some("Z")
}

/// SIGTERM stops the daemon within seconds even while the mount is busy (a plain unmount says
/// EBUSY) and a FUSE request is held (a reader's open waiting for a producer; a `stat` would
/// not wait): the mount is detached and the requests still running are cut after a grace
/// period.
#[test]
fn sigterm_stops_a_busy_daemon_within_seconds() {
    let f = Fixture::new("sizes-term");
    let m = f.mount_managed_with(&f.ssd, &["--wait", "60s"]);
    let busy = File::open(&m.mnt).unwrap();
    let missing = m.path("never-produced");
    std::thread::spawn(move || {
        let _ = File::open(missing);
    });
    wait_until("the open waits", Duration::from_secs(10), || {
        m.stat("name_waits") >= 1
    });
    let t = Instant::now();
    // SAFETY: a signal to the daemon this test started.
    assert_eq!(unsafe { libc::kill(m.pid as i32, libc::SIGTERM) }, 0);
    wait_until("the daemon exits", Duration::from_secs(15), || {
        exited(m.pid)
    });
    println!("the daemon exited {:?} after SIGTERM", t.elapsed());
    assert!(!is_mounted(Path::new(&m.mnt)));
    drop(busy);
}

/// Writes `total` bytes of `a` to `path` as uid (and gid) `uid`, `step` bytes a write, stopping
/// at the first failed write; prints `WRITTEN ERRNO`, then waits for a line on stdin before it
/// closes the file (held open, the file stays staged) and prints close's errno.
fn writer_as(uid: u32, path: &Path, total: usize, step: usize) -> std::process::Child {
    const SCRIPT: &str = r#"
import os, sys
path, total, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
off, err = 0, 0
while off < total:
    try:
        off += os.write(fd, b"a" * min(step, total - off))
    except OSError as e:
        err = e.errno
        break
print(off, err, flush=True)
sys.stdin.readline()
try:
    os.close(fd)
    print(0, flush=True)
except OSError as e:
    print(e.errno, flush=True)
"#;
    as_user(uid, uid)
        // Debian's (scripts/install-deps.sh): a python3 found first on root's PATH may live
        // where the other uid cannot reach it.
        .args(["/usr/bin/python3", "-c", SCRIPT])
        .arg(path)
        .args([total.to_string(), step.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A line the writer printed, as numbers.
fn line_of(out: &mut impl std::io::BufRead) -> Vec<u64> {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    line.split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect()
}

/// Writes as `uid` and closes at once: (bytes written, the failed write's errno, close's).
fn write_as(uid: u32, path: &Path, total: usize) -> (u64, u64, u64) {
    let mut child = writer_as(uid, path, total, 64 << 10);
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let (w, c) = (line_of(&mut out), line_of(&mut out));
    assert!(child.wait().unwrap().success());
    (w[0], w[1], c[0])
}

/// `--max-staged-per-user` (issue 31): the daemon writes produced files as root, past their
/// writer's disk quota. User A's write that would cross the cap fails there with EDQUOT, not at
/// close; user B writes on meanwhile. A's file, refused a write, is failed: its close says
/// EDQUOT and it is never published (issue 69: it was, with its first MiB, read as whole).
/// What A published here counts until it is removed.
#[test]
fn a_user_past_the_staged_cap_gets_edquot_at_the_crossing_write() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const A: u32 = 60001;
    const B: u32 = 60002;
    let f = Fixture::new("sizes-quota");
    let m = f.mount_managed_with(
        &f.ssd,
        &["-o", "allow_other", "--max-staged-per-user", "1M"],
    );
    let jobs = m.path("jobs");
    fs::create_dir(&jobs).unwrap();
    fs::set_permissions(&jobs, fs::Permissions::from_mode(0o1777)).unwrap();

    let mut a = writer_as(A, &jobs.join("a.bin"), 2 << 20, 64 << 10);
    let mut a_out = std::io::BufReader::new(a.stdout.take().unwrap());
    assert_eq!(line_of(&mut a_out), [1 << 20, libc::EDQUOT as u64]);
    // A's file is still open (staged, 1 MiB held against A): B is not held by it.
    assert_eq!(
        write_as(B, &jobs.join("b.bin"), 768 << 10),
        (768 << 10, 0, 0)
    );
    a.stdin.take().unwrap().write_all(b"\n").unwrap();
    assert_eq!(line_of(&mut a_out), [libc::EDQUOT as u64], "A's close");
    assert!(a.wait().unwrap().success());
    // (Listed, not stat'ed: the kernel may keep the created name for its 1 s TTL.)
    assert_eq!(
        listed(&jobs),
        ["b.bin"],
        "a file refused a write is never published"
    );
    assert_eq!(fs::read(jobs.join("b.bin")).unwrap().len(), 768 << 10);

    // The failed file holds nothing against A; a published one counts until removed.
    assert_eq!(write_as(A, &jobs.join("a1.bin"), 1 << 20), (1 << 20, 0, 0));
    assert_eq!(fs::metadata(jobs.join("a1.bin")).unwrap().uid(), A);
    assert_eq!(
        write_as(A, &jobs.join("a2.bin"), 1 << 10),
        (0, libc::EDQUOT as u64, libc::EDQUOT as u64)
    );
    fs::remove_file(jobs.join("a1.bin")).unwrap();
    // (Another name: the kernel keeps the failed a2.bin's entry for its 1 s TTL.)
    assert_eq!(write_as(A, &jobs.join("a3.bin"), 1 << 20), (1 << 20, 0, 0));
    assert_eq!(m.stat("quota_refusals"), 2);
}

/// Issue 69: a producer's write refused for its size fails the file as a disk error does: the
/// writer gets the errno at the write and again at close, and no node ever sees the file (a
/// consumer with `--wait` on another node would have read its first part as the whole file).
/// EFBIG: past the cache's capacity; ENOSPC: past what the capacity leaves beside the files this
/// node keeps. (ENOSPC and EIO from the disk itself: `cache_disk`'s
/// `a_produced_file_that_fails_keeps_no_bytes`.)
#[test]
fn a_produced_file_refused_a_write_is_never_published() {
    let mut c = Cluster::new("sizes-refused", 2);
    c.managed = true;
    c.extra = ["--capacity", "4M", "--wait", "3s"]
        .map(String::from)
        .to_vec();
    c.start(2);
    let (producer, consumer) = (&c.nodes[0], &c.nodes[1]);
    let write = |name: &str, size: usize| -> (Option<i32>, i32) {
        let mut file = File::create(producer.path(name)).unwrap();
        let mut refused = None;
        for _ in 0..size / (512 << 10) {
            if let Err(e) = file.write_all(&vec![7u8; 512 << 10]) {
                refused = e.raw_os_error();
                break;
            }
        }
        (refused, close(file))
    };
    // A consumer already waits for the name on the other node.
    let waiter = {
        let path = consumer.path("big");
        std::thread::spawn(move || fs::read(path).map_err(|e| e.raw_os_error()))
    };
    assert_eq!(write("big", 8 << 20), (Some(libc::EFBIG), libc::EFBIG));
    assert_eq!(write("kept", 3 << 20), (None, 0));
    assert_eq!(write("over", 2 << 20), (Some(libc::ENOSPC), libc::ENOSPC));
    // (Listed, not stat'ed: the kernel may keep the created name for its 1 s TTL.)
    for (node, m) in c.nodes.iter().enumerate() {
        assert_eq!(listed(&m.mnt), ["kept"], "node {node}");
    }
    assert_eq!(
        waiter.join().unwrap(),
        Err(Some(libc::ENOENT)),
        "the consumer's open fails at its deadline"
    );
    assert_eq!(fs::read(consumer.path("kept")).unwrap(), vec![7u8; 3 << 20]);
}

/// The node that is name home of directory `dir` of cluster `c`.
fn name_home(c: &Cluster, dir: &str) -> usize {
    let peers = fs::read_to_string(&c.peers).unwrap();
    let m = dyadfs::locator::Membership::parse(&peers, 0).unwrap();
    m.global_home(dir) as usize
}

/// What `dir` lists, sorted.
fn listed(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// A produced directory whose listing is past the frame limit (16 MiB) lists whole on every
/// node, a page at a time (at most 1 MiB each), and again after its name home restarts (its
/// backup gives the names back in batches within the same bound). Before, the home's one
/// reply was refused by the lister, which then took the home for dead for 30 s (the directory,
/// and every name that home keeps, were ENOENT there), and the restarted home got no name
/// back. The names are 255 bytes; each is a symlink with a 3,800-byte target, so
/// 5,000 of them make 20 MB of listing in seconds. DYADFS_TEST_NAMES=N sets how many, and
/// DYADFS_TEST_TARGET=0 makes them fifos (names of 255 bytes and little else: about 330 bytes
/// of listing each).
#[test]
fn a_directory_past_the_frame_limit_lists_on_every_node() {
    let var = |k: &str, default: usize| std::env::var(k).map_or(default, |v| v.parse().unwrap());
    let (n, target) = (
        var("DYADFS_TEST_NAMES", 5_000),
        var("DYADFS_TEST_TARGET", 3_800),
    );
    let mut c = Cluster::new("bigdir", 3);
    c.start(3);
    let home = name_home(&c, "big");
    let producer = (home + 1) % 3;
    fs::create_dir(c.nodes[producer].path("big")).unwrap();
    let names: Vec<String> = (0..n).map(|i| format!("{i:0>255}")).collect();
    let t = Instant::now();
    std::thread::scope(|s| {
        for part in names.chunks(n.div_ceil(4)) {
            let dir = c.nodes[producer].path("big");
            let target = "t".repeat(target);
            s.spawn(move || {
                for name in part {
                    make(&dir.join(name), &target);
                }
            });
        }
    });
    println!("{n} names made in {:?}", t.elapsed());
    for (i, m) in c.nodes.iter().enumerate() {
        let t = Instant::now();
        let got = listed(&m.path("big"));
        println!("node {i} listed {} names in {:?}", got.len(), t.elapsed());
        assert!(got == names, "node {i} listed {} of {n} names", got.len());
    }
    // The home restarts with empty tables; its backup gives the names back.
    c.nodes.remove(home).unmount();
    let t = Instant::now();
    c.start_node(home as u32);
    // (A second more per 10,000 names: a million take a while to list, once given back.)
    let within = Duration::from_secs(60 + n as u64 / 10_000);
    wait_until("the names are given back", within, || {
        listed(&c.nodes[home].path("big")).len() == n
    });
    println!(
        "the restarted home listed them again {:?} after its start",
        t.elapsed()
    );
    assert!(listed(&c.nodes[home].path("big")) == names);
}

/// A symlink to `target` at `path`, or a fifo when `target` is empty.
fn make(path: &Path, target: &str) {
    if !target.is_empty() {
        return std::os::unix::fs::symlink(target, path).unwrap();
    }
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    let r = unsafe { libc::mkfifo(p.as_ptr(), 0o644) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}
