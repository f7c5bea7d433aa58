//! Harness for integration tests: real mounts of the real binary over temp directories.
#![allow(dead_code)]

pub mod attack;
pub mod member;
pub mod node;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn dyadfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dyadfs"))
}

/// The two ways a mount serves cache hits; every data test runs in both.
pub const MODES: [&[&str]; 2] = [&[], &["--no-passthrough"]];

pub struct Fixture {
    pub root: PathBuf,
    pub backing: PathBuf,
    pub ssd: PathBuf,
    pub mnt: PathBuf,
}

impl Fixture {
    pub fn new(name: &str) -> Fixture {
        let root = std::env::temp_dir().join(format!("dyadfs-it-{name}-{}", std::process::id()));
        if root.exists() {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(root.join("mnt"))
                .status();
            fs::remove_dir_all(&root).unwrap();
        }
        let f = Fixture {
            backing: root.join("backing"),
            ssd: root.join("ssd"),
            mnt: root.join("mnt"),
            root,
        };
        for d in [&f.backing, &f.ssd, &f.mnt] {
            fs::create_dir_all(d).unwrap();
        }
        f
    }

    /// Mounts (the real CLI, daemonized) with extra arguments; panics with the error on failure.
    pub fn mount(&self, extra: &[&str]) -> Mounted {
        self.mounted(self.try_mount(extra))
    }

    /// Mounts with the daemon's descriptor limit (soft and hard) set to `nofile`.
    pub fn mount_limited(&self, extra: &[&str], nofile: u32) -> Mounted {
        let mut c = Command::new("prlimit");
        c.arg(format!("--nofile={nofile}:{nofile}"))
            .arg(env!("CARGO_BIN_EXE_dyadfs"));
        self.mounted(self.mount_args(c, extra).output().unwrap())
    }

    /// A managed directory (`dyadfs mount MNT --ssd SSD`, no `--backing`) with its cache at
    /// `ssd`; panics with the error on failure.
    pub fn mount_managed(&self, ssd: &Path) -> Mounted {
        self.mount_managed_with(ssd, &[])
    }

    /// [`Fixture::mount_managed`] with `extra` arguments.
    pub fn mount_managed_with(&self, ssd: &Path, extra: &[&str]) -> Mounted {
        let out = dyadfs()
            .arg("mount")
            .arg(&self.mnt)
            .arg("--ssd")
            .arg(ssd)
            .args(extra)
            .output()
            .unwrap();
        self.mounted(out)
    }

    pub fn try_mount(&self, extra: &[&str]) -> Output {
        self.mount_args(dyadfs(), extra).output().unwrap()
    }

    /// `c` with `mount MNT --ssd SSD --backing BACKING` and `extra` appended.
    fn mount_args(&self, mut c: Command, extra: &[&str]) -> Command {
        c.arg("mount")
            .arg(&self.mnt)
            .arg("--ssd")
            .arg(&self.ssd)
            .arg("--backing")
            .arg(&self.backing)
            .args(extra);
        c
    }

    /// The mount a successful `mount` made; panics with the error otherwise.
    fn mounted(&self, out: Output) -> Mounted {
        mounted_at(&self.mnt, out)
    }

    pub fn write(&self, rel: &str, data: &[u8]) {
        let p = self.backing.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

pub struct Mounted {
    pub mnt: PathBuf,
    pub pid: u32,
}

impl Mounted {
    pub fn stats(&self) -> Value {
        let out = dyadfs()
            .arg("stats")
            .arg(&self.mnt)
            .arg("--json")
            .output()
            .unwrap();
        serde_json::from_str(&succeeded("dyadfs stats", out)).unwrap()
    }

    pub fn stat(&self, key: &str) -> u64 {
        self.stats()[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no key {key}"))
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Unmounts (as a user would) and waits for the daemon to exit.
    /// A mount still busy (a process that used it is still exiting) is retried for 5 s.
    pub fn unmount(self) {
        wait_until("fusermount3 -u, while busy", Duration::from_secs(5), || {
            let out = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() || err.contains("busy"),
                "fusermount3 -u failed: {err}"
            );
            out.status.success()
        });
        wait_gone(self.pid);
        std::mem::forget(self);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .status();
        wait_gone(self.pid);
    }
}

/// A producer for killing daemons under: writes `MNT/PREFIX0`, `MNT/PREFIX1`, ... (making
/// PREFIX's directory) until a write or a close fails, and logs each name whose close returned,
/// a line each, to LOG. What it writes under a name is [`written`]. Start it with
/// [`start_writer`].
const KILLED_WRITER: &str = r#"
import os, sys
mnt, prefix, log = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(os.path.dirname(f"{mnt}/{prefix}"), exist_ok=True)
with open(log, "w") as out:
    for i in range(100000):
        name = f"{prefix}{i}"
        n = 500 + len(name) * 997 % 40000
        data = (name.encode() * (n // len(name) + 1))[:n]
        try:
            with open(f"{mnt}/{name}", "wb") as f:
                f.write(data)
        except OSError:
            break
        out.write(name + "\n")
        out.flush()
"#;

/// Starts the killed daemons' producer (see [`KILLED_WRITER`]) on `mnt`.
pub fn start_writer(mnt: &Path, prefix: &str, log: &Path) -> std::process::Child {
    venv_python()
        .arg("-c")
        .arg(KILLED_WRITER)
        .arg(mnt)
        .arg(prefix)
        .arg(log)
        .spawn()
        .unwrap()
}

/// The bytes the killed daemons' producer writes under `name` (a path under the mount).
pub fn written(name: &str) -> Vec<u8> {
    let n = 500 + name.len() * 997 % 40000;
    name.as_bytes().iter().cycle().take(n).copied().collect()
}

/// The refusal a `mount` (its output `out`) answered: it failed, said one line holding each
/// of `says`, and left `mnt` unmounted. Returns the line.
pub fn refused_in_one_line(out: &Output, mnt: &Path, says: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "mounted: {err}");
    for s in says {
        assert!(err.contains(s), "no {s:?} in: {err}");
    }
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!is_mounted(mnt), "{} is mounted", mnt.display());
    err
}

/// The mount at `mnt` a successful `mount` (its output `out`) made, with its daemon's pid;
/// panics with the error otherwise.
pub fn mounted_at(mnt: &Path, out: Output) -> Mounted {
    assert!(
        out.status.success(),
        "mount of {} failed: {}",
        mnt.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut mounted = Mounted {
        mnt: mnt.to_path_buf(),
        pid: 0,
    };
    mounted.pid = mounted.stat("pid") as u32;
    mounted
}

/// Waits until process `pid` has exited (20 s at most; then the panic names the threads left,
/// their states and kernel stacks: a thread that outlives a SIGKILL is stuck in the kernel).
pub fn wait_gone(pid: u32) {
    let gone = || {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        // A zombie has exited; only its parent (not us) can reap it. Its main thread shows as
        // one while its other threads still exit, holding its descriptors (the cache dir's lock:
        // a daemon with a million names took long enough for a restart to find it held).
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let threads = fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |t| t.count());
        stat.split(' ').nth(2) == Some("Z") && threads <= 1
    };
    wait_until_else("the daemon exits", Duration::from_secs(20), gone, || {
        format!("left:\n{}", threads_of(pid))
    });
}

/// Each thread of `pid`: its name, state and kernel stack (root only), for a failure message.
fn threads_of(pid: u32) -> String {
    let tasks = fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    let read = |tid: &str, what: &str| {
        fs::read_to_string(format!("/proc/{pid}/task/{tid}/{what}")).unwrap_or_default()
    };
    tasks
        .flatten()
        .map(|t| {
            let tid = t.file_name().to_string_lossy().into_owned();
            let state = read(&tid, "stat")
                .split(' ')
                .nth(2)
                .unwrap_or("?")
                .to_string();
            format!(
                "{tid} {} {state}\n{}",
                read(&tid, "comm").trim(),
                read(&tid, "stack")
            )
        })
        .collect()
}

pub fn is_mounted(path: &Path) -> bool {
    let canonical = fs::canonicalize(path).unwrap_or(path.to_path_buf());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| Path::new(m) == canonical)
}

/// The events of a `--trace` file (Chrome trace JSON): the daemon leaves the array open, as
/// the format allows; it is closed here to parse it strictly.
pub fn trace_events(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap();
    let text = format!("{}]", text.trim_end().trim_end_matches(','));
    serde_json::from_str(&text).unwrap()
}

/// Reads `rel` through `m` whole and checks it is `want`, byte for byte.
pub fn read_check(m: &Mounted, rel: &str, want: &[u8]) {
    let got = fs::read(m.path(rel)).unwrap_or_else(|e| panic!("{rel} on {}: {e}", m.mnt.display()));
    assert!(got == want, "{rel} differs on {}", m.mnt.display());
}

/// [`read_check`] of each `(path, bytes)`.
pub fn read_all(m: &Mounted, files: &[(String, Vec<u8>)]) {
    for (p, d) in files {
        read_check(m, p, d);
    }
}

/// Deterministic, position-dependent bytes (so misplaced chunks are caught).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub const MIB: usize = 1 << 20;

/// `n` ports on 127.0.0.1 for the daemons (and relays) a test starts, from the one allocator of
/// the test process: each found free (bound and let go) when it is given, and never given twice.
/// They lie below the ephemeral range (32768+), where outgoing connections take their ports;
/// each test process starts at its own place in the range (its pid), so that test binaries run
/// side by side rarely look at the same ports.
pub fn free_ports(n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let start = (std::process::id() % 200) * 60;
    let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    let mut out = Vec::with_capacity(n);
    for _ in 0..SPAN {
        if out.len() == n {
            return out;
        }
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            out.push(port);
        }
    }
    panic!("no {n} free ports between {LOW} and {}", LOW + SPAN);
}

/// The address of the `i`th line of a peers file (`ID HOST:PORT RACK`).
pub fn peer_addr(peers: &Path, i: usize) -> std::net::SocketAddr {
    fs::read_to_string(peers)
        .unwrap()
        .lines()
        .nth(i)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// Waits until `cond` holds, checking every 50 ms; panics naming `what` after `timeout`. The one
/// way tests wait for something asynchronous (a publish, a restart), instead of a fixed sleep.
pub fn wait_until(what: &str, timeout: Duration, cond: impl FnMut() -> bool) -> Duration {
    wait_until_else(what, timeout, cond, String::new)
}

/// [`wait_until`], whose panic also says what `left` finds then (the state it was left in). The
/// tests' one deadline loop.
pub fn wait_until_else(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> bool,
    left: impl FnOnce() -> String,
) -> Duration {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() >= timeout {
            match left() {
                l if l.is_empty() => panic!("{what}: not within {timeout:?}"),
                l => panic!("{what}: not within {timeout:?}; {l}"),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// The names of the threads of process `pid`.
pub fn thread_names(pid: u32) -> Vec<String> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

/// Several daemons on 127.0.0.1, node i in rack `r{i/2}`, UCX over tcp on loopback, one shared
/// backing directory.
pub struct Cluster {
    pub root: PathBuf,
    pub backing: PathBuf,
    pub peers: PathBuf,
    /// The job secret every node mounts with (`dyadfs keygen`).
    pub secret: PathBuf,
    pub nodes: Vec<Mounted>,
    /// Extra `dyadfs mount` arguments for every node.
    pub extra: Vec<String>,
    /// Managed directories (no `--backing`): the card's `dyadfs mount /dyad --ssd /nvme`.
    pub managed: bool,
    /// Every node's `--peer-timeout`.
    pub peer_timeout: &'static str,
    /// Every node's `--replicate`; `None`: the default (`auto`). `off` unless a test asks:
    /// background copies would change what the other tests count.
    pub replicate: Option<&'static str>,
}

pub fn node_cmd() -> Command {
    let mut c = dyadfs();
    c.env("UCX_TLS", "tcp").env("UCX_NET_DEVICES", "lo");
    c
}

impl Cluster {
    /// `n` nodes' peers file (ports from [`free_ports`]), secret and shared directory; none
    /// started.
    pub fn new(name: &str, n: u32) -> Cluster {
        let root = std::env::temp_dir().join(format!("dyadfs-cl-{name}-{}", std::process::id()));
        if root.exists() {
            for i in 0..n {
                let _ = Command::new("fusermount3")
                    .arg("-uz")
                    .arg(root.join(format!("m{i}")))
                    .status();
            }
            fs::remove_dir_all(&root).unwrap();
        }
        let backing = root.join("backing");
        fs::create_dir_all(&backing).unwrap();
        let peers: String = free_ports(n as usize)
            .into_iter()
            .enumerate()
            .map(|(i, port)| format!("{i} 127.0.0.1:{port} r{}\n", i / 2))
            .collect();
        let pf = root.join("peers");
        fs::write(&pf, peers).unwrap();
        let secret = root.join("secret");
        let out = dyadfs().arg("keygen").arg(&secret).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster {
            root,
            backing,
            peers: pf,
            secret,
            nodes: Vec::new(),
            extra: Vec::new(),
            managed: false,
            peer_timeout: "2s",
            replicate: Some("off"),
        }
    }

    pub fn mount_cmd(&self, i: u32) -> Command {
        let (mnt, ssd) = (
            self.root.join(format!("m{i}")),
            self.root.join(format!("s{i}")),
        );
        fs::create_dir_all(&mnt).unwrap();
        let mut c = node_cmd();
        c.arg("mount").arg(&mnt).arg("--ssd").arg(&ssd);
        if !self.managed {
            c.arg("--backing").arg(&self.backing);
        }
        c.args(["--node-id", &i.to_string(), "--peers"])
            .arg(&self.peers)
            .args(["--peer-timeout", self.peer_timeout])
            .arg("--secret-file")
            .arg(&self.secret);
        if let Some(when) = self.replicate {
            c.arg(format!("--replicate={when}"));
        }
        c.args(&self.extra);
        c
    }

    pub fn start(&mut self, n: u32) {
        for i in 0..n {
            self.start_node(i);
        }
    }

    /// Mounts node `i` and puts it at `nodes[i]` (the nodes before it must be there).
    pub fn start_node(&mut self, i: u32) {
        let out = self.mount_cmd(i).output().unwrap();
        let m = mounted_at(&self.root.join(format!("m{i}")), out);
        self.nodes.insert(i as usize, m);
    }

    /// Waits until the homes know `files` files held (every holder's publishes have landed:
    /// a row at a global home and at a rack home each).
    pub fn wait_published(&self, files: u64) {
        wait_until("the publishes land", Duration::from_secs(10), || {
            self.total("home_global_files") >= files && self.total("home_rack_files") >= files
        });
    }

    /// Node `i`'s control address, from the cluster's peers file.
    pub fn addr(&self, i: usize) -> std::net::SocketAddr {
        peer_addr(&self.peers, i)
    }

    pub fn total(&self, key: &str) -> u64 {
        self.nodes.iter().map(|m| m.stat(key)).sum()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// The Python of the project's venv (`scripts/install-deps.sh` makes it, with numpy and torch;
/// `DYADFS_VENV` moves it). Tests that need it fail, not skip, without it.
pub fn venv_python() -> Command {
    let venv = std::env::var_os("DYADFS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    let py = venv.join("bin/python3");
    assert!(
        py.exists(),
        "{} missing: run scripts/install-deps.sh",
        py.display()
    );
    Command::new(py)
}

/// A command that runs as user `uid` and group `gid`, with no supplementary groups (the
/// program and its arguments follow).
pub fn as_user(uid: u32, gid: u32) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups");
    c
}

/// The system user `dyadfs-user` (made if there is none) as (uid, gid), or why there can be
/// none here (not root, or `useradd` failed).
pub fn plain_user() -> Result<(u32, u32), String> {
    system_user("dyadfs-user")
}

/// The system user `user` (made if there is none) as (uid, gid), or why there can be none here.
pub fn system_user(user: &str) -> Result<(u32, u32), String> {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the test needs root to make a user".into());
    }
    let known = |u: &str| {
        Command::new("id")
            .arg(u)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !known(user) {
        let made = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                user,
            ])
            .status();
        if !made.is_ok_and(|s| s.success()) {
            return Err(format!("cannot create the user {user}"));
        }
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").args([flag, user]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    Ok((id("-u"), id("-g")))
}

/// /dev/fuse opened to every user while it lives (FUSE's setuid `fusermount3` mounts for a
/// plain user, who still needs the device), its mode put back when dropped.
pub struct FuseForUsers(u32);

impl FuseForUsers {
    pub fn open() -> FuseForUsers {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata("/dev/fuse").unwrap().permissions().mode();
        if mode & 0o006 != 0o006 {
            fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(mode | 0o666)).unwrap();
        }
        FuseForUsers(mode)
    }
}

impl Drop for FuseForUsers {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.0));
    }
}

/// Panics with `what` and the program's output unless it succeeded; returns its stdout.
pub fn succeeded(what: &str, out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Writes back and drops from the page cache every file under `dir` (a cache's data files), as
/// after a reboot or memory pressure, without touching the rest of the machine's page cache.
pub fn drop_cached_pages(dir: &Path) {
    use std::os::unix::io::AsRawFd;
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            drop_cached_pages(&path);
        } else if let Ok(f) = fs::File::open(&path) {
            f.sync_data().unwrap();
            // SAFETY: advice on a descriptor we hold open, for the call only.
            let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(r, 0, "fadvise {path:?}");
        }
    }
}
