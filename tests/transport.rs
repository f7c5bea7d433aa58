//! The UCX data plane between real processes on loopback: `dyadfs transport serve` holds
//! files, `dyadfs transport pull` pulls them with RMA gets. UCX over tcp on `lo` unless a test
//! says otherwise.

mod common;

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{MIB, free_ports, pattern, wait_until};

fn dyadfs(tcp: bool) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dyadfs"));
    if tcp {
        c.env("UCX_TLS", "tcp").env("UCX_NET_DEVICES", "lo");
    } else {
        c.env_remove("UCX_TLS").env_remove("UCX_NET_DEVICES");
    }
    c
}

struct Holder {
    child: Child,
    addr: String,
}

impl Holder {
    fn start(root: &Path, tcp: bool, extra: &[&str]) -> Holder {
        let addr = format!("127.0.0.1:{}", free_ports(1)[0]);
        let mut child = dyadfs(tcp)
            .args(["transport", "serve", "--root"])
            .arg(root)
            .args(["--listen", &addr, "--timeout", "5s"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.starts_with("serving"),
            "holder did not start: {line:?}"
        );
        Holder { child, addr }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("dyadfs-tt-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("src")).unwrap();
        Dir(d)
    }
    fn src(&self, name: &str) -> PathBuf {
        self.0.join("src").join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

fn pull(tcp: bool, h: &Holder, d: &Dir, name: &str, out: &Path, extra: &[&str]) -> Output {
    dyadfs(tcp)
        .args([
            "transport",
            "pull",
            "--peer",
            &h.addr,
            "--path",
            name,
            "--version-of",
        ])
        .arg(d.src(name))
        .arg("--out")
        .arg(out)
        .args(["--timeout", "5s"])
        .args(extra)
        .output()
        .unwrap()
}

fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "pull failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn sizes_at_chunk_boundaries_are_byte_exact() {
    for tcp in [true, false] {
        let d = Dir::new(&format!("sizes{tcp}"));
        let sizes = [0, 1, 2 * MIB - 1, 2 * MIB, 2 * MIB + 1, 6 * MIB + 5];
        for (i, s) in sizes.iter().enumerate() {
            fs::write(d.src(&format!("f{i}")), pattern(*s, i as u64)).unwrap();
        }
        let h = Holder::start(&d.0.join("src"), tcp, &[]);
        for (i, s) in sizes.iter().enumerate() {
            let out = d.0.join(format!("out{i}"));
            assert_ok(&pull(tcp, &h, &d, &format!("f{i}"), &out, &[]));
            assert!(
                fs::read(&out).unwrap() == pattern(*s, i as u64),
                "size {s} (tcp {tcp})"
            );
        }
    }
}

/// Chunks that come inline in the holder's reply (all of them, or the small tails only, next
/// to chunks got by RMA in the same pull) are byte-exact too, and checked.
#[test]
fn inline_chunks_are_byte_exact_and_checked() {
    let d = Dir::new("eager");
    let sizes = [0, 1, 300_000, 2 * MIB, 2 * MIB + 1, 6 * MIB + 5];
    for (i, s) in sizes.iter().enumerate() {
        fs::write(d.src(&format!("f{i}")), pattern(*s, i as u64)).unwrap();
    }
    let h = Holder::start(&d.0.join("src"), true, &[]);
    for eager in ["2M", "1M", "256K"] {
        for (i, s) in sizes.iter().enumerate() {
            let out = d.0.join(format!("out{i}"));
            let _ = fs::remove_file(&out);
            assert_ok(&pull(
                true,
                &h,
                &d,
                &format!("f{i}"),
                &out,
                &["--eager-max", eager],
            ));
            assert!(
                fs::read(&out).unwrap() == pattern(*s, i as u64),
                "size {s}, eager {eager}"
            );
        }
    }
    drop(h);
    let h = Holder::start(&d.0.join("src"), true, &["--corrupt"]);
    let o = pull(true, &h, &d, "f2", &d.0.join("o"), &["--eager-max", "2M"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("checksum"));
}

/// A puller whose slab has a single slot (all the others taken by other pulls and by what the
/// node serves) still pulls a file of many chunks, at once: reading the next chunk ahead is
/// given up when no slot is free, never waited for while holding one.
#[test]
fn a_puller_with_one_free_slot_still_pulls_many_chunks() {
    let d = Dir::new("oneslot");
    let size = 6 * MIB + 5;
    fs::write(d.src("f"), pattern(size, 9)).unwrap();
    let h = Holder::start(&d.0.join("src"), true, &[]);
    for eager in ["0", "2M"] {
        let out = d.0.join(format!("out{eager}"));
        assert_ok(&pull(
            true,
            &h,
            &d,
            "f",
            &out,
            &["--slots", "1", "--eager-max", eager],
        ));
        assert!(fs::read(&out).unwrap() == pattern(size, 9), "eager {eager}");
    }
}

#[test]
fn sparse_file_beyond_4gib_pulls_at_high_offsets() {
    let d = Dir::new("sparse");
    let f = File::create(d.src("big.h5")).unwrap();
    f.set_len(5 << 30).unwrap();
    let off = (4u64 << 30) + 123_457;
    f.write_all_at(&pattern(3 * MIB, 9), off).unwrap();
    drop(f);
    let h = Holder::start(&d.0.join("src"), true, &[]);
    let out = d.0.join("out");
    let o = pull(
        true,
        &h,
        &d,
        "big.h5",
        &out,
        &[
            "--offset",
            &off.to_string(),
            "--len",
            &(3 * MIB).to_string(),
        ],
    );
    assert_ok(&o);
    let mut buf = vec![0; 3 * MIB];
    File::open(&out)
        .unwrap()
        .read_exact_at(&mut buf, off)
        .unwrap();
    assert!(buf == pattern(3 * MIB, 9));
}

#[test]
fn two_clients_pull_from_one_holder_at_once() {
    let d = Dir::new("two");
    fs::write(d.src("a"), pattern(40 * MIB, 1)).unwrap();
    let h = Holder::start(&d.0.join("src"), true, &["--slots", "4"]);
    let (o1, o2) = std::thread::scope(|s| {
        let a = s.spawn(|| pull(true, &h, &d, "a", &d.0.join("o1"), &[]));
        let b = s.spawn(|| pull(true, &h, &d, "a", &d.0.join("o2"), &[]));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_ok(&o1);
    assert_ok(&o2);
    assert!(fs::read(d.0.join("o1")).unwrap() == pattern(40 * MIB, 1));
    assert!(fs::read(d.0.join("o2")).unwrap() == pattern(40 * MIB, 1));
}

#[test]
fn a_killed_holder_is_an_error_within_the_timeout() {
    let d = Dir::new("kill");
    let f = File::create(d.src("huge")).unwrap();
    f.set_len(8 << 30).unwrap();
    drop(f);
    let mut h = Holder::start(&d.0.join("src"), true, &[]);
    let start = Instant::now();
    let client = dyadfs(true)
        .args([
            "transport",
            "pull",
            "--peer",
            &h.addr,
            "--path",
            "huge",
            "--version-of",
        ])
        .arg(d.src("huge"))
        .arg("--out")
        .arg(d.0.join("out"))
        .args(["--timeout", "3s"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The holder dies mid-transfer: once the first bytes are written out.
    let out = d.0.join("out");
    wait_until("the pull is under way", Duration::from_secs(10), || {
        fs::metadata(&out).is_ok_and(|m| std::os::unix::fs::MetadataExt::blocks(&m) > 0)
    });
    h.child.kill().unwrap();
    let o = client.wait_with_output().unwrap();
    assert!(!o.status.success(), "a pull from a killed holder must fail");
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("peer"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_corrupted_chunk_is_a_checksum_error() {
    let d = Dir::new("corrupt");
    fs::write(d.src("a"), pattern(3 * MIB, 2)).unwrap();
    let h = Holder::start(&d.0.join("src"), true, &["--corrupt"]);
    let o = pull(true, &h, &d, "a", &d.0.join("o"), &[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("checksum"));
}

#[test]
fn garbage_and_oversized_frames_are_refused_and_the_holder_keeps_serving() {
    let d = Dir::new("garbage");
    fs::write(d.src("a"), pattern(MIB, 3)).unwrap();
    let h = Holder::start(&d.0.join("src"), true, &[]);
    let mut s = TcpStream::connect(&h.addr).unwrap();
    s.write_all(&[0xff, 0xff, 0xff, 0xff]).unwrap();
    let mut g = TcpStream::connect(&h.addr).unwrap();
    g.write_all(&[0, 0, 0, 5, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1])
        .unwrap();
    // Both connections are closed by the holder.
    for c in [&mut s, &mut g] {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(std::io::Read::read(c, &mut buf).unwrap_or(0), 0);
    }
    let o = pull(true, &h, &d, "a", &d.0.join("o"), &[]);
    assert_ok(&o);
    assert!(fs::read(d.0.join("o")).unwrap() == pattern(MIB, 3));
    // A stale version is refused with a clear error, not served.
    let newer = d.src("a");
    fs::write(&newer, pattern(MIB, 4)).unwrap();
    let o = dyadfs(true)
        .args([
            "transport",
            "pull",
            "--peer",
            &h.addr,
            "--path",
            "a",
            "--version-of",
        ])
        .arg(d.0.join("o"))
        .arg("--out")
        .arg(d.0.join("o2"))
        .output()
        .unwrap();
    assert!(!o.status.success());
}
