//! The node service (issue 72): a root `dyadfs node serve` owns the cache across jobs, users'
//! `dyadfs mount`s attach to it (fusermount3 mounts for the user, the service serves), one copy
//! of a dataset serves every user with the rights to it, every open is judged as its user,
//! and what was cached outlives the service's restart. Real users (made with useradd), real
//! mounts, a real service process.

mod common;

use std::fs;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::node::{GROUP, ONE_AT_A_TIME, Service, User, attached, dataset, scratch};
use common::{FuseForUsers, as_user, pattern, wait_until};
use serde_json::Value;

/// Job A (user 1) reads a dataset through the node service, from the shared FS once; user 2
/// (with the group's rights) reads every file of it from the one cached copy, 0 bytes from the
/// shared FS; user 3, without them, reads the public files and gets EACCES on the group's,
/// cached as they are, from the kernel's check and, on a mount without it (as any client of the
/// socket may make), from the service's own; and a dataset user 3 cannot reach is refused,
/// nothing left mounted.
#[test]
fn users_share_one_copy_and_each_open_is_judged_as_its_user() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("share");
    let (backing, files) = dataset(&root);
    let (Some(a), Some(b), Some(c)) = (
        User::new("dyadfs-user", &root, &[GROUP]),
        User::new("dyadfs-u2", &root, &[GROUP]),
        User::new("dyadfs-u3", &root, &[]),
    ) else {
        return;
    };
    let _fuse = FuseForUsers::open();
    let service = Service::start(&root);
    attached("user 1 attaches", a.mount(&service, &backing, &[]));
    let readable = |f: &(String, Vec<u8>)| !f.0.starts_with("priv/");
    for f in files.iter().filter(|f| readable(f)) {
        assert_eq!(a.read(&f.0).as_ref(), Ok(&f.1), "user 1 reads {}", f.0);
    }
    let total: u64 = files
        .iter()
        .filter(|f| readable(f))
        .map(|f| f.1.len() as u64)
        .sum();
    assert_eq!(service.dataset("bytes_from_backing"), total);
    assert!(
        a.read("priv/0.bin")
            .unwrap_err()
            .contains("Permission denied")
    );

    attached("user 2 attaches", b.mount(&service, &backing, &[]));
    let hits = service.dataset("local_hits");
    for f in files.iter().filter(|f| readable(f)) {
        assert_eq!(b.read(&f.0).as_ref(), Ok(&f.1), "user 2 reads {}", f.0);
    }
    assert_eq!(
        service.dataset("bytes_from_backing"),
        total,
        "user 2 read nothing from the shared FS"
    );
    assert_eq!(service.dataset("local_hits"), hits + 8);

    attached("user 3 attaches", c.mount(&service, &backing, &[]));
    assert_eq!(c.read("pub/1.bin").as_ref(), Ok(&files[1].1));
    for i in 0..4 {
        let e = c.read(&format!("grp/{i}.bin")).unwrap_err();
        assert!(e.contains("Permission denied"), "{e}");
    }
    c.unmount();
    // Without the kernel's check the service alone judges: the same answers.
    attached(
        "user 3 attaches without the kernel's checks",
        c.mount(&service, &backing, &["--node-without-kernel-checks"]),
    );
    let denied = service.dataset("rights_denied");
    for rel in ["grp/0.bin", "grp/3.bin", "priv/0.bin"] {
        let e = c.read(rel).unwrap_err();
        assert!(e.contains("Permission denied"), "{rel}: {e}");
    }
    assert_eq!(c.read("pub/2.bin").as_ref(), Ok(&files[2].1));
    assert!(service.dataset("rights_denied") >= denied + 3);
    assert_eq!(service.dataset("bytes_from_backing"), total);
    c.unmount();

    // A dataset user 3 may not reach: refused in one line, nothing mounted.
    let out = c.mount(&service, &backing.join("priv"), &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("may not read it"), "{err}");
    assert!(!common::is_mounted(&c.mnt), "nothing left mounted");
    let status = service.try_status().unwrap();
    assert_eq!(status["datasets"].as_array().unwrap().len(), 1, "{status}");
    drop((a, b, c));
    service.stop();
    fs::remove_dir_all(&root).unwrap();
}

/// Job D: the service restarted (every mount gone with it), user 1 mounts again and reads the
/// whole dataset with 0 bytes from the shared FS; the same after the service was killed
/// (SIGKILL) under a mount that was reading: the user's mount is dead (ENOTCONN, or
/// ECONNABORTED over io_uring; unmounted by the user as any dead FUSE mount), the stale socket
/// is replaced, nothing cached is lost. Restarted with a capacity below what it holds, it evicts
/// the excess at once and says so in its log.
#[test]
fn a_restarted_service_serves_what_it_cached_before() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("restart");
    let (backing, files) = dataset(&root);
    let Some(a) = User::new("dyadfs-user", &root, &[GROUP]) else {
        return;
    };
    let _fuse = FuseForUsers::open();
    let service = Service::start(&root);
    attached("user 1 attaches", a.mount(&service, &backing, &[]));
    let readable: Vec<_> = files.iter().filter(|f| !f.0.starts_with("priv/")).collect();
    for f in &readable {
        assert_eq!(a.read(&f.0).as_ref(), Ok(&f.1));
    }
    a.unmount();
    service.stop();
    let service = Service::start(&root);
    attached("user 1 attaches again", a.mount(&service, &backing, &[]));
    for f in &readable {
        assert_eq!(a.read(&f.0).as_ref(), Ok(&f.1));
    }
    assert_eq!(service.dataset("bytes_from_backing"), 0);
    assert_eq!(service.dataset("local_hits"), readable.len() as u64);
    // Killed while serving, a reader in flight.
    let reader = a
        .cmd()
        .args([
            "sh",
            "-c",
            &format!(
                "while cat {}/pub/0.bin > /dev/null; do :; done",
                a.mnt.display()
            ),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut service = service;
    service.child.kill().unwrap();
    service.child.wait().unwrap();
    let out = reader.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    // ENOTCONN by /dev/fuse, ECONNABORTED over io_uring.
    assert!(
        said.contains("Transport endpoint is not connected")
            || said.contains("Software caused connection abort"),
        "{said}"
    );
    let unmounted = a.cmd().arg("fusermount3").arg("-u").arg(&a.mnt).status();
    assert!(unmounted.unwrap().success(), "its user unmounts it");
    assert!(!common::is_mounted(&a.mnt));
    assert!(
        service.socket.exists(),
        "the killed service's socket is left"
    );
    let service = Service::start(&root);
    attached(
        "user 1 attaches after a kill",
        a.mount(&service, &backing, &[]),
    );
    for f in &readable {
        assert_eq!(a.read(&f.0).as_ref(), Ok(&f.1));
    }
    assert_eq!(service.dataset("bytes_from_backing"), 0);
    a.unmount();
    service.stop();
    // Restarted with a capacity below what it holds: the excess is evicted, and said so.
    let service = Service::start_with(&root, &["--capacity", "300K"]);
    let log = fs::read_to_string(&service.log).unwrap();
    assert!(log.contains("holds more than its capacity"), "{log}");
    assert!(service.dataset("cached_bytes") <= 300 << 10);
    service.stop();
    fs::remove_dir_all(&root).unwrap();
}

/// Hostile requests on the socket: garbage, an attach without a descriptor, an attach with a
/// descriptor that is not /dev/fuse, a request of another protocol version, /dev/fuse with no
/// mount behind it. Each is refused in a line, and the service goes on serving.
#[test]
fn hostile_requests_are_refused_and_the_service_goes_on() {
    use dyadfs::node::proto::{self, Reply, Request};
    use dyadfs::sys::seqpacket::Conn;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("hostile");
    let (backing, files) = dataset(&root);
    let service = Service::start(&root);
    let ask = |message: &[u8], fd: Option<std::os::fd::BorrowedFd<'_>>| -> String {
        let conn = Conn::connect(&service.socket).unwrap();
        conn.send(message, fd).unwrap();
        match proto::decode::<Reply>(&conn.recv().unwrap().0).unwrap() {
            Reply::Refused { message, .. } => message,
            other => panic!("not refused: {other:?}"),
        }
    };
    let attach = |version| {
        proto::encode(&Request::Attach {
            version,
            mountpoint: root.join("mnt"),
            backing: backing.clone(),
        })
    };
    assert!(ask(b"\xc1garbage", None).contains("not a request"));
    assert!(ask(&attach(proto::VERSION), None).contains("descriptor"));
    let file = fs::File::open(backing.join("pub/0.bin")).unwrap();
    assert!(ask(&attach(proto::VERSION), Some(file.as_fd())).contains("not /dev/fuse"));
    assert!(ask(&attach(proto::VERSION + 1), None).contains("protocol"));
    // /dev/fuse itself, no mount behind it: refused at once, not waited on for ever.
    let fuse = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .unwrap();
    assert!(ask(&attach(proto::VERSION), Some(fuse.as_fd())).contains("no mount waiting"));
    assert!(service.try_status().is_some(), "still serving");
    // And a real mount by root works after them.
    let mnt = root.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let out = service.attach(common::dyadfs(), &mnt, &backing, &[]);
    attached("root attaches", out);
    assert_eq!(fs::read(mnt.join("pub/0.bin")).unwrap(), files[0].1);
    let _ = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    // Its session ended with the unmount: the mount's own state is gone, the dataset's stays.
    let mounts = service.ssd.join("mounts");
    wait_until(
        "the mount's own state is gone",
        Duration::from_secs(10),
        || mounts.read_dir().unwrap().next().is_none(),
    );
    assert_eq!(service.dataset("mounts"), 0);
    assert_eq!(service.dataset("cached_files"), 1);
    service.stop();
    fs::remove_dir_all(&root).unwrap();
}

/// The node's capacity is shared by its datasets, each at most `--dataset-max`, each counted at
/// `/metrics`: a second dataset takes its half from the first at once (the first's least
/// recently used files leave); root evicts a dataset, the files not open while a mount serves
/// it, all of it once none does; a plain user may not.
#[test]
fn datasets_share_the_capacity_and_root_evicts() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("capacity");
    let mut sets = Vec::new();
    for d in ["one", "two"] {
        let dir = root.join(d);
        fs::create_dir_all(&dir).unwrap();
        for i in 0..4 {
            fs::write(dir.join(format!("{i}.bin")), pattern(256 << 10, i)).unwrap();
        }
        sets.push(dir);
    }
    let port = common::free_ports(1)[0];
    let metrics = format!("127.0.0.1:{port}");
    let service = Service::start_with(
        &root,
        &[
            "--capacity",
            "1536K",
            "--dataset-max",
            "1M",
            "--metrics-listen",
            &metrics,
        ],
    );
    let mount = |set: &Path, mnt: &str| {
        let mnt = root.join(mnt);
        fs::create_dir_all(&mnt).unwrap();
        attached(
            "root attaches",
            service.attach(common::dyadfs(), &mnt, set, &[]),
        );
        for i in 0..4 {
            assert_eq!(
                fs::read(mnt.join(format!("{i}.bin"))).unwrap(),
                pattern(256 << 10, i)
            );
        }
        mnt
    };
    let status = || service.try_status().unwrap();
    let key = |s: &Value, i: usize| s["datasets"][i]["key"].as_str().unwrap().to_string();
    let of = |s: &Value, i: usize, k: &str| s["datasets"][i][k].as_u64().unwrap();
    let m1 = mount(&sets[0], "m1");
    let s = status();
    assert_eq!(
        of(&s, 0, "capacity"),
        1 << 20,
        "alone, at most --dataset-max: {s}"
    );
    assert_eq!(of(&s, 0, "cached_bytes"), 1 << 20);
    let m2 = mount(&sets[1], "m2");
    let s = status();
    assert_eq!(s["capacity"].as_u64().unwrap(), 1536 << 10);
    let total: u64 = (0..2).map(|i| of(&s, i, "cached_bytes")).sum();
    for i in 0..2 {
        assert_eq!(of(&s, i, "capacity"), 768 << 10, "{s}");
        assert!(of(&s, i, "cached_bytes") <= 768 << 10, "{s}");
    }
    assert!(total <= 1536 << 10, "{s}");
    // Every dataset's counters at /metrics, labelled by its key.
    let scraped = scrape(&metrics);
    for i in 0..2 {
        let line = format!(
            "dyadfs_cached_bytes{{dataset=\"{}\"}} {}",
            key(&s, i),
            of(&s, i, "cached_bytes")
        );
        assert!(scraped.contains(&line), "{line} in:\n{scraped}");
    }
    // Which dataset m1 serves.
    let first = (0..2)
        .find(|&i| s["datasets"][i]["backing"].as_str() == Some(sets[0].to_str().unwrap()))
        .unwrap();
    let k1 = key(&s, first);
    let evict = |cmd: &mut Command| {
        cmd.arg(env!("CARGO_BIN_EXE_dyadfs"))
            .args(["node", "evict", &k1, "--socket"])
            .arg(&service.socket)
            .output()
            .unwrap()
    };
    let refused = evict(&mut as_user(65534, 65534));
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("only root evicts"));
    let out = evict(&mut Command::new("env"));
    attached("root evicts a served dataset", out.clone());
    assert!(String::from_utf8_lossy(&out.stdout).contains("its open files stay"));
    assert_eq!(of(&status(), first, "cached_files"), 0);
    let _ = Command::new("fusermount3").arg("-u").arg(&m1).status();
    wait_until("m1's session ends", Duration::from_secs(10), || {
        of(&status(), first, "mounts") == 0
    });
    let out = evict(&mut Command::new("env"));
    attached("root evicts an unserved dataset", out.clone());
    assert!(String::from_utf8_lossy(&out.stdout).contains("the dataset is gone"));
    let s = status();
    assert_eq!(s["datasets"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(
        of(&s, 0, "capacity"),
        1 << 20,
        "the other's share again, to its maximum"
    );
    assert!(!service.ssd.join("datasets").join(&k1).exists());
    let _ = Command::new("fusermount3").arg("-u").arg(&m2).status();
    service.stop();
    fs::remove_dir_all(&root).unwrap();
}

/// The disk is shared by users first: root reads two datasets and user 1 one, so user 1's
/// dataset holds half the node and root's two a quarter each; `dyadfs node status` charges each
/// user its part; the users are recorded, so the shares are the same after a restart.
#[test]
fn users_share_the_disk_fairly_whatever_their_datasets() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("fair");
    let mut sets = Vec::new();
    for d in ["one", "two", "three"] {
        let dir = root.join(d);
        fs::create_dir_all(&dir).unwrap();
        for i in 0..2 {
            fs::write(dir.join(format!("{i}.bin")), pattern(64 << 10, i)).unwrap();
        }
        sets.push(dir);
    }
    let Some(user) = User::new("dyadfs-user", &root, &[]) else {
        return;
    };
    let _fuse = FuseForUsers::open();
    let args = ["--capacity", "1200K"];
    let mut service = Service::start_with(&root, &args);
    for (i, set) in sets[..2].iter().enumerate() {
        let mnt = root.join(format!("m{i}"));
        fs::create_dir_all(&mnt).unwrap();
        attached(
            "root attaches",
            service.attach(common::dyadfs(), &mnt, set, &[]),
        );
        let _ = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    }
    attached("user 1 attaches", user.mount(&service, &sets[2], &[]));
    assert_eq!(user.read("1.bin").unwrap(), pattern(64 << 10, 1));
    let rooms = |service: &Service| -> Vec<(String, u64)> {
        let s = service.try_status().unwrap();
        let mut v: Vec<(String, u64)> = s["datasets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let path = d["backing"].as_str().unwrap();
                let name = Path::new(path).file_name().unwrap().to_str().unwrap();
                (name.to_string(), d["capacity"].as_u64().unwrap())
            })
            .collect();
        v.sort();
        v
    };
    let half = 1200u64 << 10 >> 1;
    let expected = vec![
        ("one".to_string(), half / 2),
        ("three".to_string(), half),
        ("two".to_string(), half / 2),
    ];
    assert_eq!(rooms(&service), expected);
    let s = service.try_status().unwrap();
    let users = s["users"].as_array().unwrap();
    assert_eq!(users.len(), 2, "{s}");
    assert_eq!(
        (users[0]["uid"].as_u64(), users[0]["datasets"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(users[1]["uid"].as_u64(), Some(user.uid as u64));
    assert_eq!(
        users[1]["bytes"].as_u64(),
        Some(64 << 10),
        "what user 1 read: {s}"
    );
    user.unmount();
    service.stop();
    service = Service::start_with(&root, &args);
    assert_eq!(rooms(&service), expected, "the same shares after a restart");
    service.stop();
    drop(user);
    fs::remove_dir_all(&root).unwrap();
}

/// The body of `GET /metrics` at `addr`.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A user gets at most 16 mounts served at once: the 17th is refused in a line (nothing left
/// mounted), and once one of them is unmounted the next is served.
#[test]
fn a_user_gets_sixteen_mounts_at_most() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("bound");
    let (backing, files) = dataset(&root);
    let mut users = Vec::new();
    for i in 0..17 {
        let Some(u) = User::new("dyadfs-u3", &root.join(format!("m{i}")), &[]) else {
            return;
        };
        users.push(u);
    }
    let _fuse = FuseForUsers::open();
    let service = Service::start(&root);
    for u in &users[..16] {
        attached("one of 16", u.mount(&service, &backing, &[]));
    }
    let out = users[16].mount(&service, &backing, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("16 mounts served on this node"), "{err}");
    assert!(!common::is_mounted(&users[16].mnt));
    users[0].unmount();
    wait_until(
        "the unmounted session ends",
        Duration::from_secs(10),
        || service.dataset("mounts") == 15,
    );
    attached(
        "the 17th, once one left",
        users[16].mount(&service, &backing, &[]),
    );
    assert_eq!(users[16].read("pub/1.bin").as_ref(), Ok(&files[1].1));
    drop(users);
    service.stop();
    fs::remove_dir_all(&root).unwrap();
}
