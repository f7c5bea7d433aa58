//! Reads ahead of the sampler: `dyadfs prefetch` and `examples/python/dyadfs_prefetch.py` hand
//! a real mount a reading order; its threads fill the files a window ahead of the reader, from
//! the shared file system or from a peer over UCX.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Cluster, Fixture, Mounted, dyadfs, pattern, succeeded, wait_until};

fn prefetch(m: &Mounted, list: &Path) -> String {
    let out = dyadfs()
        .arg("prefetch")
        .arg(&m.mnt)
        .arg("--list")
        .arg(list)
        .output()
        .unwrap();
    succeeded("dyadfs prefetch", out)
}

/// Waits until `key` of `m` satisfies `done` (10 s at most); returns its value then.
fn wait_stat(m: &Mounted, key: &str, done: impl Fn(u64) -> bool) -> u64 {
    let mut v = 0;
    wait_until(key, Duration::from_secs(10), || {
        v = m.stat(key);
        done(v)
    });
    v
}

/// The threads fill the list's first files up to the window and stop there; an empty list
/// cancels; a reader moving through the list moves the window, and every file is read from the
/// shared file system exactly once, byte-exact.
#[test]
fn prefetch_fills_a_window_ahead_of_the_reader_in_list_order() {
    let f = Fixture::new("prefetch");
    let n = 200;
    let files: Vec<(String, Vec<u8>)> = (0..n)
        .map(|k| {
            (
                format!("d{}/f{k}.bin", k % 7),
                pattern(20_000 + k, k as u64),
            )
        })
        .collect();
    for (p, d) in &files {
        f.write(p, d);
    }
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    // The reading order: a fixed shuffle.
    let order: Vec<usize> = (0..n).map(|i| (i * 37 + 11) % n).collect();
    let m = f.mount(&["--prefetch-window", "20"]);
    let list = f.root.join("list");
    let mut text: String = order
        .iter()
        .map(|&i| format!("{}\n", m.path(&files[i].0).display()))
        .collect();
    text += "/etc/passwd\n../escape\n";
    fs::write(&list, text).unwrap();

    let out = prefetch(&m, &list);
    assert!(
        out.contains("queued 200 files") && out.contains("2 lines skipped"),
        "{out}"
    );
    assert_eq!(wait_stat(&m, "prefetched_files", |v| v >= 20), 20);
    // Nothing more comes in a while: the window holds the threads (an absence, so a time).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(m.stat("cached_files"), 20, "the window holds the threads");
    assert_eq!(m.stat("prefetch_pending"), 180);
    let out = prefetch(&m, Path::new("/dev/null"));
    assert!(out.contains("queued 0 files"), "{out}");
    assert_eq!(m.stat("prefetch_pending"), 0, "an empty list cancels");

    prefetch(&m, &list);
    for &i in &order {
        let (p, d) = &files[i];
        let got = fs::read(m.path(p)).unwrap();
        assert!(got == *d, "{p} differs");
    }
    let s = m.stats();
    assert_eq!(s["bytes_from_backing"], total, "each file read once: {s}");
    assert_eq!(s["backing_fetches"], n as u64, "{s}");
    assert!(s["local_hits"].as_u64().unwrap() >= 20, "{s}");
    assert_eq!(wait_stat(&m, "prefetch_pending", |v| v == 0), 0);
    m.unmount();
}

/// The Python helper around a sampler hands a node its order; the node pulls every file from
/// the peer that holds it before a read, then reads them all locally. Outside a mount the
/// helper warns and yields the order unchanged.
#[test]
fn the_python_helper_prefetches_from_a_peer() {
    let mut c = Cluster::new("prefetch-py", 2);
    let n = 40;
    let files: Vec<(String, Vec<u8>)> = (0..n)
        .map(|k| {
            (
                format!("train/s{k:02}.npz"),
                pattern(300_000 + k * 13, k as u64),
            )
        })
        .collect();
    for (p, d) in &files {
        let path = c.backing.join(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, d).unwrap();
    }
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    c.start(2);
    for (p, d) in &files {
        assert!(fs::read(c.nodes[0].path(p)).unwrap() == *d);
    }
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python");
    let script = r#"
import os, sys, warnings
sys.path.insert(0, sys.argv[1])
from dyadfs_prefetch import PrefetchSampler, mount_root

paths = sys.argv[3:]
order = [(i * 7 + 3) % len(paths) for i in range(len(paths))]

class Sampler:  # what a DistributedSampler looks like to the wrapper
    rank = 1
    def __iter__(self):
        return iter(order)
    def __len__(self):
        return len(order)
    def set_epoch(self, epoch):
        pass

assert mount_root(paths[0]) == os.path.realpath(sys.argv[2]), mount_root(paths[0])
s = PrefetchSampler(Sampler(), paths)
s.set_epoch(0)
assert list(s) == order and len(s) == len(order)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    outside = PrefetchSampler(Sampler(), ["/tmp/x%d" % i for i in range(len(paths))])
    assert list(outside) == order
    assert any("not available" in str(x.message) for x in w), [str(x.message) for x in w]
print("ok")
"#;
    let b = &c.nodes[1];
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&examples)
        .arg(&b.mnt)
        .args(files.iter().map(|(p, _)| b.path(p)))
        .output()
        .unwrap();
    assert_eq!(succeeded("python helper", out).trim(), "ok");
    assert_eq!(
        wait_stat(b, "prefetched_files", |v| v >= n as u64),
        n as u64
    );
    for (p, d) in &files {
        assert!(fs::read(b.path(p)).unwrap() == *d, "{p} differs");
    }
    let s = b.stats();
    assert_eq!(s["bytes_from_peers"], total, "{s}");
    assert_eq!(s["bytes_from_backing"], 0, "{s}");
    assert_eq!(s["local_hits"], n as u64, "every read was local: {s}");
    // Most came in batches from their one holder (a thread's last file may come alone).
    assert!(s["batched_pulls"].as_u64().unwrap() >= n as u64 / 2, "{s}");
}

/// Runs `dyadfs prefetch MNT --list -` as the unprivileged user nobody, the list on stdin.
fn prefetch_as_nobody(m: &Mounted, lines: &str) -> String {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = common::as_user(65534, 65534)
        .arg(env!("CARGO_BIN_EXE_dyadfs"))
        .arg("prefetch")
        .arg(&m.mnt)
        .args(["--list", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    succeeded(
        "dyadfs prefetch as nobody",
        child.wait_with_output().unwrap(),
    )
}

/// The daemon runs as root and fills what a list names: a plain user's list fills only what
/// that user may read through the mount (`allow_other`). A root-owned 0600 file and a file in
/// a directory the user cannot search are left alone and counted; the readable file is filled.
#[test]
fn a_list_fills_only_what_its_owner_may_read() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new("prefetch-rights");
    for p in ["public.bin", "private.bin", "closed/inside.bin"] {
        f.write(p, &pattern(30_000, 3));
    }
    let mode = |p: &str, m: u32| {
        fs::set_permissions(f.backing.join(p), fs::Permissions::from_mode(m)).unwrap()
    };
    mode("private.bin", 0o600);
    mode("closed", 0o700);
    let m = f.mount(&["-o", "allow_other"]);
    let out = prefetch_as_nobody(&m, "public.bin\nprivate.bin\nclosed/inside.bin\n");
    assert!(out.contains("queued 3 files"), "{out}");
    wait_until("the list to be done", Duration::from_secs(10), || {
        m.stat("prefetch_pending") == 0
            && m.stat("prefetched_files") + m.stat("prefetch_denied") == 3
    });
    let s = m.stats();
    assert_eq!(s["prefetch_denied"], 2, "{s}");
    assert_eq!(s["prefetched_files"], 1, "{s}");
    assert_eq!(s["cached_files"], 1, "only the readable file: {s}");
    // Root's own list still fills everything.
    prefetch(&m, &write_list(&f, &["private.bin", "closed/inside.bin"]));
    wait_until("root's list", Duration::from_secs(10), || {
        m.stat("cached_files") == 3
    });
    m.unmount();
}

fn write_list(f: &Fixture, lines: &[&str]) -> std::path::PathBuf {
    let list = f.root.join("list");
    fs::write(&list, lines.join("\n") + "\n").unwrap();
    list
}

/// A list stored on the mount itself is read through the mount: with a single FUSE thread
/// the request answers instead of waiting for itself.
#[test]
fn a_list_stored_on_the_mount_is_read_without_stopping_it() {
    let f = Fixture::new("prefetch-on-mount");
    f.write("a.bin", &pattern(10_000, 1));
    let m = f.mount(&["--threads", "1"]);
    let tmp = m.path("lists");
    fs::create_dir(&tmp).unwrap();
    let list = write_list(&f, &["a.bin"]);
    // The CLI copies the list into TMPDIR: here, the mount.
    // (SIGKILL: a process waiting on a stuck FUSE request does not die of SIGTERM.)
    let out = Command::new("timeout")
        .args(["-s", "KILL", "20"])
        .arg(env!("CARGO_BIN_EXE_dyadfs"))
        .arg("prefetch")
        .arg(&m.mnt)
        .arg("--list")
        .arg(&list)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let out = succeeded("dyadfs prefetch with its list on the mount", out);
    assert!(out.contains("queued 1 file "), "{out}");
    wait_until("the file to be filled", Duration::from_secs(10), || {
        m.stat("prefetched_files") == 1
    });
    m.unmount();
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`).
fn vm_kib(pid: u64, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    line.trim().trim_end_matches(" kB").parse().unwrap()
}

/// What a local user can make the daemon hold: a list with a 64 MiB line (a sparse-looking
/// list of one long line) has the line skipped, not held, while the plan waits at its window;
/// the daemon's memory does not grow by it. A list costing more than the bytes a user may have
/// held is refused, saying so.
#[test]
fn a_long_line_is_skipped_unheld_and_too_many_path_bytes_are_refused() {
    let f = Fixture::new("prefetch-bounds");
    f.write("a.bin", &pattern(10_000, 1));
    f.write("b.bin", &pattern(10_000, 2));
    // A window of one file: a plan stalls after its first file, holding its paths.
    let m = f.mount(&["--prefetch-window", "1"]);
    let pid = m.stat("pid");
    // A first list, so that what any list makes the daemon keep is there before the count.
    prefetch(&m, &write_list(&f, &["a.bin"]));
    wait_stat(&m, "prefetched_files", |v| v >= 1);
    let (rss, hwm) = (vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM"));

    let list = f.root.join("long");
    let mut text = b"b.bin\n".to_vec();
    text.resize(text.len() + (64 << 20), b'x');
    text.extend_from_slice(b"\na.bin\n");
    fs::write(&list, text).unwrap();
    let out = prefetch(&m, &list);
    fs::remove_file(&list).unwrap();
    wait_stat(&m, "prefetched_files", |v| v >= 2);
    let (rss2, hwm2) = (vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM"));
    eprintln!("daemon VmRSS {rss} -> {rss2} KiB, VmHWM {hwm} -> {hwm2} KiB");
    assert!(
        rss2 < rss + (32 << 10),
        "VmRSS grew from {rss} to {rss2} KiB with a 64 MiB line"
    );
    assert!(
        hwm2 < hwm + (32 << 10),
        "VmHWM grew from {hwm} to {hwm2} KiB with a 64 MiB line"
    );
    assert!(
        out.contains("queued 2 files") && out.contains("1 line skipped"),
        "{out}"
    );
    assert_eq!(
        m.stat("prefetch_pending"),
        1,
        "the plan waits at its window"
    );

    // 32 Ki paths of 4 KiB, each counting 7 bytes more: past 128 MiB.
    let line = format!("d/{}\n", "p".repeat(4094));
    fs::write(&list, line.repeat(32 << 10)).unwrap();
    let out = dyadfs()
        .arg("prefetch")
        .arg(&m.mnt)
        .args(["--list"])
        .arg(&list)
        .args(["--stream", "other"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("at most 128 MiB"), "{err}");
    assert_eq!(m.stat("prefetch_pending"), 1, "the first plan stays");
    m.unmount();
}

/// A listed path that is not there (a typo, a file removed since) is not filled and is said:
/// counted in `prefetch_missing` when the threads reach it, which `dyadfs prefetch` points to
/// (it answered "queued 5 files; 0 lines skipped" and nothing showed them anywhere).
#[test]
fn missing_listed_files_are_counted() {
    let f = Fixture::new("prefetch-missing");
    for k in 0..3 {
        f.write(&format!("f{k}.bin"), &pattern(5_000, k));
    }
    let m = f.mount(&[]);
    let list = f.root.join("list");
    let text: String = ["f0.bin", "nope0.bin", "f1.bin", "nope1.bin", "f2.bin"]
        .iter()
        .map(|p| format!("{}\n", m.path(p).display()))
        .collect();
    fs::write(&list, text).unwrap();
    let out = prefetch(&m, &list);
    assert!(out.contains("prefetch_missing"), "{out}");
    assert_eq!(wait_stat(&m, "prefetched_files", |v| v >= 3), 3);
    assert_eq!(wait_stat(&m, "prefetch_missing", |v| v >= 2), 2);
    m.unmount();
}

/// `dyadfs prefetch MNT --list LIST --stream STREAM`'s output.
fn prefetch_stream(m: &Mounted, list: &Path, stream: &str) -> String {
    let out = dyadfs()
        .arg("prefetch")
        .arg(&m.mnt)
        .arg("--list")
        .arg(list)
        .args(["--stream", stream])
        .output()
        .unwrap();
    succeeded("dyadfs prefetch", out)
}

/// A list of 8,000,000 distinct short paths (4 characters, 38 MiB): what it makes the daemon
/// hold is near its bytes (before: VmRSS 9 -> 647 MiB, each path ~80 bytes of heap), and it is
/// given back when the list is cancelled.
#[test]
fn eight_million_short_paths_cost_near_their_bytes() {
    let f = Fixture::new("prefetch-memory");
    f.write("a.bin", &pattern(10_000, 1));
    // A window of one file: the plan stalls after its first file, holding its paths.
    let m = f.mount(&["--prefetch-window", "1"]);
    let pid = m.stat("pid");
    prefetch(&m, &write_list(&f, &["a.bin"]));
    wait_stat(&m, "prefetched_files", |v| v >= 1);
    let (rss, hwm) = (vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM"));

    const DIGITS: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let n = 8_000_000;
    let mut text = Vec::with_capacity(n * 5);
    for i in 0..n {
        let mut k = i;
        for _ in 0..4 {
            text.push(DIGITS[k % 62]);
            k /= 62;
        }
        text.push(b'\n');
    }
    let list = f.root.join("short");
    fs::write(&list, &text).unwrap();
    drop(text);
    let out = prefetch_stream(&m, &list, "big");
    assert!(out.contains("queued 8000000 files"), "{out}");
    let (rss2, hwm2) = (vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM"));
    prefetch_stream(&m, Path::new("/dev/null"), "big");
    let rss3 = vm_kib(pid, "VmRSS");
    eprintln!(
        "daemon with 8 M paths: VmRSS {rss} -> {rss2} KiB, VmHWM {hwm} -> {hwm2} KiB; \
         VmRSS after cancelling {rss3} KiB"
    );
    assert!(
        hwm2 < hwm + (128 << 10),
        "VmHWM grew from {hwm} to {hwm2} KiB with 8 M paths"
    );
    assert!(
        rss3 < rss + (16 << 10),
        "VmRSS {rss3} KiB after cancelling, {rss} KiB before the list"
    );
    m.unmount();
}

/// A prefetch request made directly (a getxattr of the mount root): the daemon's answer, or
/// its errno.
fn ask_prefetch(mnt: &Path, stream: &str, list: &Path) -> Result<String, i32> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mnt.as_os_str().as_bytes()).unwrap();
    let name = format!("user.dyadfs.prefetch:{stream}:{}", list.display());
    let name = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated strings and a buffer of the length passed.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8(buf).unwrap())
}

/// Sends SIGCONT to a daemon stopped with SIGSTOP when dropped (a failed test leaves no mount
/// frozen).
struct Stopped(u64);

impl Stopped {
    /// Returns once every thread of `pid` is stopped: `kill` returns before they are, and a
    /// ring thread (FUSE over io_uring) still running then answered the next request (the
    /// first list was read whole from a "stopped" mount, 2 runs in 6).
    fn new(pid: u64) -> Stopped {
        // SAFETY: a signal to a process this test started.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        let stopped = Stopped(pid);
        wait_until("every thread stopped", Duration::from_secs(10), || {
            fs::read_dir(format!("/proc/{pid}/task"))
                .unwrap()
                .flatten()
                .all(|t| {
                    let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
                    matches!(state, Some("T" | "t"))
                })
        });
        stopped
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// Whether a thread of `pid` named `name` sleeps in the kernel (a read of a frozen mount).
fn thread_waits(pid: u64, name: &str) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
        comm.trim() == name && matches!(state, Some("S" | "D"))
    })
}

/// A user's lists are read one at a time: while one is being read (its file on a second mount
/// whose daemon is stopped, so the read waits), a second list of the same user is refused with
/// EBUSY at once, without being read (it lies on the stopped mount too: opening it would
/// wait); once the first is queued, the next is read. Before, four lists were read at once,
/// each whole before being refused.
#[test]
fn a_users_second_list_is_refused_before_it_is_read() {
    let f = Fixture::new("prefetch-one-at-a-time");
    f.write("a.bin", &pattern(10_000, 1));
    let m = f.mount(&[]);
    let pid = m.stat("pid");
    let g = Fixture::new("prefetch-frozen-lists");
    g.write("first", b"a.bin\n");
    g.write("second", b"a.bin\n");
    let lists = g.mount(&[]);
    let (first, second) = (lists.path("first"), lists.path("second"));
    let frozen = Stopped::new(lists.stat("pid"));
    let mnt = m.mnt.clone();
    let reading = std::thread::spawn(move || ask_prefetch(&mnt, "one", &first));
    wait_until(
        "the first list's reader to wait on the stopped mount",
        Duration::from_secs(10),
        || thread_waits(pid, "prefetch-list"),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let mnt = m.mnt.clone();
    let second_list = second.clone();
    std::thread::spawn(move || tx.send(ask_prefetch(&mnt, "two", &second_list)));
    let refused = rx.recv_timeout(Duration::from_secs(10));
    drop(frozen);
    assert_eq!(
        refused,
        Ok(Err(libc::EBUSY)),
        "a second list of the same user, while the first is read"
    );
    let queued = reading.join().unwrap().unwrap();
    assert_eq!(queued, r#"{"files":1,"skipped":0}"#);
    // Its turn given back: the next list is read.
    assert_eq!(
        ask_prefetch(&m.mnt, "two", &second).unwrap(),
        r#"{"files":1,"skipped":0}"#
    );
    lists.unmount();
    m.unmount();
}
