//! Several real daemons on 127.0.0.1 (2 racks), UCX over tcp on loopback, one shared backing
//! directory: shifted epochs come from peers, simultaneous misses read the backing store once,
//! dead or frozen holders never break or hang reads, nodes learn holders in bulk from the
//! feeds of copies, bad peers files are refused.

mod common;

use std::fs;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;

/// Reads `len` bytes at `at` of `rel` on `m` (a record of a large file), checked against `data`.
fn read_record(m: &Mounted, rel: &str, data: &[u8], (at, len): (usize, usize)) {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(m.path(rel)).unwrap();
    let mut buf = vec![0; len];
    f.read_exact_at(&mut buf, at as u64).unwrap();
    assert!(
        buf == data[at..at + len],
        "{rel} at {at} on {}",
        m.mnt.display()
    );
}

/// 200 small files under `set/` of the shared directory (their bytes from `seed`), and their
/// total size.
fn small_set(c: &Cluster, seed: u64) -> (Vec<(String, Vec<u8>)>, u64) {
    let files: Vec<(String, Vec<u8>)> = (0..200)
        .map(|k| (format!("set/f{k:03}"), pattern(4096 + k, seed + k as u64)))
        .collect();
    fs::create_dir_all(c.backing.join("set")).unwrap();
    for (p, d) in &files {
        fs::write(c.backing.join(p), d).unwrap();
    }
    let total = files.iter().map(|(_, d)| d.len() as u64).sum();
    (files, total)
}

#[test]
fn shifted_epochs_read_nothing_from_the_backing_store() {
    shifted_epochs("epochs", &[]);
}

/// The same with every node opening files without asking (`--no-open`): each file is pulled at
/// its first read, by inode.
#[test]
fn shifted_epochs_without_opens_read_nothing_from_the_backing_store() {
    shifted_epochs("epochs-noopen", &["--no-open"]);
}

fn shifted_epochs(name: &str, extra: &[&str]) {
    // One variant at a time: each is four daemons' work.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Cluster::new(name, 4);
    c.extra = extra.iter().map(|a| a.to_string()).collect();
    let files: Vec<(String, Vec<u8>)> = (0..32)
        .map(|k| {
            (
                format!("train/s{k:03}.npz"),
                pattern(MIB / 2 + k * 7919, k as u64),
            )
        })
        .collect();
    for (p, d) in &files {
        let path = c.backing.join(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, d).unwrap();
    }
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    c.start(4);
    for epoch in 0..3 {
        std::thread::scope(|s| {
            for (i, m) in c.nodes.iter().enumerate() {
                let files = &files;
                s.spawn(move || {
                    for (p, d) in files.iter().skip((i + epoch) % 4).step_by(4) {
                        read_check(m, p, d);
                    }
                });
            }
        });
        assert_eq!(
            c.total("bytes_from_backing"),
            total,
            "after epoch {}",
            epoch + 1
        );
        assert_eq!(
            c.total("bytes_from_peers"),
            total * epoch as u64,
            "after epoch {}",
            epoch + 1
        );
    }
    assert_eq!(c.total("backing_fetches"), 32);
    assert_eq!(c.total("peer_fetches"), 64);
    // Both racks hold every file now: a row at one rack home in each rack and at one global
    // home per file (publishes are batched: give them a moment).
    wait_until("both racks' rows", Duration::from_secs(10), || {
        (c.total("home_rack_files"), c.total("home_global_files")) == (64, 32)
    });
    assert_eq!(c.total("home_rack_files"), 64);
    assert_eq!(c.total("home_global_files"), 32);
    // The locator's round trips are counted on both ends: every one answered was sent.
    let (calls, answers) = (c.total("locator_calls"), c.total("locator_answers"));
    assert!(
        answers > 0 && answers <= calls,
        "{answers} answered of {calls} sent"
    );
}

#[test]
fn simultaneous_misses_read_the_backing_store_once() {
    let mut c = Cluster::new("coord", 4);
    let data = pattern(6 * MIB + 3, 7);
    fs::write(c.backing.join("hot.bin"), &data).unwrap();
    c.start(4);
    std::thread::scope(|s| {
        for m in &c.nodes {
            let data = &data;
            s.spawn(move || read_check(m, "hot.bin", data));
        }
    });
    assert_eq!(
        c.total("bytes_from_backing"),
        data.len() as u64,
        "the backing store is read once"
    );
    assert_eq!(c.total("bytes_from_peers"), 3 * data.len() as u64);
    assert!(c.total("coordinated_waits") >= 1);
}

#[test]
fn killed_and_frozen_holders_never_break_reads() {
    let mut c = Cluster::new("faults", 4);
    let files: Vec<(String, Vec<u8>)> = (0..8)
        .map(|k| (format!("f{k}"), pattern(MIB + k, 40 + k as u64)))
        .collect();
    for (p, d) in &files {
        fs::write(c.backing.join(p), d).unwrap();
    }
    c.start(4);
    // Node 1 and node 2 hold everything; then node 1 is killed and node 2 frozen.
    for (p, d) in &files {
        read_check(&c.nodes[1], p, d);
        read_check(&c.nodes[2], p, d);
    }
    // SAFETY: signalling daemons this test started.
    unsafe {
        libc::kill(c.nodes[1].pid as i32, libc::SIGKILL);
        libc::kill(c.nodes[2].pid as i32, libc::SIGSTOP);
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        for m in [&c.nodes[0], &c.nodes[3]] {
            let files = &files;
            s.spawn(move || {
                for (p, d) in files {
                    read_check(m, p, d);
                }
            });
        }
    });
    let took = start.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(c.nodes[2].pid as i32, libc::SIGCONT) };
    // A dead or frozen node costs about one --peer-timeout (2 s) per role, not one per file.
    assert!(took < Duration::from_secs(20), "reads took {took:?}");
    eprintln!("reads with a killed and a frozen holder took {took:?}");
}

#[test]
fn rack_local_holders_are_preferred() {
    let mut c = Cluster::new("rack", 4);
    let data = pattern(3 * MIB, 11);
    fs::write(c.backing.join("x.npz"), &data).unwrap();
    c.start(4);
    // Node 2 (rack r1) and node 1 (rack r0) hold copies; node 0 (rack r0) must pull from node 1.
    read_check(&c.nodes[2], "x.npz", &data);
    c.wait_published(1);
    read_check(&c.nodes[1], "x.npz", &data);
    wait_until(
        "rack r0's copy is published",
        Duration::from_secs(10),
        || c.total("home_rack_files") >= 2,
    );
    let before = c.nodes[2].stat("bytes_served_to_peers");
    read_check(&c.nodes[0], "x.npz", &data);
    assert_eq!(c.nodes[0].stat("bytes_from_peers"), data.len() as u64);
    assert_eq!(
        c.nodes[1].stat("bytes_served_to_peers"),
        data.len() as u64,
        "served in the rack"
    );
    assert_eq!(
        c.nodes[2].stat("bytes_served_to_peers"),
        before,
        "no cross-rack transfer"
    );
    assert_eq!(c.total("bytes_from_backing"), data.len() as u64);
}

/// Nodes reading what others hold learn the holders in bulk from the feeds, another rack's as
/// well as their own, and pull from their own rack where it holds a copy.
#[test]
fn nodes_learn_holders_in_bulk_and_pull_in_their_rack_first() {
    let mut c = Cluster::new("hints", 4);
    let (files, total) = small_set(&c, 60);
    c.start(4);
    // Node 2 (rack r1) fills every file; node 1 (rack r0) then reads them all, then node 0 (r0).
    for (p, d) in &files {
        read_check(&c.nodes[2], p, d);
    }
    c.wait_published(200);
    for (p, d) in &files {
        read_check(&c.nodes[1], p, d);
    }
    // In the global homes' feeds too (each rack's first copy): node 0's hints name node 1.
    wait_until(
        "rack r0's copies are published",
        Duration::from_secs(10),
        || c.total("home_rack_files") >= 400 && c.total("home_feed_copies") >= 400,
    );
    let served = c.nodes[2].stat("bytes_served_to_peers");
    for (p, d) in &files {
        read_check(&c.nodes[0], p, d);
    }
    // Each learns the holders from the feeds: a read starts after 16 answers naming holders,
    // and until it lands a few more files are asked. Node 1 takes node 2's copies (another
    // rack: asked one by one, each would cost its rack home a round trip to the global home).
    for n in [1, 0] {
        let (hints, asked) = (
            c.nodes[n].stat("locator_hints"),
            c.nodes[n].stat("lookups_rack"),
        );
        assert!(
            hints >= 150 && asked < 100,
            "node {n}: {hints} holders learned from the feeds, {asked} of 200 files asked one by one"
        );
    }
    // Node 0 learned node 2's copies too, and pulled every file from node 1, in its rack.
    assert_eq!(
        c.nodes[2].stat("bytes_served_to_peers"),
        served,
        "node 0 pulled from node 1, in its rack"
    );
    assert_eq!(c.total("bytes_from_backing"), total);
    assert_eq!(c.total("bytes_from_peers"), 2 * total);
}

/// A node alone in its rack has no holder nearer than another rack's: it takes the feeds'
/// holders from every rack, and most of its reads locate nothing.
#[test]
fn a_node_alone_in_its_rack_learns_other_racks_holders() {
    let mut c = Cluster::new("alone", 3);
    let (files, total) = small_set(&c, 90);
    c.start(3);
    // Node 0 (rack r0, with node 1) fills every file; node 2 (rack r1, alone) reads them.
    for (p, d) in &files {
        read_check(&c.nodes[0], p, d);
    }
    c.wait_published(200);
    for (p, d) in &files {
        read_check(&c.nodes[2], p, d);
    }
    let (hints, asked) = (
        c.nodes[2].stat("locator_hints"),
        c.nodes[2].stat("lookups_rack"),
    );
    assert!(
        hints >= 150 && asked < 100,
        "node 2: {hints} holders learned from the feeds, {asked} of 200 files asked one by one"
    );
    assert_eq!(c.nodes[2].stat("bytes_from_peers"), total);
    assert_eq!(c.total("bytes_from_backing"), total);
}

fn expect_peers_error(c: &Cluster, content: &str, culprit: &str) {
    fs::write(&c.peers, content).unwrap();
    let out: Output = c.mount_cmd(0).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "accepted a bad peers file: {content:?}"
    );
    assert!(
        err.contains(culprit),
        "error {err:?} does not name {culprit:?}"
    );
    assert!(!is_mounted(&c.root.join("m0")));
}

#[test]
fn bad_peers_files_are_refused() {
    let c = Cluster::new("badpeers", 1);
    expect_peers_error(
        &c,
        "0 127.0.0.1:7000 r0\n0 127.0.0.1:7001 r0\n",
        "appears twice",
    );
    expect_peers_error(&c, "0 nowhere r0\n", "nowhere");
    expect_peers_error(
        &c,
        "0 no-such-host.invalid:7000 r0\n",
        "line 1: \"no-such-host.invalid:7000\" is not an address: host name \"no-such-host.invalid\" does not resolve",
    );
    expect_peers_error(&c, "1 127.0.0.1:7001 r0\n", "id 0 is not in the peers file");
    expect_peers_error(&c, "0 127.0.0.1:7001\n", "expected `ID HOST:PORT RACK`");
}

/// Node `i`'s host name in these tests: `localhost` for node 0, this machine's name after.
fn host_name(i: u32) -> String {
    if i == 0 {
        return "localhost".into();
    }
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

/// Issue 69: a peers file of host names, as `scontrol show hostnames` gives them (here
/// `localhost` and this machine's name, each resolving to a loopback address), works as one of
/// addresses: the second node pulls what the first read.
#[test]
fn a_peers_file_of_host_names_works() {
    let mut c = Cluster::new("hostnames", 2);
    let ports = free_ports(2);
    let named: String = (0..2u32)
        .map(|i| format!("{i} {}:{} r0\n", host_name(i), ports[i as usize]))
        .collect();
    fs::write(&c.peers, &named).unwrap();
    c.start(2);
    let data = pattern(MIB, 69);
    fs::write(c.backing.join("x"), &data).unwrap();
    read_check(&c.nodes[0], "x", &data);
    c.wait_published(1);
    read_check(&c.nodes[1], "x", &data);
    assert_eq!(c.nodes[1].stat("bytes_from_peers"), MIB as u64, "{named}");
    assert_eq!(c.nodes[1].stat("bytes_from_backing"), 0);
}

#[test]
fn rendezvous_bootstraps_without_a_peers_file() {
    let c = Cluster::new("rdv", 2);
    let data = pattern(MIB, 77);
    fs::write(c.backing.join("x"), &data).unwrap();
    let rdv = c.root.join("rendezvous");
    let ports = free_ports(2);
    let outs: Vec<Output> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u32)
            .map(|i| {
                let (c, rdv, port) = (&c, &rdv, ports[i as usize]);
                s.spawn(move || {
                    let mnt = c.root.join(format!("m{i}"));
                    fs::create_dir_all(&mnt).unwrap();
                    node_cmd()
                        .arg("mount")
                        .arg(&mnt)
                        .arg("--ssd")
                        .arg(c.root.join(format!("s{i}")))
                        .arg("--backing")
                        .arg(&c.backing)
                        .args(["--node-id", &i.to_string(), "--rendezvous"])
                        .arg(rdv)
                        .args(["--nodes", "2", "--rack", &format!("r{i}")])
                        // Host names, as a cluster's launcher gives them.
                        .args(["--listen", &format!("{}:{port}", host_name(i))])
                        .output()
                        .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let nodes: Vec<Mounted> = outs
        .into_iter()
        .enumerate()
        .map(|(i, out)| mounted_at(&c.root.join(format!("m{i}")), out))
        .collect();
    read_check(&nodes[0], "x", &data);
    wait_until(
        "node 0's copy is published",
        Duration::from_secs(10),
        || {
            nodes
                .iter()
                .map(|m| m.stat("home_global_files"))
                .sum::<u64>()
                >= 1
        },
    );
    read_check(&nodes[1], "x", &data);
    assert_eq!(nodes[1].stat("bytes_from_peers"), MIB as u64);
    assert_eq!(nodes[1].stat("bytes_from_backing"), 0);
    drop(nodes);
    let _ = Path::new(&rdv);
}

/// A node that restarts has empty tables: the others re-announce what those tables held
/// (copies it is rack home of, racks' copies it is global home of) before it serves, so reads
/// through it find the copies instead of going back to the backing store.
#[test]
fn a_restarted_node_learns_the_holders_again() {
    let mut c = Cluster::new("rejoin", 4);
    let files: Vec<(String, Vec<u8>)> = (0..48)
        .map(|k| {
            (
                format!("r{k:02}"),
                pattern(MIB / 8 + k * 131, 70 + k as u64),
            )
        })
        .collect();
    for (p, d) in &files {
        fs::write(c.backing.join(p), d).unwrap();
    }
    let total: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    c.start(4);
    // Node 0 (rack r0) and node 2 (rack r1) hold everything.
    for m in [&c.nodes[0], &c.nodes[2]] {
        for (p, d) in &files {
            read_check(m, p, d);
        }
    }
    assert_eq!(c.total("bytes_from_backing"), total);
    // Node 3 restarts with an empty cache: its rack and global tables are gone.
    c.nodes.remove(3).unmount();
    fs::remove_dir_all(c.root.join("s3")).unwrap();
    c.start_node(3);
    for (p, d) in &files {
        read_check(&c.nodes[3], p, d);
    }
    assert_eq!(c.nodes[3].stat("bytes_from_backing"), 0);
    assert_eq!(c.nodes[3].stat("bytes_from_peers"), total);
}

/// A large file read at random on one node (pages, not chunks) is read at random on another
/// the next epoch: the same records come from the first node's pages, never the shared file
/// system; a record nobody read comes through the first node (its fetcher), which reads only
/// its pages there; no pull is refused.
#[test]
fn a_partly_cached_file_serves_its_pages_to_peers() {
    let mut c = Cluster::new("pages", 2);
    let data = pattern(24 * MIB, 11);
    fs::write(c.backing.join("rows.h5"), &data).unwrap();
    c.start(2);
    let records = [
        (MIB + 100, 5000),
        (9 * MIB, 200 << 10),
        (20 * MIB + 70_000, 1000),
    ];
    let read = |m: &Mounted, record| read_record(m, "rows.h5", &data, record);
    for r in records {
        read(&c.nodes[0], r);
    }
    let fetched = c.nodes[0].stat("bytes_from_backing");
    assert!(
        fetched < 4 * MIB as u64,
        "node 0 fetched {fetched} bytes for 3 records: pages, not chunks"
    );
    // Its partial copy is published as soon as it has pages.
    c.wait_published(1);
    for r in records {
        read(&c.nodes[1], r);
    }
    assert_eq!(c.nodes[1].stat("bytes_from_backing"), 0);
    let pulled = c.nodes[1].stat("bytes_from_peers");
    assert!(
        pulled > 0 && pulled <= fetched,
        "pulled {pulled} of {fetched}"
    );
    assert_eq!(c.nodes[0].stat("bytes_served_to_peers"), pulled);
    // A record nobody read: node 0, the file's designated fetcher, reads its pages from the
    // shared file system for node 1 (each byte is read there once in the cluster).
    read(&c.nodes[1], (16 * MIB + 5, 3000));
    assert_eq!(c.nodes[1].stat("bytes_from_backing"), 0);
    let more = c.nodes[1].stat("bytes_from_peers") - pulled;
    assert!(more > 0 && more < MIB as u64, "{more} bytes for 3000");
    assert_eq!(c.nodes[0].stat("bytes_from_backing"), fetched + more);
    assert_eq!(c.total("pulls_refused"), 0);
}

/// A restarted node publishes the partial copies it held: the next epoch on another node still
/// reads the records the first read, from its pages, none from the shared file system.
#[test]
fn a_restarted_nodes_pages_are_published_again() {
    let mut c = Cluster::new("pages-restart", 2);
    let data = pattern(24 * MIB, 12);
    fs::write(c.backing.join("rows.h5"), &data).unwrap();
    c.start(2);
    let records = [(2 * MIB + 7, 9000), (13 * MIB, 100 << 10)];
    let read = |m: &Mounted, record| read_record(m, "rows.h5", &data, record);
    for r in records {
        read(&c.nodes[0], r);
    }
    // Both nodes restart (every table is gone); node 0 keeps its cache.
    c.nodes.clear();
    c.start(2);
    c.wait_published(1);
    for r in records {
        read(&c.nodes[1], r);
    }
    assert_eq!(c.nodes[1].stat("bytes_from_backing"), 0);
    assert!(c.nodes[1].stat("bytes_from_peers") > 0);
    assert_eq!(c.total("bytes_from_backing"), 0, "after the restart");
}
