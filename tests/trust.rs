//! The control port trusts only holders of the job secret, and nothing from the wire is used
//! unchecked. Real daemons on 127.0.0.1 attacked by real clients: one without the key, one with
//! the key sending a forged name, a daemon with the wrong key; mounts without a (private)
//! secret are refused.

mod common;

use std::fs;
use std::net::TcpStream;
use std::time::Duration;

use common::member::*;
use common::*;
use dyadfs::core::names::Name;
use dyadfs::locator::proto::{self, Msg};
use dyadfs::transport::auth::{self, Secret};
use dyadfs::transport::wire::{Message, PROTOCOL_VERSION};

/// A locator message as the frame that carries it.
fn rpc(m: Msg) -> Message {
    Message::Rpc(proto::encode(&m))
}

/// The locator message a reply frame carries.
fn answer(reply: Option<Message>) -> Option<Msg> {
    match reply? {
        Message::Rpc(p) => proto::decode(&p).ok(),
        _ => None,
    }
}

fn listing(m: &Mounted) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn forged_name() -> Message {
    rpc(Msg::NameSet {
        dir: String::new(),
        name: "passwd".into(),
        entry: Some(Name {
            dir: false,
            object: "/etc/passwd".into(),
            size: 100,
            mtime_ns: 1,
            mode: 0o644,
            holder: 0,
            uid: 0,
            gid: 0,
            meta: Default::default(),
        }),
    })
}

#[test]
fn peers_without_the_key_get_nothing_and_change_nothing() {
    let mut c = Cluster::new("trust", 3);
    let data = pattern(MIB, 5);
    fs::write(c.backing.join("x"), &data).unwrap();
    c.start(2);
    assert!(fs::read(c.nodes[0].path("x")).unwrap() == data);
    let before = listing(&c.nodes[1]);

    // No key: a Hello asking for the holder's rkey, and a forged name, are answered with
    // nothing but a challenge, then the connection is closed.
    for msg in [puller_hello(), forged_name()] {
        let mut s = TcpStream::connect(c.addr(1)).unwrap();
        send(&mut s, &msg).unwrap();
        assert_eq!(recv(&mut s), None, "a client without the key got an answer");
    }
    // A client that answers the challenge with a made-up proof gets nothing either.
    let mut s = TcpStream::connect(c.addr(1)).unwrap();
    let (hello, _) = auth::client_hello(0).unwrap();
    send(&mut s, &hello).unwrap();
    assert!(matches!(recv(&mut s), Some(Message::AuthChallenge { .. })));
    send(&mut s, &Message::AuthProof { mac: vec![0; 32] }).unwrap();
    let _ = send(
        &mut s,
        &rpc(Msg::NameList {
            dir: String::new(),
            after: None,
        }),
    );
    assert_eq!(recv(&mut s), None, "a forged proof got an answer");

    // With the key, a name whose object is a path outside the cache is refused.
    let key = Secret::load(&c.secret).unwrap();
    for home in 0..2 {
        let mut s = authenticated(&c, home, &key);
        s.send(&forged_name()).unwrap();
        match answer(s.recv()) {
            Some(Msg::Refused(why)) => assert!(why.contains("not an object"), "{why}"),
            other => panic!("a forged name was answered with {other:?}"),
        }
    }
    assert_eq!(listing(&c.nodes[0]), before);
    assert_eq!(listing(&c.nodes[1]), before);
    // The authenticated id is the only identity: node 0 cannot publish a copy as node 1.
    let meta = fs::metadata(c.backing.join("x")).unwrap();
    let spoof = rpc(Msg::Publish {
        path: "x".into(),
        version: dyadfs::core::version_of(&meta),
        node: 1,
        held: true,
    });
    let mut s = authenticated(&c, 1, &key);
    s.send(&spoof).unwrap();
    match answer(s.recv()) {
        Some(Msg::Refused(why)) => assert!(why.contains("spoke for"), "{why}"),
        other => panic!("a spoofed publish was answered with {other:?}"),
    }

    // A daemon with another key is refused by its peers, so it does not mount: one line names
    // the peers whose proofs its key does not check (before, it mounted, served alone from the
    // backing store and was declared down by the others; the only sign a line in its log).
    let served = c.nodes[0].stat("bytes_served_to_peers");
    let other = c.root.join("other-secret");
    Secret::generate(&other).unwrap();
    c.secret = other;
    let out = c.mount_cmd(2).output().unwrap();
    refused_in_one_line(&out, &c.root.join("m2"), &["peers 0, 1", "--secret-file"]);
    assert_eq!(c.nodes[0].stat("bytes_served_to_peers"), served);
    assert_eq!(listing(&c.nodes[1]), before);
}

#[test]
fn a_multi_node_mount_needs_a_private_secret() {
    let c = Cluster::new("secret", 1);
    let mount_in = |cwd: &std::path::Path, extra: &[&str]| {
        let mnt = c.root.join("m0");
        fs::create_dir_all(&mnt).unwrap();
        node_cmd()
            .current_dir(cwd)
            .env_remove("DYADFS_SECRET_FILE")
            .arg("mount")
            .arg(&mnt)
            .arg("--ssd")
            .arg(c.root.join("s0"))
            .arg("--backing")
            .arg(&c.backing)
            .args(["--node-id", "0", "--peers"])
            .arg(&c.peers)
            .args(extra)
            .output()
            .unwrap()
    };
    let mount = |extra: &[&str]| mount_in(std::path::Path::new("/"), extra);
    let out = mount(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--secret-file"));
    let open = c.root.join("open-secret");
    Secret::generate(&open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&open, fs::Permissions::from_mode(0o644)).unwrap();
    let out = mount(&["--secret-file", open.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("open-secret") && err.contains("644"), "{err}");
    assert!(!is_mounted(&c.root.join("m0")));
    mounted_at(&c.root.join("m0"), mount(&["--insecure"])).unmount();
    // A relative key file is the caller's: the daemon looked it up under `/`, where it works,
    // and failed with "No such file or directory".
    let out = mount_in(&c.root, &["--secret-file", "secret"]);
    mounted_at(&c.root.join("m0"), out).unmount();
}

/// Asks for the first MiB of `x` at `version`, as request `id`.
fn request_mib(s: &mut Sealed, id: u64, version: dyadfs::core::Version) {
    let request = Message::Request {
        id,
        path: "x".into(),
        version,
        offset: 0,
        len: MIB as u32,
    };
    s.send(&request).unwrap();
}

/// One client that stages many chunks and never releases them held every slot of a holder
/// (another puller then waited 30 s); now it gets a fair share and the rest are refused.
#[test]
fn a_slot_hog_does_not_stop_a_legitimate_puller() {
    let mut c = Cluster::new("hog", 2);
    // Staged chunks and their slots exist with a UCX data plane only.
    c.extra = vec!["--data-plane".into(), "ucx".into(), "--ucx-over-tcp".into()];
    let data = pattern(MIB, 9);
    fs::write(c.backing.join("x"), &data).unwrap();
    c.start(2);
    assert!(fs::read(c.nodes[0].path("x")).unwrap() == data);
    let key = Secret::load(&c.secret).unwrap();
    let meta = fs::metadata(c.backing.join("x")).unwrap();
    let version = dyadfs::core::version_of(&meta);
    let mut hog = puller(&c, 0, &key);
    for id in 0..40 {
        request_mib(&mut hog, id, version);
    }
    let (mut staged, mut refused) = (0, 0);
    for _ in 0..40 {
        match hog.recv() {
            Some(Message::Staged { .. }) => staged += 1,
            Some(Message::Error { .. }) => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(staged <= 8 && staged + refused == 40, "{staged} staged");
    // Node 1 pulls the file from node 0 while the hog holds its share (peer timeout 2 s).
    let t = std::time::Instant::now();
    assert!(fs::read(c.nodes[1].path("x")).unwrap() == data);
    assert_eq!(c.nodes[1].stat("bytes_from_peers"), MIB as u64);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    drop(hog);
    // Offsets from the wire are checked: a range past the end (or overflowing) is an error
    // reply, and the connection goes on serving.
    let mut s = puller(&c, 0, &key);
    for (id, offset) in [(1, u64::MAX - 10), (2, MIB as u64)] {
        let request = Message::Request {
            id,
            path: "x".into(),
            version,
            offset,
            len: 4096,
        };
        s.send(&request).unwrap();
        assert!(
            matches!(s.recv(), Some(Message::Error { id: i, .. }) if i == id),
            "offset {offset}"
        );
    }
    let request = Message::Request {
        id: 3,
        path: "x".into(),
        version,
        offset: 0,
        len: 4096,
    };
    s.send(&request).unwrap();
    assert!(matches!(s.recv(), Some(Message::Staged { id: 3, .. })));
}

/// A `NameGet` asking to wait u64::MAX ms is taken as a bounded wait (the home caps it at 1 h)
/// and answered at once when the name exists.
#[test]
fn a_name_lookup_with_an_absurd_wait_is_answered() {
    let mut c = Cluster::new("wait", 2);
    c.start(2);
    fs::write(c.nodes[0].path("made"), b"produced").unwrap();
    let peers = fs::read_to_string(&c.peers).unwrap();
    let home = dyadfs::locator::Membership::parse(&peers, 0)
        .unwrap()
        .global_home("") as usize;
    let key = Secret::load(&c.secret).unwrap();
    let mut s = authenticated(&c, home, &key);
    let get = rpc(Msg::NameGet {
        dir: String::new(),
        name: "made".into(),
        wait_ms: u64::MAX,
    });
    s.send(&get).unwrap();
    assert!(
        matches!(answer(s.recv()), Some(Msg::NameIs(Some(_)))),
        "no answer"
    );
}

/// Runs `script` with sh as the unprivileged user nobody (uid and gid 65534).
fn as_nobody(script: &str) -> bool {
    as_user(65534, 65534)
        .args(["sh", "-c", script])
        .status()
        .unwrap()
        .success()
}

/// Files and directories written under the mount belong to the user who wrote them, with the
/// mode asked (umask applied), on every node; permissions hold for other users (`allow_other`).
#[test]
fn produced_files_belong_to_their_writer_on_every_node() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut c = Cluster::new("owner", 2);
    let open = c.backing.join("open");
    fs::create_dir_all(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    c.extra = vec!["-o".into(), "allow_other".into()];
    c.start(2);
    let m0 = c.nodes[0].mnt.display().to_string();
    assert!(as_nobody(&format!(
        "umask 027; echo hi > {m0}/open/mine && mkdir {m0}/open/d"
    )));
    fs::write(c.nodes[0].path("open/roots"), b"root's").unwrap();
    for m in &c.nodes {
        wait_until("published", Duration::from_secs(10), || {
            m.path("open/mine").exists() && m.path("open/roots").exists()
        });
        let mine = fs::metadata(m.path("open/mine")).unwrap();
        assert_eq!(
            (mine.uid(), mine.gid(), mine.mode() & 0o777),
            (65534, 65534, 0o640)
        );
        let d = fs::metadata(m.path("open/d")).unwrap();
        assert_eq!((d.uid(), d.gid(), d.mode() & 0o777), (65534, 65534, 0o750));
        assert_eq!(fs::metadata(m.path("open/roots")).unwrap().uid(), 0);
    }
    let m1 = c.nodes[1].mnt.display().to_string();
    assert!(as_nobody(&format!("cat {m1}/open/mine")));
    // Another user's file is not writable by nobody, on either node.
    assert!(!as_nobody(&format!("echo x > {m0}/open/roots")));
    assert!(!as_nobody(&format!("echo x > {m1}/open/roots")));
    assert!(fs::read(c.nodes[1].path("open/roots")).unwrap() == b"root's");
}

/// A member's hello with a UCX address but no rkey (or the reverse, or oversized blobs) is
/// refused before UCX sees it: the connection is closed, and the daemon serves on.
#[test]
fn a_malformed_hello_is_refused_and_harms_nobody() {
    let mut c = Cluster::new("badhello", 2);
    c.extra = vec!["--data-plane".into(), "ucx".into(), "--ucx-over-tcp".into()];
    let data = pattern(MIB, 5);
    fs::write(c.backing.join("x"), &data).unwrap();
    c.start(2);
    let key = Secret::load(&c.secret).unwrap();
    let blobs: [(Vec<u8>, Vec<u8>); 4] = [
        (vec![1; 48], vec![]),
        (vec![], vec![2; 20]),
        (vec![1; 5000], vec![2; 20]),
        (vec![1; 48], vec![2; 5000]),
    ];
    for (worker_address, rkey) in blobs {
        let mut s = authenticated(&c, 0, &key);
        let hello = Message::Hello {
            protocol: PROTOCOL_VERSION,
            node_id: 0,
            worker_address,
            rkey,
            background: false,
            eager_max: 0,
        };
        s.send(&hello).unwrap();
        assert_eq!(s.recv(), None, "a malformed hello was answered");
    }
    assert!(fs::read(c.nodes[1].path("x")).unwrap() == data);
    // Publishes are batched: node 0 finds node 1's copy once the file's home knows it.
    c.wait_published(1);
    assert!(fs::read(c.nodes[0].path("x")).unwrap() == data);
    assert_eq!(
        c.nodes[0].stat("bytes_from_peers"),
        MIB as u64,
        "node 0 pulled from node 1"
    );
}

/// A local user cannot redirect what root writes or trusts through paths it prepared: a cache
/// dir it created (with a probe symlink to a victim), a cache dir under a directory anyone can
/// rename in, a log file or a trace file that is a symlink (a secret file: the unit test
/// `key_files_must_be_private_and_long_enough`). Each mount is refused
/// with a one-line reason naming the path, and the victim is untouched.
#[test]
fn a_local_user_cannot_redirect_roots_files() {
    use std::os::unix::fs::PermissionsExt;
    let mut f = Fixture::new("redirect");
    let base = f.root.join("attack");
    fs::create_dir_all(&base).unwrap();
    let victim = base.join("victim");
    fs::write(&victim, b"untouched").unwrap();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o1777)).unwrap();
    let refused = |f: &Fixture, extra: &[&str], says: &str| {
        refused_in_one_line(&f.try_mount(extra), &f.mnt, &[says]);
        assert_eq!(fs::read(&victim).unwrap(), b"untouched");
    };
    // The user's own cache dir, prepared with a probe that points at the victim.
    let theirs = base.join("cache");
    let v = victim.display();
    let t = theirs.display();
    assert!(as_nobody(&format!(
        "mkdir {t} && ln -s {v} {t}/.dyadfs-write-probe && ln -s {v} {t}/dyadfs.log"
    )));
    f.ssd = theirs;
    refused(&f, &[], "owned by uid 65534");
    // A cache dir of root's under a directory anyone may rename entries in (no sticky bit).
    let open = f.root.join("open");
    fs::create_dir_all(open.join("cache")).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    f.ssd = open.join("cache");
    refused(&f, &[], "not sticky");
    // A log, a trace or a secret file that is a symlink to the victim.
    f.ssd = f.root.join("ssd");
    let link = base.join("link");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let l = link.to_str().unwrap();
    refused(&f, &["--log-file", l], "symlink");
    refused(&f, &["--trace", l], "symlink");
    // And with its own paths, the mount works.
    f.mount(&[]).unmount();
}

/// Whole-cache and cluster-wide work (`scrub`, `status`) is for root or the mount's owner; any
/// user of an `allow_other` mount still reads its counters.
#[test]
fn only_root_or_the_owner_may_scrub_or_ask_the_cluster() {
    let f = Fixture::new("admin");
    fs::write(f.backing.join("x"), b"bytes").unwrap();
    let m = f.mount(&["-o", "allow_other"]);
    assert_eq!(fs::read(m.path("x")).unwrap(), b"bytes");
    let bin = env!("CARGO_BIN_EXE_dyadfs");
    let mnt = m.mnt.display();
    for cmd in ["scrub", "status"] {
        assert!(
            !as_nobody(&format!("{bin} {cmd} {mnt} 2>/dev/null")),
            "{cmd} as nobody"
        );
        let out = dyadfs().arg(cmd).arg(&m.mnt).output().unwrap();
        succeeded(cmd, out);
    }
    assert!(as_nobody(&format!("{bin} stats {mnt} > /dev/null")));
    m.unmount();
}

/// Idle connections that staged chunks and never speak again give their slots back when the
/// lease ends (four of them held every shared slot of a holder forever before; now four hold
/// all it lends, 28 of its 32).
#[test]
fn idle_hogs_lose_their_slots_when_the_lease_ends() {
    let mut c = Cluster::new("idlehog", 2);
    c.extra = ["--data-plane", "ucx", "--ucx-over-tcp", "--eager-max", "0"]
        .map(String::from)
        .to_vec();
    let data = pattern(4 * MIB, 3);
    fs::write(c.backing.join("x"), &data).unwrap();
    c.start(2);
    assert!(fs::read(c.nodes[0].path("x")).unwrap() == data);
    let key = Secret::load(&c.secret).unwrap();
    let version = dyadfs::core::version_of(&fs::metadata(c.backing.join("x")).unwrap());
    let mut hogs = Vec::new();
    // Node 0 lends 28 of its 32 shared slots: three hogs take 8 each, a fourth the last 4.
    for h in 0..4u64 {
        let mut hog = puller(&c, 0, &key);
        let n = if h < 3 { 8 } else { 4 };
        for id in 0..n {
            request_mib(&mut hog, id, version);
        }
        for _ in 0..n {
            assert!(
                matches!(hog.recv(), Some(Message::Staged { .. })),
                "hog {h}"
            );
        }
        hogs.push(hog);
    }
    // The hogs hold every slot node 0 lends and say nothing more. After a lease (10 s) the
    // slots are back, and node 1 pulls the file from node 0.
    std::thread::sleep(Duration::from_secs(11)); // the lease, the thing tested
    c.wait_published(1);
    assert!(fs::read(c.nodes[1].path("x")).unwrap() == data);
    assert_eq!(c.nodes[1].stat("bytes_from_peers"), 4 * MIB as u64);
    drop(hogs);
}

/// The key proves membership of the job, and the id must be one of its nodes: a key holder
/// claiming an id outside the peers file is refused (it would also escape the per-node bound
/// on connections).
#[test]
fn an_id_outside_the_membership_is_refused() {
    let mut c = Cluster::new("nonmember", 2);
    c.start(2);
    let key = Secret::load(&c.secret).unwrap();
    let list = rpc(Msg::NameList {
        dir: String::new(),
        after: None,
    });
    let mut member = authenticated_as(&c, 0, &key, 1);
    member.send(&list).unwrap();
    assert!(answer(member.recv()).is_some(), "a member is answered");
    let mut stranger = authenticated_as(&c, 0, &key, 99);
    let _ = stranger.send(&list);
    assert_eq!(stranger.recv(), None, "node 99 was answered");
}

/// A member changes names held at another node's home only as an operation of its own could:
/// it cannot give another node's hard-linked file (its record) other bytes, nor plant a name
/// in the copies a directory's backup keeps for its home (they are what a restarted home is
/// given back). Users of any node still chmod, link and unlink the file.
#[test]
fn a_member_cannot_rewrite_others_records_or_plant_replicas() {
    use std::os::unix::fs::PermissionsExt;
    let mut c = Cluster::new("holder", 3);
    c.start(3);
    fs::write(c.nodes[0].path("f"), b"node 0's bytes").unwrap();
    fs::hard_link(c.nodes[0].path("f"), c.nodes[0].path("g")).unwrap();
    let peers = fs::read_to_string(&c.peers).unwrap();
    let m = dyadfs::locator::Membership::parse(&peers, 0).unwrap();
    let key = Secret::load(&c.secret).unwrap();
    let ask = |to: u32, as_node: u32, msg: Msg| {
        let mut s = authenticated_as(&c, to as usize, &key, as_node);
        s.send(&rpc(msg)).unwrap();
        answer(s.recv())
    };
    let get = |dir: &str, name: &str| match ask(
        m.global_home(dir),
        1,
        Msg::NameGet {
            dir: dir.into(),
            name: name.into(),
            wait_ms: 0,
        },
    ) {
        Some(Msg::NameIs(Some(n))) => n,
        other => panic!("{dir:?}/{name:?}: {other:?}"),
    };
    let inode = get("", "f").meta.inode;
    let rdir = dyadfs::core::names::links_dir(&inode);
    let record = get(&rdir, &inode);
    assert_eq!(record.holder, 0);

    // Node 1 points node 0's record at bytes of its own.
    let mut forged = record.clone();
    forged.object = "//produced/1/0-1".into();
    forged.holder = 1;
    let set = Msg::NameSet {
        dir: rdir.clone(),
        name: inode.clone(),
        entry: Some(forged),
    };
    match ask(m.global_home(&rdir), 1, set) {
        Some(Msg::Refused(why)) => assert!(why.contains("changed the bytes"), "{why}"),
        other => panic!("a record's bytes were changed by a non-holder: {other:?}"),
    }
    assert_eq!(get(&rdir, &inode), record);

    // The third node in the root's order plants a 0644 alias of node 0's object at its backup.
    let order = m.global_order("");
    let mut alias = record.clone();
    (alias.mode, alias.meta) = (0o644, Default::default());
    let plant = Msg::NameReplica {
        dir: String::new(),
        name: "alias".into(),
        entry: Some(alias),
    };
    match ask(order[1], order[2], plant) {
        Some(Msg::Refused(why)) => assert!(why.contains("keeps no names"), "{why}"),
        other => panic!("a replica was planted by a non-keeper: {other:?}"),
    }

    // Users of the other nodes still change the file's attributes and names.
    let f2 = c.nodes[2].path("f");
    fs::set_permissions(&f2, fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(c.nodes[1].path("g")).unwrap();
    wait_until("node 2's chmod seen", Duration::from_secs(10), || {
        fs::metadata(c.nodes[0].path("f")).is_ok_and(|a| a.permissions().mode() & 0o777 == 0o600)
    });
    assert_eq!(fs::read(&f2).unwrap(), b"node 0's bytes");
    assert!(!c.nodes[2].path("g").exists());
}

/// A thread count from /proc.
fn threads(pid: u32) -> usize {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line[8..].trim().parse().unwrap()
}

/// A member that opens many pull connections and asks on each once made the holder start a
/// thread per connection (200 more); now they share at most `--serve-threads` (64), idle ones
/// wait on no thread and are still answered, and another node's read is served meanwhile.
#[test]
fn pull_connections_share_a_bounded_pool_of_threads() {
    let mut c = Cluster::new("threads", 3);
    let data = pattern(4 * MIB, 31);
    fs::write(c.backing.join("x"), &data).unwrap();
    c.start(2);
    assert!(fs::read(c.nodes[0].path("x")).unwrap() == data);
    c.wait_published(1);
    let key = Secret::load(&c.secret).unwrap();
    let pid = c.nodes[0].pid;
    let before = threads(pid);
    // As node 2, a member that is not running: 200 connections (under the 256 per peer), each
    // asking once for a path the holder refuses (an answer that costs it nothing but a thread).
    let ask = |s: &mut Sealed, id| {
        let bad = Message::Request {
            id,
            path: "../etc/passwd".into(),
            version: dyadfs::core::Version {
                size: 1,
                mtime_ns: 1,
            },
            offset: 0,
            len: 1,
        };
        s.send(&bad).unwrap();
        assert!(
            matches!(s.recv(), Some(Message::Error { .. })),
            "request {id}"
        );
    };
    let mut conns: Vec<Sealed> = (0..200).map(|_| puller_as(&c, 0, &key, 2)).collect();
    for (i, s) in conns.iter_mut().enumerate() {
        ask(s, i as u64);
    }
    let grown = threads(pid).saturating_sub(before);
    // Node 1 reads the file from node 0 while those connections stay open.
    assert!(fs::read(c.nodes[1].path("x")).unwrap() == data);
    assert_eq!(c.nodes[1].stat("bytes_from_peers"), 4 * MIB as u64);
    // Every idle connection is still answered (none was closed to make room).
    for (i, s) in conns.iter_mut().enumerate() {
        ask(s, 1000 + i as u64);
    }
    let grown = grown.max(threads(pid).saturating_sub(before));
    eprintln!("node 0: {before} threads, {grown} more with 200 pull connections");
    assert!(grown <= 64 + 8, "{grown} threads more for 200 connections");
}

/// A backing file's POSIX ACL that denies one user what its mode bits allow everyone is not
/// bypassed through an `allow_other` mount (the kernel judges the mount by the mode bits it
/// presents): nobody, denied by a named entry, cannot read the file; the owner still can.
#[test]
fn an_acl_deny_on_a_backing_file_holds_through_the_mount() {
    let f = Fixture::new("acl");
    f.write("denied.bin", b"not for nobody");
    // rw-r--r-- with user:nobody:--- (the kernel's xattr format: version 2, then 8-byte
    // entries of tag, permissions and id, in tag order).
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 0, 65534),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    let path = std::ffi::CString::new(
        f.backing
            .join("denied.bin")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: NUL-terminated path and name, and a buffer of the length passed.
    let set = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    assert_eq!(
        set,
        0,
        "setting the ACL: {}",
        std::io::Error::last_os_error()
    );
    let direct = f.backing.join("denied.bin");
    assert!(
        !as_nobody(&format!("cat {} >/dev/null 2>&1", direct.display())),
        "the ACL denies nobody"
    );
    let m = f.mount(&["-o", "allow_other"]);
    let through = m.path("denied.bin");
    assert!(
        !as_nobody(&format!("cat {} >/dev/null 2>&1", through.display())),
        "nobody read through the mount what the ACL denies it"
    );
    assert_eq!(fs::read(&through).unwrap(), b"not for nobody");
    m.unmount();
}

/// The rendezvous directory is the job user's, the daemon root's: what the user planted there
/// cannot aim root's writes or reads. A temp-file name or a node file that is a symlink to a
/// root-only file, a FIFO, and a node file of a stranger each fail the mount with one line
/// naming the entry; the root file is neither rewritten nor shown. (Before: root rewrote the
/// victim through `.0.node.tmp`, and printed its first line through `1.node`.)
#[test]
fn a_users_rendezvous_dir_cannot_aim_roots_file_operations() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new("rdv-attack");
    let base = f.root.join("attack");
    fs::create_dir_all(&base).unwrap();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = f.root.join("victim");
    fs::write(&victim, b"ROOT-ONLY 1 127.0.0.1:1 r\n").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
    let rdv = base.join("rdv");
    let (r, v) = (rdv.display(), victim.display());
    assert!(as_nobody(&format!("mkdir -m 700 {r} && chmod 755 {r}")));
    let port = 20_000 + (std::process::id() % 200) as u16 * 50 + 47;
    let listen = format!("127.0.0.1:{port}");
    let rdv_s = rdv.to_str().unwrap();
    let refused = |planted: &str, says: &[&str]| {
        assert!(as_nobody(planted), "{planted}");
        let started = std::time::Instant::now();
        let out = f.try_mount(&[
            "--node-id",
            "0",
            "--rendezvous",
            rdv_s,
            "--nodes",
            "2",
            "--listen",
            &listen,
        ]);
        let err = refused_in_one_line(&out, &f.mnt, says);
        assert!(!err.contains("ROOT-ONLY"), "{planted}: {err}");
        assert!(started.elapsed() < Duration::from_secs(30), "{err}");
        assert_eq!(fs::read(&victim).unwrap(), b"ROOT-ONLY 1 127.0.0.1:1 r\n");
        // The next attempt starts from a directory the user cleaned.
        assert!(as_nobody(&format!("rm -f {r}/.*.tmp {r}/*.node")), "clean");
        let _ = fs::remove_file(rdv.join("0.node"));
    };
    refused(
        &format!("ln -s {v} {r}/.0.node.tmp"),
        &[".0.node.tmp", "symlink"],
    );
    refused(
        &format!("ln -s {v} {r}/1.node && echo '5 127.0.0.1:9 r' > {r}/5.node"),
        &["1.node", "symlink"],
    );
    refused(
        &format!("ln -s /dev/zero {r}/1.node"),
        &["1.node", "symlink"],
    );
    refused(
        &format!("mkfifo {r}/1.node"),
        &["1.node", "not a regular file"],
    );
    // A node file of neither this daemon's user nor the directory's owner (made by root here:
    // protected_hardlinks keeps a user from linking another's file in).
    let stranger = rdv.join("1.node");
    fs::write(&stranger, b"1 127.0.0.1:9 r\n").unwrap();
    std::os::unix::fs::chown(&stranger, Some(4242), Some(4242)).unwrap();
    refused("true", &["1.node", "uid 4242"]);
}

/// What one local user's names make the root daemon hold is bounded (`--max-names-per-user`):
/// past it a new file's publish (at its close) fails with EDQUOT and the file is not named;
/// root is not bounded; a removal gives the place back. (Before: any number of empty files,
/// each a few hundred bytes of the daemon's memory.)
#[test]
fn a_users_names_are_bounded() {
    let f = Fixture::new("names-bound");
    let ssd = f.root.join("ssd-bound");
    let m = f.mount_managed_with(&ssd, &["-o", "allow_other", "--max-names-per-user", "50"]);
    // Each file created and closed, as nobody; what each close said.
    let script = r#"
import errno, sys
d, n = sys.argv[1], int(sys.argv[2])
said = {}
for i in range(n):
    try:
        # (Something written: then its close publishes it, and says so if it cannot.)
        with open(f"{d}/n{i}", "wb") as f:
            f.write(b"x")
        said["ok"] = said.get("ok", 0) + 1
    except OSError as e:
        said[errno.errorcode[e.errno]] = said.get(errno.errorcode[e.errno], 0) + 1
print(" ".join(f"{k}={v}" for k, v in sorted(said.items())))
"#;
    let out = as_user(65534, 65534)
        .args(["/usr/bin/python3", "-c", script])
        .arg(&m.mnt)
        .arg("60")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        said,
        "EDQUOT=10 ok=50",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let named = fs::read_dir(&m.mnt).unwrap().count();
    assert_eq!(named, 50, "names past the bound were published");
    fs::write(m.path("roots"), b"root is not bounded").unwrap();
    let mnt = m.mnt.display().to_string();
    assert!(as_nobody(&format!("rm {mnt}/n1")));
    let out = as_user(65534, 65534)
        .args([
            "/usr/bin/python3",
            "-c",
            "import sys\nwith open(sys.argv[1], 'wb') as f: f.write(b'x')",
        ])
        .arg(m.path("again"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.unmount();
}

/// `dyadfs keygen ~/.dyadfs/job.key`, as the docs write it, on an account without `~/.dyadfs`:
/// the directory is made, private like the key, and the key loads.
#[test]
fn keygen_makes_a_private_key_directory() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new("keygen");
    let key = f.root.join("home/.dyadfs/job.key");
    succeeded("keygen", dyadfs().arg("keygen").arg(&key).output().unwrap());
    let dir = fs::metadata(key.parent().unwrap()).unwrap();
    assert_eq!(dir.permissions().mode() & 0o777, 0o700);
    Secret::load(&key).unwrap();
}

/// The opens one user can keep waiting for names (`--wait`) are bounded (`--max-waits-per-user`,
/// 1,024 here), each an entry in the root daemon's table of waits; past them an open fails at once (ENOENT) and is counted
/// (`name_waits_refused`). The waits all come from one CPU, so over io_uring they land on one
/// queue, whose ring threads let fewer wait; that queue still answers at once, the refusals
/// and another file's read alike (entries were registered one by one as waits took them: the
/// requests of a burst that found none free queued in the kernel for the whole wait, and
/// nothing was refused).
#[test]
fn a_users_waiting_opens_are_bounded() {
    let f = Fixture::new("waits-bound");
    let ssd = f.root.join("ssd-waits");
    let m = f.mount_managed_with(
        &ssd,
        &[
            "-o",
            "allow_other",
            "--wait",
            "5s",
            "--max-waits-per-user",
            "1024",
        ],
    );
    fs::write(m.mnt.join("present"), b"here").unwrap();
    // 1,100 threads of nobody on one CPU, each opening a name never produced, at once; then,
    // while they wait, a read of a file that is there.
    let script = r#"
import os, sys, threading, time
d, n = sys.argv[1], int(sys.argv[2])
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
fast = []
def one(i):
    t = time.monotonic()
    try:
        open(f"{d}/never-{i}", "rb")
    except FileNotFoundError:
        if time.monotonic() - t < 2.5:
            fast.append(i)
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
# A second for the opens to reach the daemon and wait: the read below is to come behind them.
time.sleep(1)
t = time.monotonic()
with open(f"{d}/present", "rb") as f:
    assert f.read() == b"here"
read = time.monotonic() - t
for t in ts:
    t.join()
print(len(fast), read)
"#;
    let out = as_user(65534, 65534)
        .args(["/usr/bin/python3", "-c", script])
        .arg(&m.mnt)
        .arg("1100")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let (fast, read) = said
        .split_once(' ')
        .and_then(|(f, r)| Some((f.parse::<usize>().ok()?, r.trim().parse::<f64>().ok()?)))
        .unwrap_or_else(|| panic!("{said}{}", String::from_utf8_lossy(&out.stderr)));
    let refused = m.stat("name_waits_refused");
    assert!(refused >= 76, "{refused} opens refused");
    assert_eq!(fast as u64, refused, "opens answered at once, refused");
    assert!(read < 2.5, "a read behind the waits took {read} s");
    m.unmount();
}

/// A plain user who may not open /dev/fuse is told so in one line naming it and the fix, and
/// nothing is made (it said "cannot mount MNT: Permission denied (os error 13)" after making the
/// cache dir). /dev/fuse is made root's alone for the test and put back as it was.
#[test]
fn a_user_without_dev_fuse_is_told_which_file() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new("no-dev-fuse");
    let base = f.root.join("user");
    fs::create_dir_all(base.join("mnt")).unwrap();
    fs::create_dir_all(base.join("data")).unwrap();
    std::os::unix::fs::chown(&base, Some(65534), Some(65534)).unwrap();
    for d in ["mnt", "data"] {
        std::os::unix::fs::chown(base.join(d), Some(65534), Some(65534)).unwrap();
    }
    let mode = fs::metadata("/dev/fuse").unwrap().permissions().mode();
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(mode & !0o077)).unwrap();
    let out = as_user(65534, 65534)
        .arg(env!("CARGO_BIN_EXE_dyadfs"))
        .arg("mount")
        .arg(base.join("mnt"))
        .arg("--ssd")
        .arg(base.join("ssd"))
        .arg("--backing")
        .arg(base.join("data"))
        .output()
        .unwrap();
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(mode)).unwrap();
    refused_in_one_line(&out, &base.join("mnt"), &["/dev/fuse", "group"]);
    assert!(!base.join("ssd").exists(), "the cache dir was made");
}
