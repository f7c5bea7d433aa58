//! Sizes nobody else bounds (issue 31): a producer's sparse file, and a daemon asked to stop
//! while requests are held. Each operation that could hang runs on its own thread under a
//! timeout, so a regression fails the test instead of hanging it.
#![cfg(feature = "fuse-tests")]

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
/// EBUSY) and a FUSE request is held (a lookup waiting for a producer): the mount is detached
/// and the requests still running are cut after a grace period.
#[test]
fn sigterm_stops_a_busy_daemon_within_seconds() {
    let f = Fixture::new("sizes-term");
    let m = f.mount_managed_with(&f.ssd, &["--wait", "60s"]);
    let busy = File::open(&m.mnt).unwrap();
    let missing = m.path("never-produced");
    std::thread::spawn(move || {
        let _ = fs::metadata(missing);
    });
    std::thread::sleep(Duration::from_millis(300));
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
