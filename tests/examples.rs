//! The examples/ programs, run unchanged against real mounts on two daemons: the consumer is
//! started first on node 1 and waits (`--wait`) for what the producer writes on node 0.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const FILES: u32 = 10;
const SIZE: usize = MIB + 4321;

fn cluster(name: &str, slot: u16) -> Cluster {
    let mut c = Cluster::new(name, 2, slot);
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

/// Starts `consumer` on node 1, lets it block on the first name, then runs `producer` on
/// node 0; both must succeed.
fn hand_off(c: &Cluster, mut producer: Command, mut consumer: Command) -> String {
    let waiting = consumer.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
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
    let c = cluster("ex-c", 0);
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
    let c = cluster("ex-py", 1);
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
    let c = cluster("ex-ckpt", 2);
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
