//! Workload 1 in small: an unmodified PyTorch DataLoader (num_workers = 4, DistributedSampler
//! with set_epoch) over npz files, one rank per node on two real daemons. Every sample is
//! checked byte for byte, and the second epoch, on other shards, reads nothing from the
//! shared file system: what one node read in epoch 1 the other pulls from it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::*;
use serde_json::Value;

const FILES: u32 = 256;
const SIZE: u32 = 64 << 10;

fn workload() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/workload")
}

/// Runs one epoch on every node at once (rank i reads through node i's mount); returns each
/// rank's report.
fn epoch(c: &Cluster, epoch: u32) -> Vec<Value> {
    let ranks: Vec<_> = c
        .nodes
        .iter()
        .enumerate()
        .map(|(rank, node)| {
            venv_python()
                .arg(workload().join("train.py"))
                .arg("--data")
                .arg(node.path("ds"))
                .args(["--rank", &rank.to_string(), "--world"])
                .arg(c.nodes.len().to_string())
                .args(["--first-epoch", &epoch.to_string(), "--verify"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    ranks
        .into_iter()
        .map(|r| {
            let stdout = succeeded("train.py", r.wait_with_output().unwrap());
            serde_json::from_str(stdout.lines().last().unwrap_or_default())
                .unwrap_or_else(|e| panic!("bad report {stdout:?}: {e}"))
        })
        .collect()
}

#[test]
fn a_torch_dataloader_reads_byte_exact_and_epoch_two_skips_the_shared_fs() {
    let mut c = Cluster::new("workload", 2);
    let out = venv_python()
        .arg(workload().join("dataset.py"))
        .arg(c.backing.join("ds"))
        .args([FILES.to_string(), SIZE.to_string()])
        .output()
        .unwrap();
    succeeded("dataset.py", out);
    c.start(2);
    let dataset: u64 = std::fs::read_dir(c.backing.join("ds"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let mut backing = Vec::new();
    let mut peers = Vec::new();
    for e in 0..2 {
        let reports = epoch(&c, e);
        let samples: u64 = reports.iter().map(|r| r["samples"].as_u64().unwrap()).sum();
        assert_eq!(samples, FILES as u64, "epoch {e}: {reports:?}");
        for r in &reports {
            assert_eq!(r["bad"], 0, "epoch {e}: wrong bytes: {r}");
        }
        backing.push(c.total("bytes_from_backing"));
        peers.push(c.total("bytes_from_peers"));
    }
    assert_eq!(backing[0], dataset, "epoch 1 reads the dataset once");
    assert_eq!(
        backing[1], backing[0],
        "epoch 2 reads nothing from the shared FS"
    );
    // Each rank's second shard is about half the other rank's first.
    assert!(
        peers[1] - peers[0] > dataset / 4,
        "epoch 2 pulled only {} bytes from peers",
        peers[1] - peers[0]
    );
}
