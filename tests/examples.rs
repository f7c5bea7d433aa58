//! The examples/ programs, run unchanged against real mounts on two daemons: the consumer is
//! started first on node 1 and waits (`--wait`) for what the producer writes on node 0.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const FILES: u32 = 10;
const SIZE: usize = MIB + 4321;

fn cluster(name: &str) -> Cluster {
    let mut c = Cluster::new(name, 2);
    c.extra = vec!["--wait".into(), "60s".into()];
    c.start(2);
    c
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// The venv's Python, in the Python examples' directory.
fn python() -> Command {
    let mut c = venv_python();
    c.current_dir(examples().join("python"));
    c
}

/// Starts `consumer` on node 1, waits until it blocks on the first name (each example's
/// consumer opens the names it reads, and its node counts the open's wait), then runs
/// `producer` on node 0; both must succeed.
fn hand_off(c: &Cluster, mut producer: Command, mut consumer: Command) -> String {
    let before = c.nodes[1].stat("name_waits");
    let waiting = consumer.spawn().unwrap();
    wait_until(
        "the consumer waits for its first file",
        Duration::from_secs(60),
        || c.nodes[1].stat("name_waits") > before,
    );
    succeeded("producer", producer.output().unwrap());
    succeeded("consumer", waiting.wait_with_output().unwrap())
        + &format!("(node 1 waited {} times)", c.nodes[1].stat("name_waits"))
}

fn piped(mut c: Command) -> Command {
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

fn frames_args(dir: &Path) -> [String; 3] {
    [
        dir.display().to_string(),
        FILES.to_string(),
        SIZE.to_string(),
    ]
}

#[test]
fn the_c_producer_and_consumer_pair() {
    let c = cluster("ex-c");
    let bin = c.root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for prog in ["producer", "consumer"] {
        let out = Command::new("gcc")
            .args(["-O2", "-Wall", "-Werror", "-o"])
            .arg(bin.join(prog))
            .arg(examples().join(format!("c/{prog}.c")))
            .output()
            .unwrap();
        succeeded(&format!("gcc {prog}.c"), out);
    }
    let (out_dir, in_dir) = (c.nodes[0].path("c"), c.nodes[1].path("c"));
    std::fs::create_dir(&out_dir).unwrap();
    let mut producer = Command::new(bin.join("producer"));
    producer.args(frames_args(&out_dir));
    let mut consumer = piped(Command::new(bin.join("consumer")));
    consumer.args(frames_args(&in_dir));
    let said = hand_off(&c, producer, consumer);
    assert!(said.contains("validation OK"), "{said}");
    // The consumer started first, so it waited at least for the first frame.
    assert!(c.nodes[1].stat("name_waits") >= 1, "{said}");
    assert_eq!(c.nodes[0].stat("files_produced"), FILES as u64);
    assert_eq!(
        c.nodes[1].stat("bytes_from_peers"),
        FILES as u64 * SIZE as u64
    );
    assert_eq!(c.total("bytes_from_backing"), 0);
}

#[test]
fn the_python_producer_and_consumer_pair() {
    let c = cluster("ex-py");
    let (out_dir, in_dir) = (c.nodes[0].path("py"), c.nodes[1].path("py"));
    std::fs::create_dir(&out_dir).unwrap();
    let mut producer = python();
    producer.arg("producer.py").args(frames_args(&out_dir));
    let mut consumer = piped(python());
    consumer.arg("consumer.py").args(frames_args(&in_dir));
    let said = hand_off(&c, producer, consumer);
    assert!(said.contains("validation OK"), "{said}");
    assert_eq!(
        c.nodes[1].stat("bytes_from_peers"),
        FILES as u64 * SIZE as u64
    );
}

#[test]
fn a_checkpoint_saved_on_one_node_loads_on_another() {
    let c = cluster("ex-ckpt");
    let (out_dir, in_dir) = (c.nodes[0].path("ckpt"), c.nodes[1].path("ckpt"));
    std::fs::create_dir(&out_dir).unwrap();
    let mut save = python();
    save.arg("checkpoint.py").arg("save").arg(&out_dir);
    let mut load = piped(python());
    load.arg("checkpoint.py").arg("load").arg(&in_dir);
    let said = hand_off(&c, save, load);
    // The venv has torch: the hand-off must go through torch.save / torch.load.
    assert!(said.contains("validation OK (torch)"), "{said}");
    assert!(c.nodes[1].stat("bytes_from_peers") > 0);
}

/// DYAD's first use, as the card writes it: four nodes mount a managed directory (no
/// `--backing`), producers on nodes 0 and 1 write samples at a given rate (node 1's by
/// `shutil.copy`), and an unmodified
/// torch DataLoader on nodes 2 and 3 (started first) trains on them for three epochs. Every
/// produced sample is consumed byte-exact in every epoch, none is opened before its producer
/// closed it, and nothing is read from a shared file system.
#[test]
fn in_situ_training_on_a_managed_directory() {
    const PRODUCERS: u32 = 2;
    const SAMPLES: u32 = 60;
    const EPOCHS: u32 = 3;
    let mut c = Cluster::new("ex-insitu", 4);
    c.managed = true;
    c.extra = vec!["--wait".into(), "60s".into()];
    c.start(4);
    for n in &c.nodes {
        let s = n.stats();
        assert_eq!(s["kind"], "managed", "{s}");
        assert_eq!(s["data_plane"], "stream", "{s}");
        assert_eq!(
            std::fs::read_dir(n.path("")).unwrap().count(),
            0,
            "empty at first"
        );
    }
    std::fs::create_dir(c.nodes[0].path("run")).unwrap();
    for n in &c.nodes[1..] {
        wait_until("run/ on every node", Duration::from_secs(10), || {
            n.path("run").is_dir()
        });
    }
    let logs = c.root.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let trainers: Vec<_> = (0..2u32)
        .map(|rank| {
            let mut t = piped(python());
            t.arg("in_situ_training.py")
                .arg("train")
                .arg(c.nodes[2 + rank as usize].path("run"))
                .args(["--producers", &PRODUCERS.to_string()])
                .args(["--samples", &SAMPLES.to_string()])
                .args(["--rank", &rank.to_string(), "--world", "2"])
                .args(["--epochs", &EPOCHS.to_string(), "--workers", "2"])
                .arg("--log")
                .arg(logs.join(format!("train-{rank}.jsonl")));
            t.spawn().unwrap()
        })
        .collect();
    // The trainers first, as in hand_off: each node's first wait for a sample.
    wait_until(
        "both trainers wait for a sample",
        Duration::from_secs(60),
        || c.nodes[2].stat("name_waits") > 0 && c.nodes[3].stat("name_waits") > 0,
    );
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let mut pr = piped(python());
            pr.arg("in_situ_training.py")
                .arg("produce")
                .arg(c.nodes[p as usize].path("run"))
                .args(["--producer", &p.to_string()])
                .args(["--samples", &SAMPLES.to_string(), "--rate", "40"])
                .arg("--log")
                .arg(logs.join(format!("produce-{p}.jsonl")));
            // The second copies its samples in with shutil.copy, which looks at the
            // destination first: it must not wait on the name it is about to create.
            if p == 1 {
                pr.arg("--copy");
            }
            pr.spawn().unwrap()
        })
        .collect();
    for p in producers {
        succeeded("producer", p.wait_with_output().unwrap());
    }
    let mut said = String::new();
    for t in trainers {
        said += &succeeded("trainer", t.wait_with_output().unwrap());
    }
    let lines = |f: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(logs.join(f))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let mut produced = std::collections::HashMap::new();
    for p in 0..PRODUCERS {
        for r in lines(&format!("produce-{p}.jsonl")) {
            produced.insert(r["name"].as_str().unwrap().to_string(), r);
        }
    }
    assert_eq!(produced.len(), (PRODUCERS * SAMPLES) as usize);
    let mut read: std::collections::HashMap<(String, u64), u32> = Default::default();
    for rank in 0..2 {
        for r in lines(&format!("train-{rank}.jsonl")) {
            let n = r["name"].as_str().unwrap().to_string();
            let made = &produced[&n];
            assert_eq!(r["sha256"], made["sha256"], "{n} read wrong");
            assert!(
                r["opened"].as_f64().unwrap() >= made["closing"].as_f64().unwrap(),
                "{n} opened before its producer closed it"
            );
            *read.entry((n, r["epoch"].as_u64().unwrap())).or_default() += 1;
        }
    }
    for n in produced.keys() {
        for e in 0..EPOCHS as u64 {
            assert_eq!(read.get(&(n.clone(), e)), Some(&1), "{n} in epoch {e}");
        }
    }
    assert!(said.contains("epoch 3"), "{said}");
    assert_eq!(c.total("bytes_from_backing"), 0, "no shared file system");
    assert_eq!(c.total("backing_fetches"), 0);
    assert!(c.nodes[2].stat("bytes_from_peers") > 0 && c.nodes[3].stat("bytes_from_peers") > 0);
    assert_eq!(c.total("files_produced"), (PRODUCERS * SAMPLES) as u64);
}
