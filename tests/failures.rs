//! Node failures with real daemons (UCX over tcp on loopback, gossip over UDP): a frozen only
//! holder costs no timeout once the cluster knows it is down, and a dead rack home sends no
//! reader to the shared file system for files a live node holds.

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::*;

const KIB: usize = 1024;

fn dataset(c: &Cluster, n: usize, len: usize) -> Vec<(String, Vec<u8>)> {
    let files: Vec<(String, Vec<u8>)> = (0..n)
        .map(|k| (format!("f{k:03}"), pattern(len + k, 70 + k as u64)))
        .collect();
    for (p, d) in &files {
        fs::write(c.backing.join(p), d).unwrap();
    }
    files
}

/// A cluster of `nodes` daemons with `--failure-detection detection` whose node 0 has read, and
/// published, every file of a dataset of `n` files of about `len` bytes (returned).
fn node0_holding(
    name: &str,
    nodes: u32,
    detection: &str,
    n: usize,
    len: usize,
) -> (Cluster, Vec<(String, Vec<u8>)>) {
    let mut c = Cluster::new(name, nodes);
    c.extra = vec!["--failure-detection".into(), detection.into()];
    let files = dataset(&c, n, len);
    c.start(nodes);
    read_all(&c.nodes[0], &files);
    c.wait_published(files.len() as u64);
    (c, files)
}

/// Reads each file through `m` (checked byte for byte); how long each read took.
fn read_each_timed(m: &Mounted, files: &[(String, Vec<u8>)]) -> Vec<Duration> {
    files
        .iter()
        .map(|f| {
            let t = Instant::now();
            read_all(m, std::slice::from_ref(f));
            t.elapsed()
        })
        .collect()
}

/// Waits until `m` reports `n` members down; returns how long that took.
fn wait_members_down(m: &Mounted, n: u64) -> Duration {
    wait_until("members declared down", Duration::from_secs(30), || {
        m.stat("members_down") >= n
    })
}

fn signal(m: &Mounted, sig: i32) {
    // SAFETY: signalling a daemon this test started.
    unsafe { libc::kill(m.pid as i32, sig) };
}

#[test]
fn a_frozen_only_holder_costs_no_timeout_once_it_is_known_down() {
    let (c, files) = node0_holding("frozen", 3, "1s", 40, 256 * KIB);
    signal(&c.nodes[0], libc::SIGSTOP);
    let detected = wait_members_down(&c.nodes[2], 1);
    eprintln!("node 0 frozen: known down at node 2 after {detected:?}");
    let t = Instant::now();
    read_all(&c.nodes[2], &files);
    let took = t.elapsed();
    signal(&c.nodes[0], libc::SIGCONT);
    eprintln!("40 files with the only holder frozen and known down: {took:?}");
    // Without the failure detector each file waits one --peer-timeout (2 s) on node 0: 80 s.
    assert!(took < Duration::from_secs(10), "reads took {took:?}");
    assert_eq!(c.nodes[2].stat("bytes_from_peers"), 0);
    assert_eq!(c.nodes[2].stat("backing_fetches"), files.len() as u64);
    // Resumed, node 0 is back: node 2 sees nobody down again.
    wait_until("node 0 back", Duration::from_secs(30), || {
        c.nodes[2].stat("members_down") == 0
    });
}

#[test]
fn a_dead_rack_home_sends_nobody_to_the_shared_file_system() {
    // Racks: nodes 0 and 1 in r0, nodes 2 and 3 in r1.
    let (c, files) = node0_holding("deadhome", 4, "1s", 64, 64 * KIB);
    signal(&c.nodes[3], libc::SIGKILL);
    for i in 0..3 {
        let took = wait_members_down(&c.nodes[i], 1);
        eprintln!("node {i} knew node 3 was down after {took:?}");
    }
    // The survivors re-home what node 3 was home of (rack r1's paths, and global paths).
    wait_until("every survivor re-homed", Duration::from_secs(10), || {
        (0..3).all(|i| c.nodes[i].stat("failovers") >= 1)
    });
    read_all(&c.nodes[2], &files);
    assert_eq!(
        c.nodes[2].stat("bytes_from_backing"),
        0,
        "files node 0 holds were read from the shared file system"
    );
    assert_eq!(c.nodes[2].stat("peer_fetches"), files.len() as u64);
    assert!(c.nodes[0].stat("failovers") + c.nodes[1].stat("failovers") > 0);
}

/// In a cluster of 4: the name home of the mount's root directory, the next in the directory's
/// order (it keeps the copies and is home once the first is dead), and the two others.
fn name_home_backup_and_others(c: &Cluster) -> (usize, usize, usize, usize) {
    let peers = fs::read_to_string(&c.peers).unwrap();
    let m = dyadfs::locator::Membership::parse(&peers, 0).unwrap();
    let home = m.global_home("") as usize;
    let backup = m.live_global_home("", |n| n as usize == home) as usize;
    let others: Vec<usize> = (0..4).filter(|&i| i != home && i != backup).collect();
    (home, backup, others[0], others[1])
}

/// Waits until the nodes but `except` keep `n` produced names in all (`home_names`: a name at
/// its directory's home and its backup copy count once each).
fn names_kept(c: &Cluster, except: &[usize], n: u64) {
    wait_until("the names are kept", Duration::from_secs(10), || {
        let nodes = c
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| !except.contains(i));
        nodes.map(|(_, m)| m.stat("home_names")).sum::<u64>() >= n
    });
}

/// The node that is name home of the mount's root directory, and the two others.
fn name_home_and_others(c: &Cluster) -> (usize, usize, usize) {
    let peers = fs::read_to_string(&c.peers).unwrap();
    let m = dyadfs::locator::Membership::parse(&peers, 0).unwrap();
    let home = m.global_home("") as usize;
    let others: Vec<usize> = (0..3).filter(|&i| i != home).collect();
    (home, others[0], others[1])
}

#[test]
fn a_restarted_name_home_still_resolves_produced_names() {
    let mut c = Cluster::new("namehome", 3);
    c.start(3);
    let (home, producer, _) = name_home_and_others(&c);
    let data = pattern(100 * KIB, 5);
    fs::write(c.nodes[producer].path("made"), &data).unwrap();
    names_kept(&c, &[], 2); // at its home and the backup copy
    // The name home restarts with empty tables (its cache is kept: it is not the producer).
    c.nodes.remove(home).unmount();
    c.start_node(home as u32);
    let got = fs::read(c.nodes[home].path("made")).expect("the name is known again");
    assert!(got == data);
    let listing: Vec<String> = fs::read_dir(&c.nodes[home].mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listing, ["made"]);
}

#[test]
fn a_dead_name_home_loses_no_name() {
    let mut c = Cluster::new("namedead", 3);
    c.extra = vec!["--failure-detection".into(), "1s".into()];
    c.start(3);
    let (home, producer, consumer) = name_home_and_others(&c);
    let data = pattern(100 * KIB, 6);
    fs::write(c.nodes[producer].path("before"), &data).unwrap();
    names_kept(&c, &[], 2);
    signal(&c.nodes[home], libc::SIGKILL);
    // A name made at once, before anyone has declared the home down: the producer's publish
    // waits for the directory to move rather than lose the name.
    fs::write(c.nodes[producer].path("after"), &data).unwrap();
    wait_members_down(&c.nodes[consumer], 1);
    // The consumer never looked the names up: their new home (the backup) answers.
    let got = fs::read(c.nodes[consumer].path("before")).expect("a name from before the death");
    assert!(got == data);
    // The publish of "after" runs at release, which the kernel sends after close returns.
    wait_until(
        "a name made as its home died",
        Duration::from_secs(10),
        || fs::read(c.nodes[consumer].path("after")).is_ok_and(|got| got == data),
    );
}

/// Four nodes read the same uncached large file at once (larger than the 8 MiB fetched whole
/// at open, so it is filled chunk by chunk): the shared file system is read exactly once per
/// file, the three waiters pulling each chunk from the fetcher, which fills what they ask for
/// ahead of its own reading.
#[test]
fn simultaneous_readers_of_a_large_file_read_each_chunk_once() {
    let mut c = Cluster::new("largeonce", 4);
    // DYADFS_TEST_LARGE=MIBxN for a heavier run (the is 64x10); 16 MiB x 5 by default.
    let (mib, n) = std::env::var("DYADFS_TEST_LARGE")
        .ok()
        .and_then(|v| {
            let (m, n) = v.split_once('x')?;
            Some((m.parse().ok()?, n.parse().ok()?))
        })
        .unwrap_or((16, 5));
    let files = dataset(&c, n, mib << 20);
    c.start(4);
    for (p, d) in &files {
        let before = c.total("bytes_from_backing");
        std::thread::scope(|s| {
            for m in &c.nodes {
                s.spawn(move || {
                    let got = fs::read(m.path(p)).unwrap();
                    assert!(got == *d, "{p} differs on {}", m.mnt.display());
                });
            }
        });
        let read = c.total("bytes_from_backing") - before;

        eprintln!(
            "{p}: shared FS read {:.2}x the file",
            read as f64 / d.len() as f64
        );
        assert_eq!(read, d.len() as u64, "{p}: read more than once");
    }
}

/// The cache data file of `path` under cache directory `ssd`.
fn data_file(ssd: &std::path::Path, path: &str) -> std::path::PathBuf {
    let h = dyadfs::core::path_hash(path);
    ssd.join("data")
        .join(format!("{:02x}", h >> 56))
        .join(format!("{h:016x}.dat"))
}

/// Flips a byte of a cached file on the disk (bit rot after the daemon checked it).
fn rot(data: &std::path::Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(data)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], at).unwrap();
}

#[test]
fn a_chunk_that_rotted_on_a_holder_is_refused_reported_and_dropped() {
    let mut c = Cluster::new("rot", 2);
    let files = dataset(&c, 1, 3 << 20);
    c.start(2);
    let (p, d) = &files[0];
    read_all(&c.nodes[0], &files);
    c.wait_published(files.len() as u64);
    rot(&data_file(&c.root.join("s0"), p), (2 << 20) + 5);
    // Node 1 pulls from node 0, the rotten chunk fails its checksum at node 1: node 1 reads it
    // elsewhere and tells node 0, which checks it again and drops it.
    let got = fs::read(c.nodes[1].path(p)).unwrap();
    assert!(got == *d, "node 1 got the rotten bytes");
    wait_until("node 0 drops the chunk", Duration::from_secs(10), || {
        c.nodes[0].stat("checksum_failures") > 0
    });
}

#[test]
fn scrub_finds_and_drops_rotten_chunks() {
    let f = Fixture::new("scrub");
    let files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|k| (format!("s{k}"), pattern((3 << 20) + k, 90 + k as u64)))
        .collect();
    for (p, d) in &files {
        f.write(p, d);
    }
    let m = f.mount(&["--no-passthrough"]);
    read_all(&m, &files);
    rot(&data_file(&f.ssd, "s2"), (1 << 20) + 7);
    let out = dyadfs()
        .args(["scrub"])
        .arg(&m.mnt)
        .arg("--json")
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_str(&succeeded("dyadfs scrub", out)).unwrap();
    assert_eq!(report["files"], 4);
    assert_eq!(report["chunks"], 8);
    assert_eq!(report["dropped"], 1);
    // The dropped chunk is refetched: the file reads right, from the shared FS once more
    // (the kernel's page cache is dropped, so the reads reach the daemon).
    fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    let before = m.stat("bytes_from_backing");
    read_all(&m, &files);
    assert_eq!(m.stat("bytes_from_backing") - before, 2 << 20);
}

#[test]
fn names_survive_their_home_and_then_its_backup_dying() {
    let mut c = Cluster::new("namesdead2", 4);
    c.extra = vec!["--failure-detection".into(), "1s".into()];
    c.start(4);
    let (home, backup, producer, consumer) = name_home_backup_and_others(&c);
    let data = pattern(64 * KIB, 7);
    fs::write(c.nodes[producer].path("kept"), &data).unwrap();
    names_kept(&c, &[], 2);
    signal(&c.nodes[home], libc::SIGKILL);
    wait_members_down(&c.nodes[backup], 1);
    // The backup, home now, copies the names on to the next backup.
    names_kept(&c, &[home], 2);
    signal(&c.nodes[backup], libc::SIGKILL);
    wait_members_down(&c.nodes[consumer], 2);
    let got = fs::read(c.nodes[consumer].path("kept")).expect("the name outlived two homes");
    assert!(got == data);
}

/// A consumer waits (`--wait 40s`) for a name whose home is then killed: once the home is
/// declared down its node registers the wait again with the directory's next home, which
/// tells it when the producer publishes there, long before the consumer's deadline (without
/// that the word went to the dead home, and the consumer learned of the file only at its
/// deadline's last look; with a refresh every 10 s alone, 8.6 s after the produce).
#[test]
fn a_consumer_waiting_while_the_name_home_dies_gets_its_file_from_the_next_home() {
    let mut c = Cluster::new("waithome", 4);
    c.extra = vec![
        "--failure-detection".into(),
        "1s".into(),
        "--wait".into(),
        "40s".into(),
    ];
    c.start(4);
    let (home, _, producer, consumer) = name_home_backup_and_others(&c);
    let data = pattern(64 * KIB, 9);
    let waiting = c.nodes[consumer].path("later");
    let reader = std::thread::spawn(move || {
        let got = fs::read(&waiting);
        (got, Instant::now())
    });
    wait_until("the consumer waiting", Duration::from_secs(10), || {
        c.nodes[consumer].stat("name_waits") >= 1
    });
    signal(&c.nodes[home], libc::SIGKILL);
    wait_members_down(&c.nodes[producer], 1);
    wait_members_down(&c.nodes[consumer], 1);
    fs::write(c.nodes[producer].path("later"), &data).unwrap();
    let produced = Instant::now();
    let (got, at) = reader.join().unwrap();
    let after = at.duration_since(produced);
    println!("the consumer got the file {after:?} after it was produced");
    assert!(got.expect("the waiting read") == data);
    assert!(
        after < Duration::from_secs(20),
        "told at the deadline, not by the next home: {after:?}"
    );
}

/// Both holders of a file (in two racks) freeze and the cluster does not know yet (slow failure
/// detection): a read waits one --peer-timeout (2 s) in all, locating and trying each frozen
/// holder in turn, before the shared file system serves it; not one timeout per frozen holder.
#[test]
fn frozen_holders_not_known_down_cost_a_read_one_peer_timeout() {
    let mut c = Cluster::new("frozen2", 5);
    c.extra = vec!["--failure-detection".into(), "30s".into()];
    let files = dataset(&c, 6, 256 * KIB);
    c.start(5);
    // Node 0 (rack r0) and node 2 (rack r1) hold every file; node 4 (rack r2) reads them.
    read_all(&c.nodes[0], &files);
    read_all(&c.nodes[2], &files);
    wait_until(
        "both racks' copies are published",
        Duration::from_secs(10),
        || c.total("home_rack_files") >= 2 * files.len() as u64,
    );
    signal(&c.nodes[0], libc::SIGSTOP);
    signal(&c.nodes[2], libc::SIGSTOP);
    let took = read_each_timed(&c.nodes[4], &files);
    signal(&c.nodes[0], libc::SIGCONT);
    signal(&c.nodes[2], libc::SIGCONT);
    eprintln!("reads with both holders frozen: {took:?}");
    // Before one bound per read, a file whose holders were both tried took 2 x 2 s.
    for t in &took {
        assert!(*t < Duration::from_secs(3), "{took:?}");
    }
    assert_eq!(c.nodes[4].stat("backing_fetches"), files.len() as u64);
}

/// The only holder freezes and the cluster does not know yet: once a read has timed out on it
/// (it is suspect), later reads give it a quarter of the --peer-timeout (2 s), not a whole one
/// each: a large file read by direct I/O is such a series of requests (the soak's reads of 24
/// MiB took two timeouts, 4.2 s).
#[test]
fn a_suspect_only_holder_costs_later_reads_a_quarter_of_the_peer_timeout() {
    // Node 0 (rack r0) holds every file; node 2 (alone in rack r1) reads them.
    let (c, files) = node0_holding("suspect", 3, "30s", 8, 256 * KIB);
    signal(&c.nodes[0], libc::SIGSTOP);
    let took = read_each_timed(&c.nodes[2], &files);
    signal(&c.nodes[0], libc::SIGCONT);
    eprintln!("reads with the only holder frozen: {took:?}");
    assert_eq!(
        c.nodes[2].stat("members_down"),
        0,
        "declared down: not the case tested"
    );
    // The first read makes node 0 suspect; every later one tries it for 0.5 s at most (a
    // whole timeout each before: 2.01-2.02 s a read).
    for t in &took[2..] {
        assert!(*t < Duration::from_millis(1250), "{took:?}");
    }
    assert_eq!(c.nodes[2].stat("backing_fetches"), files.len() as u64);
}

/// A byte that rots in a cached file while mounted is found by the background scrub
/// (`--scrub-interval`) and its chunk dropped; the next open reads it again from the shared
/// file system, byte-exact. (Passthrough reads never reach the daemon: this is how it learns.)
#[test]
fn the_background_scrub_drops_a_chunk_that_rotted_while_mounted() {
    let f = Fixture::new("bgscrub");
    let data = pattern(3 << 20, 11);
    f.write("x", &data);
    let m = f.mount(&["--scrub-interval", "500ms"]);
    assert!(fs::read(m.path("x")).unwrap() == data);
    let fetched = m.stat("bytes_from_backing");
    rot(&data_file(&f.ssd, "x"), (2 << 20) + 5);
    let scrubs = m.stat("background_scrubs");
    wait_until("a scrub after the rot", Duration::from_secs(20), || {
        m.stat("background_scrubs") >= scrubs + 2
    });
    assert_eq!(m.stat("checksum_failures"), 1, "the rotten chunk was found");
    // Its pages may still be in memory from the first read: drop them, then read again.
    let file = fs::File::open(m.path("x")).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: advice on a descriptor this test opened.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    drop(file);
    assert!(fs::read(m.path("x")).unwrap() == data);
    assert!(
        m.stat("bytes_from_backing") > fetched,
        "the chunk was read again"
    );
    m.unmount();
}

/// A cached file changed on the NVMe by another process while mounted is not served as it is:
/// its next open sees the data file's ctime moved, checks it again, drops the bad chunk and
/// reads it anew (passthrough would hand the kernel the changed file).
#[test]
fn a_cache_file_changed_while_mounted_is_checked_again_at_the_next_open() {
    let f = Fixture::new("tamper");
    let data = pattern(3 << 20, 12);
    f.write("x", &data);
    let m = f.mount(&[]);
    assert!(fs::read(m.path("x")).unwrap() == data);
    let fetched = m.stat("bytes_from_backing");
    let file = data_file(&f.ssd, "x");
    rot(&file, (2 << 20) + 5);
    // The kernel's copy of the old pages goes too (else it would not read the disk at all).
    let data_fd = fs::File::open(&file).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: advice on a descriptor this test opened.
    unsafe { libc::posix_fadvise(data_fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert!(fs::read(m.path("x")).unwrap() == data, "served as changed");
    assert_eq!(m.stat("checksum_failures"), 1);
    assert!(
        m.stat("bytes_from_backing") > fetched,
        "the bad chunk was read again"
    );
    m.unmount();
}

/// A member of the peers file that never starts (a straggler, a failed launch) is declared
/// down one failure-detection time after the others start, as one that died, and its
/// directories move to their backups: a producer's copy into any directory, the ones it was
/// home of included, returns at once and reads on the other node. (Before: it stayed suspect
/// forever, and the closes into its directories took 24 s and failed with EIO.)
#[test]
fn a_member_that_never_started_costs_producers_nothing() {
    let mut c = Cluster::new("neverstarted", 3);
    c.managed = true;
    c.start(2);
    wait_members_down(&c.nodes[0], 1);
    wait_members_down(&c.nodes[1], 1);
    let src = c.root.join("src.bin");
    let data = pattern(200 * KIB, 8);
    fs::write(&src, &data).unwrap();
    for d in 0..8 {
        let dir = c.nodes[0].path(&format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        let t = Instant::now();
        let out = std::process::Command::new("cp")
            .arg(&src)
            .arg(dir.join("f"))
            .output()
            .unwrap();
        let took = t.elapsed();
        println!("cp into d{d}: {took:?}");
        assert!(out.status.success(), "d{d}: {out:?}");
        assert!(took < Duration::from_secs(2), "d{d}: {took:?}");
    }
    for d in 0..8 {
        let got = fs::read(c.nodes[1].path(&format!("d{d}/f"))).unwrap();
        assert!(got == data, "d{d}");
    }
}

/// Every daemon of a job SIGKILLed at once and restarted (a requeued job step): every name
/// whose close returned is found again on every node (each home restores its directories'
/// names and its backup copies from its journal), bytes exact. (Before: all names were lost.)
#[test]
fn a_restart_of_every_node_loses_no_name() {
    let mut c = Cluster::new("restartall", 3);
    c.managed = true;
    c.start(3);
    let body = |name: &str| -> Vec<u8> { pattern(5000 + name.len() * 131, name.len() as u64) };
    let mut names = Vec::new();
    for d in 0..6 {
        for i in 0..5 {
            let producer = (d + i) % 3;
            let name = format!("d{d}/f{i}");
            fs::create_dir_all(c.nodes[producer].path(&format!("d{d}"))).unwrap();
            fs::write(c.nodes[producer].path(&name), body(&name)).unwrap();
            names.push(name);
        }
    }
    for m in &c.nodes {
        signal(m, libc::SIGKILL);
    }
    c.nodes.clear();
    c.start(3);
    for (i, m) in c.nodes.iter().enumerate() {
        for name in &names {
            let got = fs::read(m.path(name)).unwrap_or_else(|e| panic!("node {i}, {name}: {e}"));
            assert!(got == body(name), "node {i}, {name}");
        }
    }
}

/// The names under `d0`..`d2` as node `m` lists them.
fn produced(m: &Mounted) -> Vec<String> {
    let mut names = Vec::new();
    for d in 0..3 {
        if let Ok(list) = fs::read_dir(m.path(&format!("d{d}"))) {
            names
                .extend(list.map(|e| format!("d{d}/{}", e.unwrap().file_name().to_string_lossy())));
        }
    }
    names
}

/// Every daemon of a 3-node job SIGKILLed at once at a random moment while a producer writes
/// on each, twice, and restarted: every file whose close returned reads back exact on every
/// node, no file is partial, and once the restarted nodes have swept, every kept object is
/// named (the kept produced files are as many as the names).
#[test]
fn every_node_killed_at_random_moments_loses_no_closed_file() {
    let mut c = Cluster::new("killall", 3);
    c.managed = true;
    c.start(3);
    let mut closed: Vec<String> = Vec::new();
    let mut seed = std::process::id() as u64;
    for round in 0..2 {
        let writers: Vec<_> = (0..3)
            .map(|i| {
                let log = c.root.join(format!("closed-{round}-{i}"));
                let w = start_writer(&c.nodes[i].mnt, &format!("d{i}/r{round}-"), &log);
                (w, log)
            })
            .collect();
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // A random moment of the writers' work to kill every node at: the thing tested.
        std::thread::sleep(Duration::from_millis(500 + (seed >> 33) % 1000));
        for m in &c.nodes {
            signal(m, libc::SIGKILL);
        }
        for (mut w, log) in writers {
            let _ = w.wait();
            closed.extend(fs::read_to_string(log).unwrap().lines().map(String::from));
        }
        c.nodes.clear();
        c.start(3);
        for (i, m) in c.nodes.iter().enumerate() {
            for name in &closed {
                let got =
                    fs::read(m.path(name)).unwrap_or_else(|e| panic!("node {i}, {name}: {e}"));
                assert!(got == written(name), "node {i}, {name}");
            }
            for name in produced(m) {
                assert!(
                    fs::read(m.path(&name)).unwrap() == written(&name),
                    "{name} is partial"
                );
            }
        }
        let names = produced(&c.nodes[0]).len() as u64;
        println!("round {round}: {} closed, {names} named", closed.len());
        wait_until("every kept object named", Duration::from_secs(60), || {
            c.total("kept_files") == names
        });
    }
}

/// Objects whose names are gone from every node (here every node's journal) are found by
/// their holders once every member has answered, deleted and counted.
#[test]
fn objects_no_name_reaches_are_swept_in_a_cluster() {
    let mut c = Cluster::new("sweep", 3);
    c.managed = true;
    c.start(3);
    for i in 0..3 {
        fs::create_dir_all(c.nodes[i].path(&format!("d{i}"))).unwrap();
        for k in 0..5 {
            let name = format!("d{i}/f{k}");
            fs::write(c.nodes[i].path(&name), written(&name)).unwrap();
        }
    }
    assert_eq!(c.total("kept_files"), 15);
    let nodes = std::mem::take(&mut c.nodes);
    for m in nodes {
        m.unmount();
    }
    for i in 0..3 {
        fs::write(c.root.join(format!("s{i}/names.log")), b"DYADFSN\0").unwrap();
    }
    c.start(3);
    wait_until("the unnamed objects swept", Duration::from_secs(60), || {
        c.total("unnamed_reclaimed") == 15
    });
    assert_eq!(c.total("kept_files"), 0);
}
