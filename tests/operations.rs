//! Operating a mount: `dyadfs warm` (a directory, a list, a node's share of a cluster) and
//! `dyadfs status`, through real mounts and real daemons.

mod common;

use std::fs;
use std::process::Command;

use common::{Cluster, Fixture, dyadfs, pattern, succeeded};

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
    m.unmount();
}

/// `warm --cluster` on each of 4 nodes stages disjoint shares: the dataset lands once in the
/// cluster (the shared file system read once per file), and afterwards every node reads all of
/// it from its cache or its peers.
#[test]
fn warm_cluster_spreads_the_dataset_once() {
    let mut c = Cluster::new("warmcl", 4, 0);
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
