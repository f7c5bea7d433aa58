//! A mount's life as a restart script drives it (issue 69): unmount and mount again at once,
//! stop it with SIGTERM, and mounts that fail late leave nothing behind.

mod common;

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// `fusermount3 -u` returns while the daemon still exits, holding the cache directory; the next
/// mount waits for it instead of failing ("in use by another dyadfs daemon": 3 of 5 remounts
/// failed so before). Ten unmounts, each followed at once by a mount over the same cache.
#[test]
fn ten_remounts_in_a_row_at_once_all_succeed() {
    let f = Fixture::new("remount10");
    let data = pattern(300_000, 69);
    f.write("a.bin", &data);
    let mut slowest = Duration::ZERO;
    for round in 0..10 {
        let m = f.mount(&[]);
        assert_eq!(fs::read(m.path("a.bin")).unwrap(), data, "round {round}");
        let pid = m.pid;
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(&f.mnt)
            .output()
            .unwrap();
        succeeded("fusermount3 -u", out);
        std::mem::forget(m);
        let t = Instant::now();
        let out = f.try_mount(&[]);
        slowest = slowest.max(t.elapsed());
        let m = mounted_at(&f.mnt, out);
        assert_ne!(m.pid, pid, "round {round}: a new daemon");
        wait_gone(pid);
        assert_eq!(fs::read(m.path("a.bin")).unwrap(), data, "round {round}");
        assert_eq!(
            m.stat("bytes_from_backing"),
            0,
            "round {round}: the cache kept"
        );
        m.unmount();
    }
    println!("slowest remount: {slowest:?}");
}

/// A second mount over a cache directory a live mount holds is still refused at once, naming
/// it: only an exiting holder is waited for.
#[test]
fn a_cache_held_by_a_live_mount_is_refused_at_once() {
    let f = Fixture::new("heldlive");
    let m = f.mount(&[]);
    let other = f.root.join("mnt2");
    fs::create_dir_all(&other).unwrap();
    let t = Instant::now();
    let out = dyadfs()
        .arg("mount")
        .arg(&other)
        .arg("--ssd")
        .arg(&f.ssd)
        .arg("--backing")
        .arg(&f.backing)
        .output()
        .unwrap();
    assert!(!out.status.success(), "mounted over a held cache");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another dyadfs daemon"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "waited {:?}",
        t.elapsed()
    );
    assert!(!is_mounted(&other));
    m.unmount();
}
