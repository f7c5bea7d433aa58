//! The site (issue 72): the node services of several "nodes" (each its own process, cache
//! directory, socket and port on 127.0.0.1) serve each other the datasets they cached, under
//! the site key. A job on other nodes, of another user with the rights, reads a dataset
//! with 0 bytes from the shared FS; a user without them gets EACCES whatever is cached; and
//! what the site held outlives every service's restart. Real users, real mounts, real
//! services, the sealed stream between them.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::node::{GROUP, ONE_AT_A_TIME, Service, User, attached, dataset, scratch};
use common::{FuseForUsers, dyadfs, free_ports, wait_until};
use serde_json::Value;

/// The site's files: a peers file of `n` nodes in two racks, and the site key.
fn site(root: &Path, n: usize) -> (PathBuf, PathBuf) {
    let ports = free_ports(n);
    let peers = root.join("site.peers");
    let lines: Vec<String> = (0..n)
        .map(|i| format!("{i} 127.0.0.1:{} r{}", ports[i], i * 2 / n))
        .collect();
    fs::write(&peers, lines.join("\n") + "\n").unwrap();
    let key = root.join("site.key");
    let out = dyadfs().arg("keygen").arg(&key).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (peers, key)
}

fn site_args<'a>(peers: &'a Path, key: &'a Path, id: &'a str) -> Vec<&'a str> {
    vec![
        "--site-peers",
        peers.to_str().unwrap(),
        "--node-id",
        id,
        "--site-key",
        key.to_str().unwrap(),
        "--data-plane",
        "stream",
        "--peer-timeout",
        "3s",
    ]
}

/// Node `i`'s service.
fn start(root: &Path, i: usize, peers: &Path, key: &Path) -> Service {
    let id = i.to_string();
    Service::start_named(root, &format!("n{i}"), &site_args(peers, key, &id))
}

/// A user's mount point on node `i`.
fn user_on(name: &str, root: &Path, i: usize, groups: &[u32]) -> Option<User> {
    let dir = root.join(format!("n{i}"));
    fs::create_dir_all(&dir).unwrap();
    User::new(name, &dir, groups)
}

fn site_status(s: &Service) -> Value {
    s.try_status().expect("the service answers")["site"].clone()
}

/// Files some node keeps a global home's row of, over `nodes`.
fn published<'a>(nodes: impl IntoIterator<Item = &'a Service>) -> u64 {
    let of = |s: &Service| site_status(s)["home_global_files"].as_u64().unwrap();
    nodes.into_iter().map(of).sum()
}

/// Job A: user `a[i]` on node `i` reads half `i` of `readable` (the even files, then the odd
/// ones), which node `i` then holds; returns once every file has its global home's row.
fn job_a_reads_halves(
    a: [&User; 2],
    nodes: &[Service],
    backing: &Path,
    readable: &[&(String, Vec<u8>)],
) {
    for (i, user) in a.into_iter().enumerate() {
        attached("job A attaches", user.mount(&nodes[i], backing, &[]));
        for f in readable.iter().skip(i).step_by(2) {
            assert_eq!(user.read(&f.0).as_ref(), Ok(&f.1), "job A reads {}", f.0);
        }
    }
    let copies = readable.len() as u64;
    wait_until(
        "job A's copies are published",
        Duration::from_secs(10),
        || published(nodes) >= copies,
    );
}

/// Job A of user 1 on nodes 0-1 reads the dataset (each node its half, from the shared FS);
/// job B of user 2 (group rights) on nodes 2-3 reads all of it on both: 0 bytes from the shared
/// FS, every byte pulled from the site; job C of user 3 (no group rights) on node 3 gets EACCES
/// on the group's files, cached there as they are; a service with another key is refused at
/// start; and after every service restarted, job D of user 1 on node 0 reads the whole dataset,
/// the half node 1 held pulled from it: 0 bytes from the shared FS.
#[test]
fn another_job_on_other_nodes_reads_the_dataset_from_the_site() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("site");
    let (backing, files) = dataset(&root);
    let readable: Vec<&(String, Vec<u8>)> =
        files.iter().filter(|f| !f.0.starts_with("priv/")).collect();
    let total: u64 = readable.iter().map(|f| f.1.len() as u64).sum();
    let users = (
        (0..2).map(|i| user_on("dyadfs-user", &root, i, &[GROUP])),
        (2..4).map(|i| user_on("dyadfs-u2", &root, i, &[GROUP])),
        user_on("dyadfs-u3", &root, 3, &[]),
    );
    let (Some(a), Some(b), Some(c)) = (
        users.0.collect::<Option<Vec<User>>>(),
        users.1.collect::<Option<Vec<User>>>(),
        users.2,
    ) else {
        return;
    };
    let _fuse = FuseForUsers::open();
    let (peers, key) = site(&root, 4);
    let mut nodes: Vec<Service> = (0..3).map(|i| start(&root, i, &peers, &key)).collect();
    // A service holding another key is refused: it names the peers that refused its proof.
    let wrong = root.join("wrong.key");
    assert!(
        dyadfs()
            .arg("keygen")
            .arg(&wrong)
            .status()
            .unwrap()
            .success()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_dyadfs"))
        .args(["node", "serve", "--ssd"])
        .arg(root.join("wrong-ssd"))
        .arg("--socket")
        .arg(root.join("run/wrong.sock"))
        .args(site_args(&peers, &wrong, "3"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("site key is not the site's"),
        "{err}"
    );
    nodes.push(start(&root, 3, &peers, &key));
    assert_eq!(site_status(&nodes[3])["members"], 4);

    // Job A: user 1 on nodes 0-1, each reading its half.
    for (i, user) in a.iter().enumerate() {
        attached("job A attaches", user.mount(&nodes[i], &backing, &[]));
        for f in readable.iter().skip(i).step_by(2) {
            assert_eq!(user.read(&f.0).as_ref(), Ok(&f.1), "job A reads {}", f.0);
        }
    }
    let from_backing = |n: &[Service]| -> u64 {
        n.iter()
            .map(|s| match s.try_status().unwrap()["datasets"].as_array() {
                Some(d) if !d.is_empty() => d[0]["bytes_from_backing"].as_u64().unwrap(),
                _ => 0,
            })
            .sum()
    };
    assert_eq!(from_backing(&nodes[..2]), total);
    // Every copy has a row at its rack's home and at its global home (publishes are batched).
    let homes = |n: &[Service], of: &str| -> u64 {
        n.iter().map(|s| site_status(s)[of].as_u64().unwrap()).sum()
    };
    let copies = readable.len() as u64;
    wait_until(
        "job A's copies are published",
        Duration::from_secs(10),
        || {
            homes(&nodes, "home_rack_files") >= copies
                && homes(&nodes, "home_global_files") >= copies
        },
    );

    // Job B: user 2 on nodes 2-3, every file on both.
    for (i, user) in b.iter().enumerate() {
        attached("job B attaches", user.mount(&nodes[2 + i], &backing, &[]));
        for f in &readable {
            assert_eq!(user.read(&f.0).as_ref(), Ok(&f.1), "job B reads {}", f.0);
        }
    }
    assert_eq!(
        from_backing(&nodes[2..]),
        0,
        "job B read nothing from the shared FS"
    );
    for n in &nodes[2..] {
        assert!(n.dataset("bytes_from_peers") > 0);
    }
    let pulled: u64 = nodes[2..]
        .iter()
        .map(|n| n.dataset("bytes_from_peers"))
        .sum();
    assert_eq!(pulled, 2 * total, "every byte of job B came from the site");

    // Job C: user 3 has no group rights; the copy on node 3 is not served to it.
    attached("job C attaches", c.mount(&nodes[3], &backing, &[]));
    assert_eq!(c.read("pub/1.bin").as_ref(), Ok(&files[1].1));
    for rel in ["grp/0.bin", "grp/3.bin", "priv/1.bin"] {
        let e = c.read(rel).unwrap_err();
        assert!(e.contains("Permission denied"), "{rel}: {e}");
    }
    drop((b, c));

    // Job D: every service restarted; user 1 on node 0 reads the whole dataset.
    for u in &a {
        u.unmount();
    }
    for n in nodes.drain(..) {
        n.stop();
    }
    let nodes: Vec<Service> = (0..4).map(|i| start(&root, i, &peers, &key)).collect();
    wait_until(
        "the copies are published again",
        Duration::from_secs(20),
        || homes(&nodes, "home_global_files") >= copies,
    );
    attached("job D attaches", a[0].mount(&nodes[0], &backing, &[]));
    for f in &readable {
        assert_eq!(a[0].read(&f.0).as_ref(), Ok(&f.1), "job D reads {}", f.0);
    }
    assert_eq!(
        from_backing(&nodes),
        0,
        "job D read nothing from the shared FS"
    );
    assert!(
        nodes[0].dataset("bytes_from_peers") > 0,
        "node 1's half pulled"
    );
    drop(a);
    for n in nodes {
        n.stop();
    }
    fs::remove_dir_all(&root).unwrap();
}

/// A holder that froze (SIGSTOP) while another job reads what it holds: every file is still
/// read right (the frozen holder's from the shared FS as the reading user), the reads finish
/// (each file waits one peer timeout at most, and none once gossip finds the holder down), and
/// once the others took over the frozen node's rows, what the live holder has is pulled from it.
/// (While it is only suspected, a file whose global home is the frozen node is read from the
/// shared FS: only the home knew its holders.)
#[test]
fn a_frozen_holder_costs_a_timeout_and_the_job_goes_on() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("frozen");
    let (backing, files) = dataset(&root);
    // The files every user may read.
    let readable: Vec<&(String, Vec<u8>)> =
        files.iter().filter(|f| f.0.starts_with("pub/")).collect();
    let (Some(a0), Some(a1), Some(b)) = (
        user_on("dyadfs-user", &root, 0, &[]),
        user_on("dyadfs-user", &root, 1, &[]),
        user_on("dyadfs-u2", &root, 2, &[]),
    ) else {
        return;
    };
    let _fuse = FuseForUsers::open();
    let (peers, key) = site(&root, 3);
    let nodes: Vec<Service> = (0..3).map(|i| start(&root, i, &peers, &key)).collect();
    // Node 0 holds half the files, node 1 the other half.
    job_a_reads_halves([&a0, &a1], &nodes, &backing, &readable);
    drop((a0, a1));
    // SAFETY: kill only sends a signal to our own child.
    unsafe { libc::kill(nodes[0].child.id() as i32, libc::SIGSTOP) };
    attached("job B attaches", b.mount(&nodes[2], &backing, &[]));
    let started = std::time::Instant::now();
    let frozen: Vec<_> = readable.iter().step_by(2).collect();
    for f in &frozen {
        assert_eq!(b.read(&f.0).as_ref(), Ok(&f.1), "job B reads {}", f.0);
    }
    eprintln!(
        "job B read the frozen holder's {} files in {:?}",
        frozen.len(),
        started.elapsed()
    );
    let bytes = |fs: &[&&(String, Vec<u8>)]| fs.iter().map(|f| f.1.len() as u64).sum::<u64>();
    assert_eq!(
        nodes[2].dataset("bytes_from_backing"),
        bytes(&frozen),
        "what only the frozen holder had, read from the shared FS"
    );
    wait_until(
        "nodes 1 and 2 find node 0 down and take over its rows",
        Duration::from_secs(30),
        || {
            nodes[1..].iter().all(|n| {
                let s = site_status(n);
                s["members_down"] == 1 && s["failovers"].as_u64() >= Some(1)
            })
        },
    );
    let live: Vec<_> = readable.iter().skip(1).step_by(2).collect();
    for f in &live {
        assert_eq!(b.read(&f.0).as_ref(), Ok(&f.1), "job B reads {}", f.0);
    }
    assert_eq!(
        nodes[2].dataset("bytes_from_peers"),
        bytes(&live),
        "node 1's half pulled from it"
    );
    assert_eq!(
        nodes[2].dataset("bytes_from_backing"),
        bytes(&frozen),
        "nothing more from the shared FS"
    );
    // SAFETY: as above.
    unsafe { libc::kill(nodes[0].child.id() as i32, libc::SIGCONT) };
    drop(b);
    for n in nodes {
        n.stop();
    }
    fs::remove_dir_all(&root).unwrap();
}

/// The card's data plane between services: UCX RMA (over loopback tcp, as the site's admin
/// would allow with `--ucx-over-tcp`), every chunk by an RMA get (`--eager-max 0`): user 2 on
/// node 1 reads what user 1 cached on node 0, 0 bytes from the shared FS.
#[test]
fn the_site_pulls_over_ucx() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("site-ucx");
    let (backing, files) = dataset(&root);
    let readable: Vec<&(String, Vec<u8>)> =
        files.iter().filter(|f| f.0.starts_with("pub/")).collect();
    let (Some(a), Some(b)) = (
        user_on("dyadfs-user", &root, 0, &[]),
        user_on("dyadfs-u2", &root, 1, &[]),
    ) else {
        return;
    };
    let _fuse = FuseForUsers::open();
    let (peers, key) = site(&root, 2);
    let ucx = ["--data-plane", "ucx", "--ucx-over-tcp", "--eager-max", "0"];
    let nodes: Vec<Service> = (0..2)
        .map(|i| {
            let id = i.to_string();
            let mut args = site_args(&peers, &key, &id);
            args.retain(|a| *a != "--data-plane" && *a != "stream");
            args.extend(ucx);
            Service::start_named(&root, &format!("n{i}"), &args)
        })
        .collect();
    attached("user 1 attaches", a.mount(&nodes[0], &backing, &[]));
    for f in &readable {
        assert_eq!(a.read(&f.0).as_ref(), Ok(&f.1), "user 1 reads {}", f.0);
    }
    let copies = readable.len() as u64;
    wait_until(
        "user 1's copies are published",
        Duration::from_secs(10),
        || published(&nodes) >= copies,
    );
    attached("user 2 attaches", b.mount(&nodes[1], &backing, &[]));
    for f in &readable {
        assert_eq!(b.read(&f.0).as_ref(), Ok(&f.1), "user 2 reads {}", f.0);
    }
    let total: u64 = readable.iter().map(|f| f.1.len() as u64).sum();
    assert_eq!(nodes[1].dataset("bytes_from_backing"), 0);
    assert_eq!(nodes[1].dataset("bytes_from_peers"), total);
    let log = fs::read_to_string(&nodes[1].log).unwrap();
    assert!(
        log.contains("UCX loaded") && log.contains("ucx=true"),
        "the data plane is UCX: {log}"
    );
    drop((a, b));
    for n in nodes {
        n.stop();
    }
    fs::remove_dir_all(&root).unwrap();
}

/// A rolling rotation of the site key, one service restarted at a time: each first accepts the
/// new key (`--site-key-also`), then proves with it and accepts the old one, then holds the new
/// one alone. After every restart, user 2 on node 1 reads a file it had not read yet that only
/// user 1 on node 0 cached: pulled from node 0, 0 bytes from the shared FS. Once node 0 holds
/// the new key alone, a service with the old key alone is refused at its start.
#[test]
fn the_site_key_is_rotated_one_service_at_a_time() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("rotate");
    let (backing, files) = dataset(&root);
    let readable: Vec<&(String, Vec<u8>)> =
        files.iter().filter(|f| !f.0.starts_with("priv/")).collect();
    let (Some(a), Some(b)) = (
        user_on("dyadfs-user", &root, 0, &[GROUP]),
        user_on("dyadfs-u2", &root, 1, &[GROUP]),
    ) else {
        return;
    };
    let _fuse = FuseForUsers::open();
    let (peers, old) = site(&root, 2);
    let new = root.join("new.key");
    assert!(dyadfs().arg("keygen").arg(&new).status().unwrap().success());
    let serve = |i: usize, keys: &[&Path]| -> Service {
        let id = i.to_string();
        let mut args = site_args(&peers, keys[0], &id);
        if let Some(also) = keys.get(1) {
            args.extend(["--site-key-also", also.to_str().unwrap()]);
        }
        Service::start_named(&root, &format!("n{i}"), &args)
    };
    let mut nodes = vec![serve(0, &[&old]), serve(1, &[&old])];
    attached("user 1 attaches", a.mount(&nodes[0], &backing, &[]));
    for f in &readable {
        assert_eq!(a.read(&f.0).as_ref(), Ok(&f.1), "user 1 reads {}", f.0);
    }
    let copies = readable.len() as u64;
    let mut unread = readable.iter();
    let steps: [(usize, &[&Path]); 6] = [
        (1, &[&old, &new]),
        (0, &[&old, &new]),
        (0, &[&new, &old]),
        (1, &[&new, &old]),
        (0, &[&new]),
        (1, &[&new]),
    ];
    for (i, keys) in steps {
        [&a, &b][i].unmount();
        nodes.remove(i).stop();
        if i == 1 && keys.len() == 1 {
            // Node 0 proves with the new key alone now: the old one alone opens nothing.
            let out = Command::new(env!("CARGO_BIN_EXE_dyadfs"))
                .args(["node", "serve", "--ssd"])
                .arg(root.join("stale-ssd"))
                .arg("--socket")
                .arg(root.join("run/stale.sock"))
                .args(site_args(&peers, &old, "1"))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && err.contains("site key is not the site's"),
                "{err}"
            );
        }
        nodes.insert(i, serve(i, keys));
        wait_until(
            "the copies are published again",
            Duration::from_secs(20),
            || published(&nodes) >= copies,
        );
        if i == 1 {
            attached("user 2 attaches", b.mount(&nodes[1], &backing, &[]));
        }
        let f = unread.next().unwrap();
        let before = (
            nodes[1].dataset("bytes_from_peers"),
            nodes[1].dataset("bytes_from_backing"),
        );
        assert_eq!(b.read(&f.0).as_ref(), Ok(&f.1), "user 2 reads {}", f.0);
        assert_eq!(
            (
                nodes[1].dataset("bytes_from_peers") - before.0,
                nodes[1].dataset("bytes_from_backing") - before.1
            ),
            (f.1.len() as u64, 0),
            "{} pulled from node 0 with node {i} on {} key(s)",
            f.0,
            keys.len()
        );
    }
    drop((a, b));
    for n in nodes {
        n.stop();
    }
    fs::remove_dir_all(&root).unwrap();
}

/// A holder's service killed (SIGKILL: no goodbye, its log torn wherever it was) while another
/// job reads the dataset: every file is still read right, the killed node's half from the
/// shared FS; the service restarted on the same cache finds its copies, publishes them again,
/// and a third job reads them from it with 0 bytes from the shared FS.
#[test]
fn a_killed_service_restarts_on_its_cache_and_serves_again() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("killed");
    let (backing, files) = dataset(&root);
    let readable: Vec<&(String, Vec<u8>)> =
        files.iter().filter(|f| f.0.starts_with("pub/")).collect();
    let (Some(a0), Some(a1), Some(b)) = (
        user_on("dyadfs-user", &root, 0, &[]),
        user_on("dyadfs-user", &root, 1, &[]),
        user_on("dyadfs-u2", &root, 2, &[]),
    ) else {
        return;
    };
    let _fuse = FuseForUsers::open();
    let (peers, key) = site(&root, 3);
    let mut nodes: Vec<Service> = (0..3).map(|i| start(&root, i, &peers, &key)).collect();
    // Job A: node 0 caches the even files, node 1 the odd ones.
    job_a_reads_halves([&a0, &a1], &nodes, &backing, &readable);
    let half =
        |i: usize| -> Vec<&&(String, Vec<u8>)> { readable.iter().skip(i).step_by(2).collect() };
    nodes[0].child.kill().unwrap();
    nodes[0].child.wait().unwrap();
    a0.unmount();

    // Job B on node 2, node 0 dead.
    attached("job B attaches", b.mount(&nodes[2], &backing, &[]));
    let started = std::time::Instant::now();
    for f in &readable {
        assert_eq!(b.read(&f.0).as_ref(), Ok(&f.1), "job B reads {}", f.0);
    }
    eprintln!(
        "job B read {} files in {:?} with node 0 killed",
        readable.len(),
        started.elapsed()
    );
    let bytes = |fs: &[&&(String, Vec<u8>)]| fs.iter().map(|f| f.1.len() as u64).sum::<u64>();
    let total = bytes(&readable.iter().collect::<Vec<_>>());
    assert_eq!(
        nodes[2].dataset("bytes_from_peers") + nodes[2].dataset("bytes_from_backing"),
        total,
        "every byte from somewhere, once"
    );

    // Node 0's service restarted on its cache; node 1's user reads node 0's half from it.
    nodes[0] = start(&root, 0, &peers, &key);
    assert!(
        nodes[0].dataset("cached_files") >= half(0).len() as u64,
        "the killed service's copies survived: {:?}",
        nodes[0].try_status()
    );
    wait_until(
        "node 0's copies are published again",
        Duration::from_secs(20),
        || site_status(&nodes[0])["copies_published"].as_u64() >= Some(half(0).len() as u64),
    );
    let before = nodes[1].dataset("bytes_from_backing");
    for f in half(0) {
        assert_eq!(a1.read(&f.0).as_ref(), Ok(&f.1), "job C reads {}", f.0);
    }
    assert_eq!(
        nodes[1].dataset("bytes_from_backing"),
        before,
        "nothing more from the shared FS"
    );
    // (Node 2 holds them too, since job B: node 1 takes its own rack's holder, node 0.)
    assert_eq!(
        nodes[0].dataset("bytes_served_to_peers"),
        bytes(&half(0)),
        "node 0's half served by the restarted node 0"
    );
    drop((a1, b));
    for n in nodes {
        n.stop();
    }
    fs::remove_dir_all(&root).unwrap();
}
