//! Opens waiting for produced names (`--wait`): what they cost the root daemon (no thread
//! each), and the share each user keeps (one user's waits never fail another's).

mod common;

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

/// The daemon's threads (`Threads:` of /proc/PID/status).
fn threads(pid: u32) -> usize {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line[8..].trim().parse().unwrap()
}

/// A plain user (or `nobody` where none can be made) as (uid, gid).
fn reader() -> (u32, u32) {
    plain_user().unwrap_or((65534, 65534))
}

/// Starts `n` opens by `who` of `dir/f{i}` (each on a thread of its own, pinned to one CPU
/// with `pin`), which print how many read `file {i}` once all are done.
fn start_readers(who: (u32, u32), dir: &Path, n: usize, pin: bool) -> std::process::Child {
    let script = r#"
import os, sys, threading
d, n, pin = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
if pin:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
threading.stack_size(128 << 10)
ok = []
def one(i):
    try:
        with open(f"{d}/f{i}", "rb") as f:
            if f.read() == f"file {i}".encode():
                ok.append(i)
    except OSError as e:
        print(i, e, file=sys.stderr)
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(len(ok))
"#;
    as_user(who.0, who.1)
        .args(["/usr/bin/python3", "-c", script])
        .arg(dir)
        .arg(n.to_string())
        .arg(if pin { "1" } else { "0" })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// How many of a reader process's opens read their file.
fn read_ok(child: std::process::Child) -> String {
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    format!("{said}{}", if err.is_empty() { "" } else { " / " }) + &err[..err.len().min(2000)]
}

/// 2,000 opens of a plain user wait at once for names not produced yet, and the root daemon
/// holds no thread for each (before: a thread each, 2,026 threads); then every name is
/// produced and every open reads its file. (FUSE by /dev/fuse: over io_uring each waiting
/// open holds a ring entry, and a queue lets 128 wait: see the next test.)
fn two_thousand_waits_on(m: &Mounted, produce_at: &Path) {
    const N: usize = 2000;
    let before = threads(m.pid);
    let waiting0 = m.stat("name_waits");
    let readers = start_readers(reader(), &m.mnt, N, false);
    let t = Instant::now();
    wait_until("every open waiting", Duration::from_secs(60), || {
        m.stat("name_waits") >= waiting0 + N as u64
    });
    let during = threads(m.pid);
    println!(
        "{N} waiting after {:?}: daemon threads {before} before, {during} while they wait",
        t.elapsed()
    );
    assert_eq!(m.stat("name_waits_refused"), 0);
    assert!(during < 100, "{during} threads for {N} waiting opens");
    // Produced by a process of its own: a producer's close looks at its children (this test's
    // are the readers, 2,000 threads, each a slower look).
    let t = Instant::now();
    let produce = "import sys\nfor i in range(int(sys.argv[2])):\n    \
                   open(f'{sys.argv[1]}/f{i}', 'w').write(f'file {i}')";
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", produce])
        .arg(produce_at)
        .arg(N.to_string())
        .output()
        .unwrap();
    succeeded("producing", out);
    println!("produced in {:?}", t.elapsed());
    let said = read_ok(readers);
    println!("all read {:?} after the first produced", t.elapsed());
    assert_eq!(said, N.to_string(), "opens that read their file");
}

#[test]
fn two_thousand_waiting_opens_hold_no_thread_each() {
    let f = Fixture::new("waits-many");
    let ssd = f.root.join("ssd-many");
    let m = f.mount_managed_with(
        &ssd,
        &[
            "-o",
            "allow_other",
            "--wait",
            "60s",
            "--fuse-transport",
            "dev",
        ],
    );
    two_thousand_waits_on(&m, &m.mnt);
    m.unmount();
}

/// The same across two nodes: the waits are on one node, each name's home registers it (in
/// a few messages, not one call each), and the names are produced on the other node.
#[test]
fn two_thousand_waiting_opens_on_a_cluster_hold_no_thread_each() {
    let mut c = Cluster::new("waits-cluster", 2);
    c.extra = [
        "-o",
        "allow_other",
        "--wait",
        "60s",
        "--fuse-transport",
        "dev",
    ]
    .map(String::from)
    .to_vec();
    c.start(2);
    two_thousand_waits_on(&c.nodes[1], &c.nodes[0].mnt);
}

/// One user holding as many waiting opens as it may (`--max-waits-per-user`, and over io_uring
/// its share of the ring queue its CPU sends to) does not make another user's waiting open fail:
/// that one waits, and reads its file once it is produced. (Over io_uring one user's 1,024
/// waits took every place of the ring and another's open failed at once with ENOENT.)
#[test]
fn one_users_waits_leave_another_user_waiting() {
    const MOST: usize = 1024;
    let f = Fixture::new("waits-share");
    let ssd = f.root.join("ssd-share");
    let most = MOST.to_string();
    let args = [
        "-o",
        "allow_other",
        "--wait",
        "8s",
        "--max-waits-per-user",
        &most,
    ];
    let m = f.mount_managed_with(&ssd, &args);
    // The first user's opens (names never produced), all from one CPU: past its bound some are
    // refused at once.
    let heavy = start_readers((65534, 65534), &m.mnt.join("never"), MOST + 64, true);
    wait_until(
        "the first user's opens answered or waiting",
        Duration::from_secs(30),
        || m.stat("name_waits") + m.stat("name_waits_refused") >= (MOST + 64) as u64,
    );
    let refused = m.stat("name_waits_refused");
    let transport = m.stats()["fuse_transport"].clone();
    println!("{refused} of the first user's opens refused (FUSE by {transport})");
    assert!(refused >= 64, "{refused} of the first user's opens refused");
    // Another user's open, from the same CPU.
    let waits = m.stat("name_waits");
    let other = start_readers(reader(), &m.mnt, 1, true);
    wait_until(
        "the other user's open waiting",
        Duration::from_secs(10),
        || m.stat("name_waits") > waits || m.stat("name_waits_refused") > refused,
    );
    assert_eq!(
        m.stat("name_waits_refused"),
        refused,
        "the other user's open was refused"
    );
    fs::write(m.mnt.join("f0"), "file 0").unwrap();
    assert_eq!(read_ok(other), "1", "the other user's open read its file");
    let _ = read_ok(heavy);
    m.unmount();
}
