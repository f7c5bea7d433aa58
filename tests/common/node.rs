//! The node service's harness: a real `dyadfs node serve` process, real users (made with
//! useradd) and their mounts, and a dataset with public, group-only and root-only files.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::{as_user, pattern, system_user, wait_until};
use serde_json::Value;

/// /dev/fuse is opened to users for each test and put back after: one test at a time.
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A group no user has as its own: users are given it with `setpriv --groups`.
pub const GROUP: u32 = 4242;

pub struct Service {
    pub child: Child,
    pub socket: PathBuf,
    pub ssd: PathBuf,
    pub log: PathBuf,
}

impl Service {
    pub fn start(root: &Path) -> Service {
        Self::start_with(root, &[])
    }

    pub fn start_with(root: &Path, extra: &[&str]) -> Service {
        Self::start_named(root, "node", extra)
    }

    /// A service whose cache, socket and log are named `name` under `root` (several "nodes").
    pub fn start_named(root: &Path, name: &str, extra: &[&str]) -> Service {
        let (ssd, socket, log) = (
            root.join(format!("{name}-ssd")),
            root.join(format!("run/{name}.sock")),
            root.join(format!("{name}.log")),
        );
        let child = Command::new(env!("CARGO_BIN_EXE_dyadfs"))
            .args(["node", "serve", "--threads", "2", "--ssd"])
            .arg(&ssd)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            // A site's UCX data plane, where a test asks for one: over loopback tcp.
            .env("UCX_TLS", "tcp")
            .env("UCX_NET_DEVICES", "lo")
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let s = Service {
            child,
            socket,
            ssd,
            log,
        };
        wait_until("the node service answers", Duration::from_secs(20), || {
            s.try_status().is_some()
        });
        s
    }

    pub fn try_status(&self) -> Option<Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_dyadfs"))
            .args(["node", "status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    }

    /// `dyadfs mount MNT --backing BACKING` attaching to this service, run by `cmd` (the binary,
    /// or a user's `setpriv` and the binary). The `--ssd` it names is not used.
    pub fn attach(&self, mut cmd: Command, mnt: &Path, backing: &Path, extra: &[&str]) -> Output {
        cmd.arg("mount")
            .arg(mnt)
            .args(["--ssd", "/nonexistent", "--backing"])
            .arg(backing)
            .arg("--node-socket")
            .arg(&self.socket)
            .args(extra)
            .output()
            .unwrap()
    }

    /// The one dataset's counter `key`.
    pub fn dataset(&self, key: &str) -> u64 {
        let s = self.try_status().expect("the service answers");
        let datasets = s["datasets"].as_array().unwrap();
        assert_eq!(datasets.len(), 1, "one dataset: {s}");
        datasets[0][key].as_u64().unwrap()
    }

    pub fn stop(mut self) {
        // SAFETY: kill only sends a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the service stops cleanly: {status}");
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            eprintln!(
                "node log:\n{}",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// A user and the mount point it owns.
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub mnt: PathBuf,
}

impl User {
    pub fn new(name: &str, root: &Path, groups: &[u32]) -> Option<User> {
        let (uid, gid) = match system_user(name) {
            Ok(ids) => ids,
            Err(why) => {
                eprintln!("skipped: {why}");
                return None;
            }
        };
        let mnt = root.join(format!("mnt-{name}"));
        fs::create_dir_all(&mnt).unwrap();
        std::os::unix::fs::chown(&mnt, Some(uid), Some(gid)).unwrap();
        Some(User {
            uid,
            gid,
            groups: groups.to_vec(),
            mnt,
        })
    }

    pub fn cmd(&self) -> Command {
        if self.groups.is_empty() {
            return as_user(self.uid, self.gid);
        }
        let mut c = Command::new("setpriv");
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        c.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg(format!("--groups={}", groups.join(",")));
        c
    }

    /// `dyadfs mount` as this user, attaching to the service.
    pub fn mount(&self, service: &Service, backing: &Path, extra: &[&str]) -> Output {
        let mut cmd = self.cmd();
        cmd.arg(env!("CARGO_BIN_EXE_dyadfs"));
        service.attach(cmd, &self.mnt, backing, extra)
    }

    /// Reads `rel` under its mount as this user: the bytes, or the errno's name `cat` prints.
    pub fn read(&self, rel: &str) -> Result<Vec<u8>, String> {
        let out = self
            .cmd()
            .arg("cat")
            .arg(self.mnt.join(rel))
            .output()
            .unwrap();
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    pub fn unmount(&self) {
        if super::is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.mnt)
                .status();
        }
    }
}

impl Drop for User {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// A dataset: `pub/` any user may read, `grp/` only the group [`GROUP`], `priv/` only root.
pub fn dataset(root: &Path) -> (PathBuf, Vec<(String, Vec<u8>)>) {
    use std::os::unix::fs::PermissionsExt;
    let backing = root.join("dataset");
    let mut files = Vec::new();
    for (dir, mode) in [("pub", 0o755), ("grp", 0o755), ("priv", 0o700)] {
        fs::create_dir_all(backing.join(dir)).unwrap();
        fs::set_permissions(backing.join(dir), fs::Permissions::from_mode(mode)).unwrap();
        for i in 0..4 {
            let rel = format!("{dir}/{i}.bin");
            let data = pattern(96 << 10, i as u64 + dir.len() as u64 * 10);
            fs::write(backing.join(&rel), &data).unwrap();
            if dir == "grp" {
                std::os::unix::fs::chown(backing.join(&rel), None, Some(GROUP)).unwrap();
                fs::set_permissions(backing.join(&rel), fs::Permissions::from_mode(0o640)).unwrap();
            }
            files.push((rel, data));
        }
    }
    (backing, files)
}

pub fn scratch(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("dyadfs-node-{name}-{}", std::process::id()));
    if root.exists() {
        fs::remove_dir_all(&root).unwrap();
    }
    fs::create_dir_all(&root).unwrap();
    root
}

pub fn attached(what: &str, out: Output) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
