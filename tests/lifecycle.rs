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

/// Issue 69: a mount that fails late removes what it made in the cache directory (before, a
/// new `--ssd` was left with `data/` and its 256 subdirectories, logs, `lock`, the managed
/// root) and leaves what was there. A daemon with a job key its peers do not share is refused
/// after it built everything; so is a plain user's mount on a mount point root owns.
#[test]
fn a_mount_that_fails_late_leaves_the_cache_directory_as_it_was() {
    // The wrong key, with a new --ssd, and again with one that held a file.
    let mut c = Cluster::new("latefail", 3);
    c.start(2);
    let other = c.root.join("other-secret");
    succeeded(
        "keygen",
        dyadfs().arg("keygen").arg(&other).output().unwrap(),
    );
    c.secret = other;
    let ssd = c.root.join("s2");
    assert!(!ssd.exists());
    let out = c.mount_cmd(2).output().unwrap();
    refused_in_one_line(&out, &c.root.join("m2"), &["--secret-file"]);
    assert!(
        !ssd.exists(),
        "a new --ssd is left: {:?}",
        fs::read_dir(&ssd).map(|d| d.count())
    );
    fs::create_dir(&ssd).unwrap();
    fs::write(ssd.join("mine"), b"kept").unwrap();
    let out = c.mount_cmd(2).output().unwrap();
    refused_in_one_line(&out, &c.root.join("m2"), &["--secret-file"]);
    let left: Vec<String> = fs::read_dir(&ssd)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["mine"]);
    assert_eq!(fs::read(ssd.join("mine")).unwrap(), b"kept");

    // A plain user's mount on a mount point root owns (mode 0755): refused by fusermount3 once
    // the daemon has made its cache directory.
    let Ok((uid, gid)) = plain_user() else {
        println!("no plain user here: the plain user's case is skipped");
        return;
    };
    let _fuse = FuseForUsers::open();
    let f = Fixture::new("latefail-user");
    let theirs = f.root.join("theirs");
    fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(uid), Some(gid)).unwrap();
    std::os::unix::fs::chown(&f.backing, Some(uid), Some(gid)).unwrap();
    for d in [&f.root, &f.backing] {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let ssd = theirs.join("ssd");
    let out = as_user(uid, gid)
        .arg(env!("CARGO_BIN_EXE_dyadfs"))
        .arg("mount")
        .arg(&f.mnt)
        .arg("--ssd")
        .arg(&ssd)
        .arg("--backing")
        .arg(&f.backing)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a plain user mounted on root's directory"
    );
    assert!(!is_mounted(&f.mnt));
    assert!(
        !ssd.exists(),
        "the failed mount left {:?} ({})",
        fs::read_dir(&ssd).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>()),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 69's messages that sent users wrong: a shared (sticky, 1777) cache directory is
/// refused with "use a directory of your own in it", not `chmod 700` (which would lock every
/// other user out of `/nvme`); `dyadfs warm` of a directory in no dyadfs mount names that
/// directory, not `/`.
#[test]
fn refusals_say_what_to_do() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new("messages");
    let shared = f.root.join("nvme");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let out = dyadfs()
        .arg("mount")
        .arg(&f.mnt)
        .arg("--ssd")
        .arg(&shared)
        .arg("--backing")
        .arg(&f.backing)
        .output()
        .unwrap();
    let err = refused_in_one_line(&out, &f.mnt, &["use a directory of your own in it"]);
    assert!(!err.contains("chmod"), "{err}");

    let out = dyadfs().arg("warm").arg(&f.backing).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{} is not a dyadfs mount point",
            f.backing.display()
        )),
        "{err}"
    );
}

/// Issue 69: SIGTERM to a daemon whose mount has a file merely held open (no request running)
/// exits at once; it waited its 5 s grace and logged `ERROR requests still running` before.
/// (A request held, a waiting open, still gets the grace: `sizes`'
/// `sigterm_stops_a_busy_daemon_within_seconds`.)
#[test]
fn sigterm_with_a_file_merely_open_exits_at_once() {
    let f = Fixture::new("term-open");
    f.write("a.bin", b"held open");
    let m = f.mount(&[]);
    let held = fs::File::open(m.path("a.bin")).unwrap();
    let pid = m.pid;
    let t = Instant::now();
    // SAFETY: a signal to the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    wait_gone(pid);
    let took = t.elapsed();
    std::mem::forget(m);
    let log = fs::read_to_string(f.ssd.join("dyadfs.log")).unwrap();
    assert!(log.contains("no request running: exiting"), "{log}");
    assert!(!log.contains("requests still running"), "{log}");
    assert!(
        took < Duration::from_secs(3),
        "exited {took:?} after SIGTERM"
    );
    println!("exited {took:?} after SIGTERM with a file open");
    drop(held);
}
