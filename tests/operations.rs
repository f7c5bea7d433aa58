//! Operating a mount: `dyadfs warm` (a directory, a list, a node's share of a cluster) and
//! `dyadfs status`, through real mounts and real daemons.

mod common;

use std::fs;
use std::process::Command;

use common::{Cluster, Fixture, dyadfs, pattern, succeeded, trace_events, wait_until};

fn warm(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let mut c: Command = dyadfs();
    c.arg("warm").args(args);
    c.output().unwrap()
}

/// A directory and a list stage what they name (and only that); the reads that follow are
/// local hits; a missing path is reported, fails the run, and loses nothing staged.
#[test]
fn warm_stages_a_directory_and_a_list() {
    let f = Fixture::new("warm");
    for k in 0..30 {
        f.write(&format!("train/f{k}.bin"), &pattern(50_000 + k, k as u64));
        f.write(&format!("val/f{k}.bin"), &pattern(10_000, k as u64));
    }
    let m = f.mount(&[]);
    let out = warm(&[m.mnt.as_os_str(), m.path("train").as_os_str()]);
    let text = succeeded("warm train", out);
    assert!(text.contains("staged 30 files"), "{text}");
    assert_eq!(m.stat("cached_files"), 30);
    let list = f.root.join("list");
    fs::write(
        &list,
        format!("{}\nval/f1.bin\n", m.path("val/f0.bin").display()),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dyadfs"))
        .current_dir(&m.mnt)
        .args(["warm", "."])
        .arg("--list")
        .arg(&list)
        .output()
        .unwrap();
    succeeded("warm --list", out);
    assert_eq!(m.stat("cached_files"), 32);
    // Reading what was staged costs the shared file system nothing more.
    let backing = m.stat("bytes_from_backing");
    for k in 0..30 {
        assert_eq!(
            fs::read(m.path(&format!("train/f{k}.bin"))).unwrap(),
            pattern(50_000 + k, k as u64)
        );
    }
    assert_eq!(m.stat("bytes_from_backing"), backing);
    let out = warm(&[
        m.mnt.as_os_str(),
        m.path("nope").as_os_str(),
        m.path("val/f2.bin").as_os_str(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no such file or directory") && err.contains("nope"),
        "{err}"
    );
    assert_eq!(m.stat("cached_files"), 33, "the rest was staged");
    let out = warm(&[m.mnt.as_os_str(), "/etc".as_ref()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not under the mount point"));
    // A directory under the mount alone names both (OPERATIONS.md's `dyadfs warm /dyad/train`:
    // it was refused as not a mount).
    f.write("more/g.bin", &pattern(7_000, 3));
    let out = warm(&[m.path("more").as_os_str()]);
    let text = succeeded("warm MNT/more", out);
    assert!(text.contains("staged 1 file "), "{text}");
    assert_eq!(m.stat("cached_files"), 34);
    m.unmount();
}

/// `warm --cluster` on each of 4 nodes stages disjoint shares: the dataset lands once in the
/// cluster (the shared file system read once per file), and afterwards every node reads all of
/// it from its cache or its peers.
#[test]
fn warm_cluster_spreads_the_dataset_once() {
    let mut c = Cluster::new("warmcl", 4);
    let n = 40;
    let mut total = 0;
    for k in 0..n {
        let data = pattern(30_000 + k * 100, k as u64);
        total += data.len() as u64;
        let p = c.backing.join(format!("ds/f{k}.bin"));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    }
    c.start(4);
    std::thread::scope(|s| {
        for m in &c.nodes {
            s.spawn(move || {
                succeeded(
                    "warm --cluster",
                    warm(&[
                        m.mnt.as_os_str(),
                        m.path("ds").as_os_str(),
                        "--cluster".as_ref(),
                    ]),
                )
            });
        }
    });
    let held: Vec<u64> = c.nodes.iter().map(|m| m.stat("cached_files")).collect();
    assert_eq!(
        held.iter().sum::<u64>(),
        n as u64,
        "disjoint shares: {held:?}"
    );
    assert!(
        held.iter().all(|&h| h > 0),
        "every node took a share: {held:?}"
    );
    assert_eq!(c.total("bytes_from_backing"), total);
    for m in &c.nodes {
        for k in 0..n {
            let got = fs::read(m.path(&format!("ds/f{k}.bin"))).unwrap();
            assert!(got == pattern(30_000 + k * 100, k as u64));
        }
    }
    assert_eq!(
        c.total("bytes_from_backing"),
        total,
        "read once in the cluster"
    );
}

fn status(m: &common::Mounted) -> serde_json::Value {
    let out = dyadfs()
        .arg("status")
        .arg(&m.mnt)
        .arg("--json")
        .output()
        .unwrap();
    serde_json::from_str(&succeeded("status --json", out)).unwrap()
}

/// `status` lists every member with its state and holdings, and this node's hit ratios; a
/// killed node shows as down once the cluster's failure detection declares it.
#[test]
fn status_shows_members_holdings_and_a_dead_node() {
    let mut c = Cluster::new("status", 3);
    c.extra = vec!["--failure-detection".into(), "1s".into()];
    for k in 0..6 {
        let p = c.backing.join(format!("f{k}"));
        fs::write(p, pattern(20_000, k)).unwrap();
    }
    c.start(3);
    for k in 0..6 {
        fs::read(c.nodes[0].path(&format!("f{k}"))).unwrap();
    }
    fs::read(c.nodes[1].path("f0")).unwrap();
    let s = status(&c.nodes[1]);
    assert_eq!(s["node"], 1);
    let members = s["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    let state = |s: &serde_json::Value, id: usize| s["members"][id]["state"].clone();
    assert_eq!(state(&s, 1), "self");
    assert_eq!(state(&s, 0), "up");
    assert_eq!(s["members"][0]["files"], 6);
    assert_eq!(s["members"][0]["bytes"], 6 * 20_000);
    assert_eq!(s["members"][1]["files"], 1);
    assert_eq!(s["hit_ratios"]["opens"], 1);
    let table = succeeded(
        "status",
        dyadfs()
            .arg("status")
            .arg(&c.nodes[1].mnt)
            .output()
            .unwrap(),
    );
    assert!(table.contains("node 1 of 3 members"), "{table}");
    // Node 2 dies: within the detection time (1 s) and a probe, node 1 says so.
    let victim = c.nodes.remove(2);
    // SAFETY: signals our own child daemon.
    unsafe { libc::kill(victim.pid as i32, libc::SIGKILL) };
    wait_until(
        "node 2 shown down",
        std::time::Duration::from_secs(10),
        || state(&status(&c.nodes[1]), 2) == "down",
    );
    assert_eq!(
        status(&c.nodes[1])["members"][2]["files"],
        serde_json::Value::Null
    );
    drop(victim);
}

/// The admin's way: `dyadfs install` puts the mount helper where mount(8) looks, and an fstab
/// line (here a private fstab, `mount -T`) and `mount -t fuse.dyadfs` mount; `umount` unmounts.
/// The helper is removed (or the previous symlink put back) afterwards.
#[test]
fn fstab_lines_and_mount_t_use_the_installed_helper() {
    let helper = std::path::Path::new("/sbin/mount.fuse.dyadfs");
    let previous = match fs::symlink_metadata(helper) {
        Ok(m) if !m.file_type().is_symlink() => {
            eprintln!("skipped: {} is a file that is not ours", helper.display());
            return;
        }
        Ok(_) => Some(fs::read_link(helper).unwrap()),
        Err(_) => None,
    };
    let f = Fixture::new("fstab");
    f.write("a.txt", b"through fstab");
    let prefix = f.root.join("prefix");
    succeeded(
        "install",
        dyadfs()
            .args(["install", "--dir", "/sbin", "--prefix"])
            .arg(&prefix)
            .arg("--bin-dir")
            .arg(f.root.join("new/bin"))
            .output()
            .unwrap(),
    );
    // A `dyadfs` for whatever runs it by name, in a directory install made.
    assert_eq!(
        fs::read_link(f.root.join("new/bin/dyadfs")).unwrap(),
        prefix.join("bin/dyadfs")
    );
    // The helper is a copy under the prefix, which finds its UCX there, not in the checkout:
    // it carries no search path, and loads the libucp copied beside it.
    let installed = prefix.join("bin/dyadfs");
    assert_eq!(fs::read_link(helper).unwrap(), installed);
    let image = fs::read(&installed).unwrap();
    assert_eq!(
        dyadfs::sys::elf::runpaths(&image).unwrap(),
        Vec::<String>::new()
    );
    let version = succeeded(
        "the installed copy's --version",
        Command::new(&installed).arg("--version").output().unwrap(),
    );
    let copied = prefix.join("lib/libucp.so.0");
    assert!(copied.exists(), "install copied no libucp");
    assert!(
        version.contains(&format!("({})", copied.display())),
        "{version}"
    );
    let restore = || {
        let _ = fs::remove_file(helper);
        if let Some(p) = &previous {
            std::os::unix::fs::symlink(p, helper).unwrap();
        }
    };
    let result = std::panic::catch_unwind(|| {
        let fstab = f.root.join("fstab");
        fs::write(
            &fstab,
            format!(
                "{} {} fuse.dyadfs ssd={},capacity=64M,_netdev,allow_other 0 0\n",
                f.backing.display(),
                f.mnt.display(),
                f.ssd.display()
            ),
        )
        .unwrap();
        // (Waits for the daemon to exit: the next mount takes the same cache directory.)
        let umount = || {
            let m = common::Mounted {
                mnt: f.mnt.clone(),
                pid: 0,
            };
            let pid = m.stat("pid");
            std::mem::forget(m); // (its drop would unmount)
            succeeded(
                "umount",
                Command::new("umount").arg(&f.mnt).output().unwrap(),
            );
            common::wait_gone(pid as u32);
        };
        succeeded(
            "mount -T fstab",
            Command::new("mount")
                .arg("-T")
                .arg(&fstab)
                .arg(&f.mnt)
                .output()
                .unwrap(),
        );
        assert_eq!(fs::read(f.mnt.join("a.txt")).unwrap(), b"through fstab");
        // The mount table says `fuse.dyadfs` (it said `fuse`), so findmnt finds it and a
        // second `mount -a` sees the line mounted (it failed with rc 32, "already mounted").
        let listed = succeeded(
            "findmnt",
            Command::new("findmnt")
                .args(["-n", "-t", "fuse.dyadfs", "-o", "TARGET"])
                .output()
                .unwrap(),
        );
        assert!(
            listed
                .lines()
                .any(|l| std::path::Path::new(l.trim()) == f.mnt),
            "{listed}"
        );
        succeeded(
            "a second mount -a -T fstab",
            Command::new("mount")
                .arg("-a")
                .arg("-T")
                .arg(&fstab)
                .output()
                .unwrap(),
        );
        // The daemon mount(8) started is the installed copy, with the copy's UCX.
        let pid = common::Mounted {
            mnt: f.mnt.clone(),
            pid: 0,
        };
        let daemon = pid.stat("pid");
        std::mem::forget(pid);
        assert_eq!(
            fs::read_link(format!("/proc/{daemon}/exe")).unwrap(),
            installed
        );
        let maps = fs::read_to_string(format!("/proc/{daemon}/maps")).unwrap();
        let ucp = maps
            .lines()
            .find(|l| l.contains("libucp"))
            .expect("UCX loaded");
        assert!(
            ucp.contains(&*prefix.join("lib/libucp.so.0").to_string_lossy()),
            "{ucp}"
        );
        umount();
        succeeded(
            "mount -t fuse.dyadfs",
            Command::new("mount")
                .args(["-t", "fuse.dyadfs", "-o"])
                .arg(format!("ssd={},no-passthrough", f.ssd.display()))
                .arg(&f.backing)
                .arg(&f.mnt)
                .output()
                .unwrap(),
        );
        assert_eq!(fs::read(f.mnt.join("a.txt")).unwrap(), b"through fstab");
        umount();
    });
    restore();
    if let Err(e) = result {
        let _ = Command::new("fusermount3").arg("-uz").arg(&f.mnt).status();
        std::panic::resume_unwind(e);
    }
}

fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of a sample line `name{labels} value` in a scrape.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// `f` mounted with `--metrics-listen` on a free loopback port, and that port.
fn mount_with_metrics(f: &Fixture) -> (common::Mounted, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let m = f.mount(&["--metrics-listen", &format!("127.0.0.1:{port}")]);
    (m, port)
}

/// `--metrics-listen`: a Prometheus scrape parses, carries every stats key with the node
/// label, and moves with reads (counters and the fill histogram).
#[test]
fn the_metrics_endpoint_moves_with_reads() {
    let f = Fixture::new("metrics");
    for k in 0..5 {
        f.write(&format!("m{k}.bin"), &pattern(100_000, k));
    }
    let (m, port) = mount_with_metrics(&f);
    let before = scrape(port);
    assert!(before.ends_with("# EOF\n"));
    for key in [
        "local_hits",
        "bytes_from_backing",
        "cached_files",
        "members",
    ] {
        assert!(before.contains(&format!("dyadfs_{key}")), "{key}");
    }
    for k in 0..5 {
        fs::read(m.path(&format!("m{k}.bin"))).unwrap();
    }
    let after = scrape(port);
    let backing = r#"dyadfs_bytes_from_backing_total{node="0"}"#;
    assert_eq!(sample(&before, backing), 0.0);
    assert_eq!(sample(&after, backing), 500_000.0);
    assert_eq!(sample(&after, r#"dyadfs_cached_files{node="0"}"#), 5.0);
    let fills = r#"dyadfs_fill_seconds_count{node="0",source="shared_fs"}"#;
    assert!(sample(&after, fills) >= 5.0);
    assert!(sample(&after, r#"dyadfs_open_seconds_count{node="0"}"#) >= 5.0);
    m.unmount();
}

/// `--metrics-listen` against a slow client: one sending its request a byte every 1.5 s
/// holds no scrape up (they are answered at once, side by side) and is closed once the whole
/// request has taken the deadline, not kept while each byte comes in time. `HEAD /metrics`
/// answers the headers alone.
#[test]
fn a_slow_metrics_client_is_closed_and_holds_no_scrape_up() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let deadline = dyadfs::metrics::REQUEST_DEADLINE;
    let f = Fixture::new("metrics-slow");
    let (m, port) = mount_with_metrics(&f);
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let start = Instant::now();
    let mut writer = slow.try_clone().unwrap();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first = sent.clone();
    let dribble = std::thread::spawn(move || {
        for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" {
            if writer.write_all(&[*b]).is_err() {
                return;
            }
            first.store(true, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1500)); // a byte at a time: the thing tested
        }
    });
    wait_until(
        "the slow client's first byte is in",
        Duration::from_secs(5),
        || sent.load(std::sync::atomic::Ordering::Relaxed),
    );
    let t = Instant::now();
    assert!(scrape(port).ends_with("# EOF\n"));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a scrape beside a slow client took {:?}",
        t.elapsed()
    );
    // The server closes the slow connection (end of file, or a reset) by the deadline.
    slow.set_read_timeout(Some(deadline + Duration::from_secs(5)))
        .unwrap();
    let mut rest = Vec::new();
    let ended = match slow.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    let took = start.elapsed();
    assert!(ended, "the slow connection still open after {took:?}");
    assert!(
        took < deadline + Duration::from_secs(1),
        "the slow connection closed after {took:?} (deadline {deadline:?})"
    );
    drop(slow);
    dribble.join().unwrap();

    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut head = String::new();
    s.read_to_string(&mut head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "no body: {head}");
    m.unmount();
}

/// A plain user mounts (FUSE through the setuid fusermount3), reads through the mount, and the
/// daemon says it serves reads itself (passthrough needs CAP_SYS_ADMIN). The test makes a
/// system user `dyadfs-user` if there is none, and makes /dev/fuse usable by users for its
/// duration if it is not (restoring its mode); it is skipped, saying why, where it cannot.
#[test]
fn a_plain_user_mounts_and_the_daemon_serves_reads_itself() {
    let (uid, gid) = match common::plain_user() {
        Ok(ids) => ids,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let fuse = common::FuseForUsers::open();
    let f = Fixture::new("plainuser");
    f.write("a.txt", b"a plain user's read");
    let as_user =
        |args: &[&std::ffi::OsStr]| common::as_user(uid, gid).args(args).output().unwrap();
    let result = std::panic::catch_unwind(|| {
        for d in [&f.ssd, &f.mnt] {
            std::os::unix::fs::chown(d, Some(uid), Some(gid)).unwrap();
        }
        let bin = std::ffi::OsStr::new(env!("CARGO_BIN_EXE_dyadfs"));
        succeeded(
            "mount as a plain user",
            as_user(&[
                bin,
                "mount".as_ref(),
                f.mnt.as_os_str(),
                "--ssd".as_ref(),
                f.ssd.as_os_str(),
                "--backing".as_ref(),
                f.backing.as_os_str(),
            ]),
        );
        let file = f.mnt.join("a.txt");
        let read = succeeded("cat", as_user(&["cat".as_ref(), file.as_os_str()]));
        assert_eq!(read, "a plain user's read");
        let stats = succeeded(
            "stats",
            as_user(&[bin, "stats".as_ref(), f.mnt.as_os_str(), "--json".as_ref()]),
        );
        let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
        assert_eq!(stats["passthrough"], false, "{stats}");
        assert_eq!(stats["cached_files"], 1);
        let log = fs::read_to_string(f.ssd.join("dyadfs.log")).unwrap();
        assert!(log.contains("serves every read itself"), "{log}");
        let pid = stats["pid"].as_u64().unwrap() as u32;
        succeeded(
            "fusermount3 -u",
            as_user(&["fusermount3".as_ref(), "-u".as_ref(), f.mnt.as_os_str()]),
        );
        common::wait_gone(pid);
    });
    drop(fuse);
    if let Err(e) = result {
        let _ = Command::new("fusermount3").arg("-uz").arg(&f.mnt).status();
        std::panic::resume_unwind(e);
    }
}

/// `--trace FILE`: a read leaves valid Chrome trace events (complete events with node and
/// thread ids, times and sizes) for the FUSE operations and the chunk fill behind it.
#[test]
fn a_read_leaves_trace_events() {
    let f = Fixture::new("trace");
    f.write("t.bin", &pattern(300_000, 9));
    let trace = f.root.join("trace.json");
    let m = f.mount(&["--trace", trace.to_str().unwrap()]);
    assert_eq!(fs::read(m.path("t.bin")).unwrap(), pattern(300_000, 9));
    m.unmount();
    let events = trace_events(&trace);
    let named = |n: &'static str| events.iter().filter(move |e| e["name"] == n);
    let fill = named("fill").next().expect("a fill event");
    assert_eq!(fill["ph"], "X");
    assert_eq!(fill["pid"], 0);
    assert!(fill["tid"].as_u64().unwrap() > 0 && fill["dur"].as_f64().unwrap() > 0.0);
    assert_eq!(fill["args"]["source"], "shared_fs");
    assert_eq!(fill["args"]["bytes"], 300_000);
    assert_eq!(fill["args"]["path"], "t.bin");
    assert!(named("open").count() >= 1 && named("lookup").count() >= 1);
    // A name recorded by Debug is its text, not its quotes (it read "\"t.bin\"").
    let lookup = named("lookup")
        .find(|e| e["args"]["name"] == "t.bin")
        .expect("a lookup of t.bin, its name unquoted");
    assert_eq!(lookup["ph"], "X");
}

/// `mount` runs the installed helper as root: `install` refuses a binary another user could
/// change (here, a copy in a directory nobody owns), and installs nothing.
#[test]
fn install_refuses_a_binary_another_user_can_change() {
    let f = Fixture::new("install-untrusted");
    let theirs = f.root.join("theirs");
    fs::create_dir_all(&theirs).unwrap();
    let copy = theirs.join("dyadfs");
    fs::copy(env!("CARGO_BIN_EXE_dyadfs"), &copy).unwrap();
    let chown = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&theirs)
        .status()
        .unwrap();
    assert!(chown.success());
    let out = std::process::Command::new(&copy)
        .args(["install", "--dir"])
        .arg(&f.root)
        .arg("--prefix")
        .arg(f.root.join("prefix"))
        .arg("--bin-dir")
        .arg(f.root.join("bin"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "installed: {err}");
    assert!(err.contains("uid 65534"), "{err}");
    assert!(fs::symlink_metadata(f.root.join("mount.fuse.dyadfs")).is_err());
    assert!(!f.root.join("prefix").exists(), "nothing is copied");
}

/// `dyadfs --version` says the release, the commit, the protocol and the optional parts; `-V`
/// the release alone.
#[test]
fn the_version_says_the_commit_the_protocol_and_the_optional_parts() {
    let long = succeeded(
        "dyadfs --version",
        dyadfs().arg("--version").output().unwrap(),
    );
    let first = long.lines().next().unwrap();
    assert!(
        first.starts_with(&format!("dyadfs {} (commit ", env!("CARGO_PKG_VERSION")))
            && first.contains(", protocol "),
        "{long}"
    );
    let commit = first
        .split("commit ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap();
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{commit:?}"
    );
    assert!(long.lines().any(|l| l.starts_with("UCX: 1.")), "{long}");
    assert!(
        long.lines().any(|l| l.starts_with("FUSE over io_uring: ")),
        "{long}"
    );
    let short = succeeded("dyadfs -V", dyadfs().arg("-V").output().unwrap());
    assert_eq!(
        short.trim(),
        format!("dyadfs {}", env!("CARGO_PKG_VERSION"))
    );
}
