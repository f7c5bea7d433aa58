//! Issue 29's attacker, for tests that a daemon's memory is out of reach of anyone without the
//! job secret: an unauthenticated UCX client (`tests/attack/ucx_attack.c`) that connects to a
//! UCX worker's TCP listener and reads or writes any address through UCX's software-emulated RMA,
//! and the /proc lookups that aim it (listening ports, the heap, where a secret sits in memory,
//! child processes).
#![allow(dead_code)]

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::succeeded;

/// The client's default wait for each step (connect, each get, each put), in milliseconds.
pub const OP_TIMEOUT_MS: u32 = 3000;

/// The pkg-config directory of the UCX that ucx-sys links, looked for as its build script does:
/// `UCX_DIR`, then `$DYADFS_TOOLS/ucx/libucx` (default: the project's `.tools`); None: the
/// system's pkg-config path.
fn ucx_pkgconfig_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("UCX_DIR") {
        return Some(PathBuf::from(dir).join("lib/pkgconfig"));
    }
    let tools = std::env::var_os("DYADFS_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools"));
    let pc = tools.join("ucx/libucx/lib/pkgconfig");
    pc.join("ucx.pc").exists().then_some(pc)
}

/// `pkg-config ARGS ucx`, trimmed; panics with its output if it fails.
fn pkg_config_ucx(args: &[&str]) -> String {
    let mut c = Command::new("pkg-config");
    if let Some(pc) = ucx_pkgconfig_dir() {
        let path = match std::env::var("PKG_CONFIG_PATH") {
            Ok(old) if !old.is_empty() => format!("{}:{old}", pc.display()),
            _ => pc.display().to_string(),
        };
        c.env("PKG_CONFIG_PATH", path);
    }
    c.args(args).arg("ucx");
    let out = c.output().expect("pkg-config runs");
    succeeded(&format!("pkg-config {} ucx", args.join(" ")), out)
        .trim()
        .to_string()
}

/// Compiles `tests/attack/ucx_attack.c` against the project's UCX (once per test process) into
/// the cargo target's tmp directory and returns the binary.
pub fn build_attack_client() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/attack/ucx_attack.c");
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
            fs::create_dir_all(dir).unwrap();
            let bin = dir.join("ucx_attack");
            // Test binaries run at once may each build it: each compiles to its own name and
            // renames into place, so none ever runs a half-written file.
            let tmp = dir.join(format!("ucx_attack.{}.tmp", std::process::id()));
            let flags = pkg_config_ucx(&["--cflags", "--libs"]);
            let libdir = pkg_config_ucx(&["--variable=libdir"]);
            let mut gcc = Command::new("gcc");
            gcc.args(["-O1", "-Wall", "-o"])
                .arg(&tmp)
                .arg(src)
                .args(flags.split_whitespace());
            if !libdir.is_empty() {
                // .tools/ucx is on no loader path (as for the binaries: build.rs).
                gcc.arg(format!("-Wl,-rpath,{libdir}"));
            }
            succeeded("gcc ucx_attack.c", gcc.output().expect("gcc runs"));
            fs::rename(&tmp, &bin).unwrap();
            bin
        })
        .clone()
}

/// Inodes of the sockets among `pid`'s descriptors.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    dir.filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter_map(|link| {
            link.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Every TCP port (IPv4 and IPv6) in LISTEN state on a socket `pid` holds, sorted: its socket
/// inodes (/proc/PID/fd) matched against /proc/PID/net/tcp{,6}. Empty if the process is gone.
pub fn tcp_listen_ports(pid: u32) -> Vec<u16> {
    let inodes = socket_inodes(pid);
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let (Ok(inode), Some(port)) = (f[9].parse::<u64>(), f[1].rsplit(':').next()) else {
                continue;
            };
            if !inodes.contains(&inode) {
                continue;
            }
            if let Ok(port) = u16::from_str_radix(port, 16) {
                ports.push(port);
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// `pid` and all its descendants (see [`child_pids`]).
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        for kid in child_pids(all[i]) {
            if !all.contains(&kid) {
                all.push(kid);
            }
        }
        i += 1;
    }
    all
}

/// The listening TCP ports of `pid` and of all its descendants.
pub fn tree_listen_ports(pid: u32) -> Vec<u16> {
    let mut ports: Vec<u16> = process_tree(pid)
        .into_iter()
        .flat_map(tcp_listen_ports)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The direct children of `pid`: /proc/PID/task/*/children, or, on kernels without it
/// (CONFIG_PROC_CHILDREN, absent on some), every process whose parent is `pid`. Sorted.
pub fn child_pids(pid: u32) -> Vec<u32> {
    let mut kids = Vec::new();
    let mut listed = false;
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(s) = fs::read_to_string(task.path().join("children")) {
                listed = true;
                kids.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    if !listed {
        for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if parent_pid(p) == Some(pid) {
                kids.push(p);
            }
        }
    }
    kids.sort_unstable();
    kids.dedup();
    kids
}

/// The parent of `pid` from /proc/PID/stat (its fields follow the last ')': the name may hold
/// spaces and parentheses).
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// One line of /proc/PID/maps.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    /// Empty for anonymous memory; `[heap]`, `[stack]`, a file...
    pub path: String,
}

pub fn maps(pid: u32) -> Vec<Mapping> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (start, end) = f.next()?.split_once('-')?;
            let perms = f.next()?.to_string();
            // offset, device, inode; the path is the rest.
            f.nth(2)?;
            Some(Mapping {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                perms,
                path: f.collect::<Vec<_>>().join(" "),
            })
        })
        .collect()
}

/// The `[heap]` mapping of `pid`, as (start, end).
pub fn heap_range(pid: u32) -> Option<(u64, u64)> {
    maps(pid)
        .into_iter()
        .find(|m| m.path == "[heap]")
        .map(|m| (m.start, m.end))
}

/// Where `needle` first occurs in `pid`'s memory (read through /proc/PID/mem, which needs root
/// or ptrace rights): the heap first, then the other readable private mappings that are
/// anonymous, a stack, or writable (a binary's data); never a library's code or the vdso.
pub fn find_in_memory(pid: u32, needle: &[u8]) -> Option<u64> {
    find_all_in_memory(pid, needle, 1).into_iter().next()
}

/// As [`find_in_memory`], every occurrence up to `max`.
pub fn find_all_in_memory(pid: u32, needle: &[u8], max: usize) -> Vec<u64> {
    assert!(!needle.is_empty(), "an empty needle is everywhere");
    let mut hits = Vec::new();
    let Ok(mem) = fs::File::open(format!("/proc/{pid}/mem")) else {
        return hits;
    };
    let mut regions: Vec<Mapping> = maps(pid)
        .into_iter()
        .filter(|m| {
            let p = m.perms.as_bytes();
            let special = m.path.starts_with('[')
                && m.path != "[heap]"
                && !m.path.starts_with("[stack")
                && !m.path.starts_with("[anon");
            p.first() == Some(&b'r')
                && p.get(3) == Some(&b'p')
                && !special
                && (m.path.is_empty() || m.path.starts_with('[') || p.get(1) == Some(&b'w'))
        })
        .collect();
    regions.sort_by_key(|m| m.path != "[heap]");
    // Windows of CHUNK bytes plus the needle's length less one, CHUNK apart: a match is found in
    // exactly one window (the one where it starts).
    const CHUNK: u64 = 1 << 20;
    let overlap = needle.len() as u64 - 1;
    let mut buf = vec![0u8; (CHUNK + overlap) as usize];
    for m in regions {
        let mut at = m.start;
        while at < m.end {
            let want = (m.end - at).min(CHUNK + overlap) as usize;
            if let Ok(n) = mem.read_at(&mut buf[..want], at) {
                let data = &buf[..n];
                let mut from = 0;
                while let Some(i) = position(&data[from..], needle) {
                    if from + i >= CHUNK as usize {
                        break;
                    }
                    hits.push(at + (from + i) as u64);
                    if hits.len() >= max {
                        return hits;
                    }
                    from += i + 1;
                }
            }
            at += CHUNK;
        }
    }
    hits
}

fn position(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let first = needle[0];
    let mut from = 0;
    while let Some(i) = hay[from..].iter().position(|&b| b == first) {
        let at = from + i;
        if hay.len() - at < needle.len() {
            return None;
        }
        if &hay[at..at + needle.len()] == needle {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Reads `len` bytes of `pid`'s memory at `addr` through /proc/PID/mem (the ground truth to
/// compare the attack's gets with).
pub fn read_memory(pid: u32, addr: u64, len: usize) -> Option<Vec<u8>> {
    let mem = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; len];
    mem.read_exact_at(&mut buf, addr).ok()?;
    Some(buf)
}

/// One remote operation of the attack.
#[derive(Debug, Clone)]
pub enum Op {
    /// Read `len` bytes at the address.
    Get(u64, usize),
    /// Write the bytes at the address (and wait for the target's acknowledgement).
    Put(u64, Vec<u8>),
}

/// What the client reported.
#[derive(Debug, Default, Clone)]
pub struct AttackReport {
    /// The UCX endpoint reached the target's worker (wireup completed).
    pub connected: bool,
    /// Each get in order: the bytes read, or None (failed, not connected, no answer in time).
    pub gets: Vec<Option<Vec<u8>>>,
    /// Each put in order: whether the target acknowledged it.
    pub puts: Vec<bool>,
    /// The client's stdout (one line per step), then its stderr after a `[stderr]` line, and
    /// a note if it had to be killed: for assertion messages.
    pub raw: String,
}

impl AttackReport {
    /// Nothing got through: not connected, no get returned bytes, no put acknowledged.
    pub fn refused(&self) -> bool {
        !self.connected && self.gets.iter().all(Option::is_none) && !self.puts.contains(&true)
    }
}

/// Attacks the UCX listener at 127.0.0.1:`port` over one connection: every get, in order, then
/// every put (use [`attack_ops`] to interleave them), each bounded by [`OP_TIMEOUT_MS`].
pub fn attack(
    client: &Path,
    port: u16,
    gets: &[(u64, usize)],
    puts: &[(u64, Vec<u8>)],
) -> AttackReport {
    let ops: Vec<Op> = gets
        .iter()
        .map(|&(addr, len)| Op::Get(addr, len))
        .chain(puts.iter().map(|(addr, data)| Op::Put(*addr, data.clone())))
        .collect();
    attack_ops(client, port, &ops, OP_TIMEOUT_MS)
}

/// Runs the client against 127.0.0.1:`port` with `ops` in order, each step bounded by
/// `timeout_ms`; the client is killed if it outlives all of them (it never should).
pub fn attack_ops(client: &Path, port: u16, ops: &[Op], timeout_ms: u32) -> AttackReport {
    let mut c = Command::new(client);
    c.env("UCX_TLS", "tcp")
        .env("UCX_NET_DEVICES", "lo")
        .arg("--port")
        .arg(port.to_string())
        .arg("--timeout-ms")
        .arg(timeout_ms.to_string());
    for op in ops {
        match op {
            Op::Get(addr, len) => c
                .arg("--get")
                .arg(format!("{addr:#x}"))
                .arg(len.to_string()),
            Op::Put(addr, data) => c.arg("--put").arg(format!("{addr:#x}")).arg(hex(data)),
        };
    }
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", client.display()));
    // Read both pipes while it runs: a large get's hex would fill a pipe and block it.
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let limit =
        Duration::from_millis(timeout_ms as u64 * (ops.len() as u64 + 3)) + Duration::from_secs(15);
    let started = Instant::now();
    let mut killed = false;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            killed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10)); // polls the attacker's exit, bounded above
    }
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let mut report = parse_report(&stdout, ops);
    report.raw = stdout;
    if !stderr.is_empty() {
        report.raw += "[stderr]\n";
        report.raw += &stderr;
    }
    if killed {
        report.raw += &format!("[killed after {limit:?}]\n");
    }
    report
}

fn drain<R: Read + Send + 'static>(mut r: R) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = r.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Parses the client's lines (`connect P ok|fail ...`, `get ADDR LEN ok HEX|fail ...`,
/// `put ADDR ok|fail ...`); steps without a line (the client died) count as failed.
fn parse_report(stdout: &str, ops: &[Op]) -> AttackReport {
    let mut report = AttackReport::default();
    for line in stdout.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "connect" => report.connected = f.get(2) == Some(&"ok"),
            "get" if f.get(3) == Some(&"ok") => report.gets.push(unhex(f.get(4).unwrap_or(&""))),
            "get" => report.gets.push(None),
            "put" => report.puts.push(f.get(2) == Some(&"ok")),
            _ => {}
        }
    }
    let gets = ops.iter().filter(|o| matches!(o, Op::Get(..))).count();
    let puts = ops.len() - gets;
    report.gets.resize(gets, None);
    report.puts.resize(puts, false);
    report
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}
