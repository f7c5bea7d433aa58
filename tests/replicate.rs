//! Replication (`--replicate`, `auto` by default on a dataset): several real daemons on
//! 127.0.0.1 copy what another node fetched, in batches, from that node (never from the shared
//! directory), stop at their capacity watermark, survive a holder that dies in the middle of a
//! batch, and never serve a copy of a version the shared directory no longer has.

mod common;

use std::fs;
use std::time::Duration;

use common::*;

const MIB: usize = 1 << 20;

/// `n` samples of about `size` bytes under `d/` of the shared directory.
fn samples(c: &Cluster, n: usize, size: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    fs::create_dir_all(c.backing.join("d")).unwrap();
    (0..n)
        .map(|k| {
            let (p, d) = (
                format!("d/s{k:04}.npz"),
                pattern(size + k * 131, seed + k as u64),
            );
            fs::write(c.backing.join(&p), &d).unwrap();
            (p, d)
        })
        .collect()
}

fn total(files: &[(String, Vec<u8>)]) -> u64 {
    files.iter().map(|(_, d)| d.len() as u64).sum()
}

#[test]
fn by_default_nodes_copy_what_another_fetched_in_batches_and_then_read_it_locally() {
    let mut c = Cluster::new("replicate", 4);
    // The daemon's default, `--replicate auto`: on for a dataset on several nodes.
    c.replicate = None;
    // Small samples and one file of several chunks.
    let mut files = samples(&c, 24, 64 << 10, 0);
    let big = pattern(5 * MIB + 17, 99);
    fs::write(c.backing.join("d/big.npz"), &big).unwrap();
    files.push(("d/big.npz".into(), big));
    let (n, bytes) = (files.len() as u64, total(&files));
    c.start(4);
    for (p, d) in &files {
        read_check(&c.nodes[0], p, d);
    }
    // The other three copy everything in the background, without a single read (they pause
    // while the machine is busy: other tests).
    for m in &c.nodes[1..] {
        wait_until("every file replicated", Duration::from_secs(120), || {
            m.stat("replicated_files") >= n
        });
        assert_eq!(m.stat("replicated_files"), n);
        assert_eq!(m.stat("bytes_replicated"), bytes);
        assert_eq!(
            m.stat("batched_pulls"),
            n - 1,
            "the small files come in batches, the large one chunk by chunk"
        );
        assert_eq!(
            m.stat("bytes_from_backing"),
            0,
            "replication never reads the backing store"
        );
    }
    assert_eq!(c.nodes[0].stat("replicated_files"), 0);
    let pulled = c.total("bytes_from_peers");
    assert_eq!(pulled, 3 * bytes, "each node moved the dataset once");
    // Reading on the others: byte-exact, all local, nothing fetched or pulled again.
    for m in &c.nodes[1..] {
        for (p, d) in &files {
            read_check(m, p, d);
        }
        assert_eq!(m.stat("local_hits"), n, "{}", m.mnt.display());
    }
    assert_eq!(c.total("bytes_from_backing"), bytes);
    assert_eq!(c.total("bytes_from_peers"), pulled);
}

#[test]
fn off_copies_nothing() {
    let mut c = Cluster::new("replicate-off", 2);
    c.replicate = Some("off");
    let files = samples(&c, 16, 32 << 10, 7);
    c.start(2);
    for (p, d) in &files {
        read_check(&c.nodes[0], p, d);
    }
    c.wait_published(16);
    // What a copy would take to start, several times over.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.nodes[1].stat("replicated_files"), 0);
    assert_eq!(c.nodes[1].stat("bytes_from_peers"), 0);
}

#[test]
fn auto_copies_up_to_half_the_capacity_and_evicts_nothing() {
    let mut c = Cluster::new("replicate-cap", 2);
    c.replicate = Some("auto");
    // 8 MiB caches, a 6 MiB dataset: node 1 may copy 4 MiB of it.
    c.extra = vec!["--capacity".into(), "8M".into()];
    let files = samples(&c, 96, 64 << 10, 3);
    let bytes = total(&files);
    c.start(2);
    for (p, d) in &files {
        read_check(&c.nodes[0], p, d);
    }
    let m = &c.nodes[1];
    let half = 4 * MIB as u64;
    wait_until(
        "copies up to the watermark",
        Duration::from_secs(120),
        || m.stat("bytes_replicated") + 80 * 1024 > half,
    );
    // Nothing more comes while no room is made.
    std::thread::sleep(Duration::from_secs(2));
    let (copied, cached) = (m.stat("bytes_replicated"), m.stat("cached_bytes"));
    assert!(
        copied <= half && cached <= half && copied < bytes,
        "copied {copied}, cached {cached}, watermark {half}"
    );
    assert_eq!(m.stat("evictions"), 0);
    assert_eq!(m.stat("bytes_from_backing"), 0);
    // The node's own reads still have the other half: every file reads back exact.
    for (p, d) in &files {
        read_check(m, p, d);
    }
    assert_eq!(m.stat("bytes_from_backing"), 0);
}

#[test]
fn a_holder_that_dies_in_the_middle_of_the_copies_costs_nothing_but_time() {
    let mut c = Cluster::new("replicate-kill", 3);
    c.replicate = Some("on");
    let files = samples(&c, 400, 48 << 10, 11);
    c.start(3);
    for (p, d) in &files {
        read_check(&c.nodes[2], p, d);
    }
    let m = &c.nodes[1];
    wait_until("copies under way", Duration::from_secs(60), || {
        m.stat("replicated_files") > 0
    });
    // SAFETY: kill(2) on the pid of a daemon this test started.
    unsafe { libc::kill(c.nodes[2].pid as i32, libc::SIGKILL) };
    wait_gone(c.nodes[2].pid);
    let copied = m.stat("replicated_files");
    assert!(copied < files.len() as u64, "all copied before the kill");
    // Node 1 serves every file exactly: its copies, node 0's, or the shared directory's.
    for (p, d) in &files {
        read_check(m, p, d);
    }
    assert!(is_mounted(&m.mnt));
    assert_eq!(m.stat("checksum_failures"), 0);
    let _ = std::process::Command::new("fusermount3")
        .arg("-uz")
        .arg(&c.nodes[2].mnt)
        .output();
}

#[test]
fn a_copy_of_a_version_the_shared_directory_no_longer_has_is_never_served() {
    let mut c = Cluster::new("replicate-changed", 2);
    c.replicate = Some("on");
    let files = samples(&c, 8, 64 << 10, 21);
    c.start(2);
    for (p, d) in &files {
        read_check(&c.nodes[0], p, d);
    }
    // Changed on the shared file system after node 0 cached it, before node 1 reads it.
    let (p, _) = &files[3];
    let new = pattern(70_000, 777);
    fs::write(c.backing.join(p), &new).unwrap();
    let m = &c.nodes[1];
    wait_until("the old copies arrive", Duration::from_secs(60), || {
        m.stat("replicated_files") >= files.len() as u64
    });
    read_check(m, p, &new);
    assert_eq!(m.stat("bytes_from_backing"), new.len() as u64);
    for (q, d) in files.iter().filter(|(q, _)| q != p) {
        read_check(m, q, d);
    }
}
