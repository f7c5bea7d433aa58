//! `pip install dyadfs` as a plain user: the wheel `scripts/build-wheel.sh` built (the test
//! command builds it first) is installed offline into a fresh venv of the system's Python by an
//! unprivileged user, whose environment has nothing of the project (PATH without `.tools`,
//! LD_LIBRARY_PATH empty), and used as a user on a cluster would: `dyadfs --version`, a managed
//! directory and a dataset mounted, written and read, an unmodified DataLoader whose sampler is
//! `dyadfs.torch.PrefetchSampler`, `dyadfs.stats`, `fusermount3 -u`. Then the same binary's UCX
//! data plane: refused in one line while the venv has no UCX, and moving a file between two
//! daemons once the libucx wheel's files are in the venv (copied from `.tools/ucx`, which is
//! that wheel unpacked).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// The wheel in target/wheels (the newest, if several).
fn built_wheel() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/wheels");
    let mut wheels: Vec<PathBuf> = fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    wheels.retain(|p| p.extension().is_some_and(|e| e == "whl"));
    wheels.sort_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok());
    wheels
        .pop()
        .unwrap_or_else(|| panic!("no wheel in {}: run scripts/build-wheel.sh", dir.display()))
}

/// The libucp.so.0 the system's loader would find (its cache, `ldconfig -p`), if any.
fn system_ucx() -> Option<String> {
    let out = Command::new("ldconfig").arg("-p").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("libucp.so.0 "))
        .and_then(|l| l.split("=>").nth(1))
        .map(|p| p.trim().to_string())
}

/// The project venv's site-packages (torch and numpy for the DataLoader; not dyadfs).
fn project_site_packages() -> PathBuf {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    fs::read_dir(&lib)
        .unwrap()
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.join("torch").exists())
        .expect("torch in the project's .venv (scripts/install-deps.sh)")
}

struct User {
    uid: u32,
    gid: u32,
    venv: PathBuf,
}

impl User {
    /// A command as the user, with an environment that has only the venv and the system.
    fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = as_user(self.uid, self.gid);
        c.env_clear()
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.venv.join("bin").display()),
            )
            .env("LD_LIBRARY_PATH", "")
            .env("HOME", self.venv.parent().unwrap())
            .env("UCX_TLS", "tcp")
            .env("UCX_NET_DEVICES", "lo")
            .arg(program);
        c
    }

    fn run(&self, what: &str, program: &str, args: &[&std::ffi::OsStr]) -> String {
        succeeded(what, self.cmd(program).args(args).output().unwrap())
    }

    fn python(&self, what: &str, script: &str, args: &[&Path]) -> String {
        let mut c = self.cmd("python3");
        c.arg("-c").arg(script).args(args);
        succeeded(what, c.output().unwrap())
    }
}

fn os(p: &Path) -> &std::ffi::OsStr {
    p.as_os_str()
}

/// The unmodified DataLoader of a training script, its sampler wrapped by the wheel's helper.
const TRAIN: &str = r#"
import os, sys, warnings, torch
warnings.filterwarnings("error", module="dyadfs")  # the mount must take the sampler's order
from torch.utils.data import DataLoader, Dataset, SequentialSampler
from dyadfs.torch import PrefetchSampler
from dyadfs.stats import stats
mnt = sys.argv[1]
paths = sorted(os.path.join(mnt, n) for n in os.listdir(mnt))
class Files(Dataset):
    def __len__(self): return len(paths)
    def __getitem__(self, i):
        with open(paths[i], "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
sampler = PrefetchSampler(SequentialSampler(range(len(paths))), paths=paths)
n = sum(int(b.numel()) for b in DataLoader(Files(), batch_size=4, sampler=sampler, num_workers=2))
s = stats(mnt)
print(n, s["cached_files"])
"#;

#[test]
fn a_plain_user_installs_the_wheel_and_mounts_reads_and_trains_with_it() {
    let (uid, gid) = match plain_user() {
        Ok(ids) => ids,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    // The user's machine has UCX only where the wheel puts it: a UCX the system's loader finds
    // (Debian's libucx0, which OpenMPI's packages bring) would be loaded instead, and the
    // checks below of a venv without UCX could not hold.
    if let Some(system) = system_ucx() {
        panic!(
            "the system's loader finds {system}: this test needs a machine without a system UCX \
             (remove the package that installed it, e.g. `apt-get purge libucx0`)"
        );
    }
    let wheel = built_wheel();
    let w = std::env::temp_dir().join(format!("dyadfs-wheel-{}", std::process::id()));
    let _ = fs::remove_dir_all(&w);
    fs::create_dir_all(&w).unwrap();
    let data = w.join("data");
    fs::create_dir_all(&data).unwrap();
    for i in 0..12 {
        fs::write(data.join(format!("s{i:02}.bin")), pattern(100_000, i)).unwrap();
    }
    let local_wheel = w.join(wheel.file_name().unwrap());
    fs::copy(&wheel, &local_wheel).unwrap();
    for d in ["m1", "s1", "m2", "s2"] {
        fs::create_dir_all(w.join(d)).unwrap();
    }
    let chown = Command::new("chown")
        .args(["-R", &format!("{uid}:{gid}")])
        .arg(&w)
        .status()
        .unwrap();
    assert!(chown.success());
    let user = User {
        uid,
        gid,
        venv: w.join("venv"),
    };
    let _fuse = FuseForUsers::open();
    let result = std::panic::catch_unwind(|| as_the_user(&user, &w, &local_wheel, &data));
    for m in ["m1", "m2", "u0", "u1"].map(|m| w.join(m)) {
        if is_mounted(&m) {
            let _ = Command::new("fusermount3").arg("-uz").arg(&m).status();
        }
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    let _ = fs::remove_dir_all(&w);
}

fn as_the_user(user: &User, w: &Path, wheel: &Path, data: &Path) {
    // A fresh venv of the system's Python, the wheel from its file (no index, no network).
    succeeded(
        "python3 -m venv",
        as_user(user.uid, user.gid)
            .args(["/usr/bin/python3", "-m", "venv"])
            .arg(&user.venv)
            .output()
            .unwrap(),
    );
    user.run(
        "pip install the wheel",
        "pip",
        &[
            "install".as_ref(),
            "--no-index".as_ref(),
            "--disable-pip-version-check".as_ref(),
            os(wheel),
        ],
    );
    let bin = user.venv.join("bin/dyadfs");
    assert!(bin.exists(), "the wheel installed no bin/dyadfs");
    let version = user.run("dyadfs --version", "dyadfs", &["--version".as_ref()]);
    assert!(version.starts_with("dyadfs "), "{version}");
    assert!(version.contains("UCX: not loaded"), "{version}");
    // torch and numpy from the project's venv, as a cluster's module would bring them.
    let site = user
        .python(
            "site",
            "import sysconfig; print(sysconfig.get_path('purelib'))",
            &[],
        )
        .trim()
        .to_string();
    fs::write(
        Path::new(&site).join("project-torch.pth"),
        format!("{}\n", project_site_packages().display()),
    )
    .unwrap();

    // A managed directory: written and read back through the mount.
    let (m1, s1) = (w.join("m1"), w.join("s1"));
    user.run(
        "mount a managed directory",
        "dyadfs",
        &["mount".as_ref(), os(&m1), "--ssd".as_ref(), os(&s1)],
    );
    user.python(
        "write and read",
        "import sys; p = sys.argv[1] + '/out.bin'; open(p, 'wb').write(b'x' * 70000); \
         assert open(p, 'rb').read() == b'x' * 70000",
        &[&m1],
    );
    // A dataset: read by a DataLoader through the wheel's helpers.
    let (m2, s2) = (w.join("m2"), w.join("s2"));
    user.run(
        "mount a dataset",
        "dyadfs",
        &[
            "mount".as_ref(),
            os(&m2),
            "--ssd".as_ref(),
            os(&s2),
            "--backing".as_ref(),
            os(data),
        ],
    );
    let out = user.python("a DataLoader with dyadfs.torch", TRAIN, &[&m2]);
    assert_eq!(out.trim(), "1200000 12", "{out}");
    let stats = user.run(
        "dyadfs stats",
        "dyadfs",
        &["stats".as_ref(), os(&m2), "--json".as_ref()],
    );
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let pid = stats["pid"].as_u64().unwrap() as u32;
    // The UCX data plane with no UCX in the venv: one line, nothing mounted.
    let peers = w.join("peers");
    let ports = free_ports(2);
    fs::write(
        &peers,
        format!("0 127.0.0.1:{} r0\n1 127.0.0.1:{} r0\n", ports[0], ports[1]),
    )
    .unwrap();
    let secret = w.join("secret");
    user.run("keygen", "dyadfs", &["keygen".as_ref(), os(&secret)]);
    let node = |i: usize, extra: &[&str]| -> Output {
        let (mnt, ssd) = (w.join(format!("u{i}")), w.join(format!("t{i}")));
        fs::create_dir_all(&mnt).unwrap();
        std::os::unix::fs::chown(&mnt, Some(user.uid), Some(user.gid)).unwrap();
        let mut c = user.cmd("dyadfs");
        c.arg("mount").arg(&mnt).arg("--ssd").arg(&ssd);
        c.args(["--node-id", &i.to_string(), "--peers"]).arg(&peers);
        c.arg("--secret-file")
            .arg(&secret)
            .args(["--peer-timeout", "2s"])
            .args(extra);
        c.output().unwrap()
    };
    let ucx = ["--data-plane", "ucx", "--ucx-over-tcp"];
    let out = node(0, &ucx);
    refused_in_one_line(&out, &w.join("u0"), &["--data-plane ucx", "UCX_DIR"]);
    for m in [&m1, &m2] {
        user.run("fusermount3 -u", "fusermount3", &["-u".as_ref(), os(m)]);
    }
    wait_gone(pid);

    // The libucx wheel's files in the venv (its layout: site-packages/libucx/lib/libucp.so.0).
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/ucx");
    for d in ["libucx", "libucx_cu12.libs"] {
        let cp = Command::new("cp")
            .arg("-a")
            .arg(tools.join(d))
            .arg(&site)
            .status()
            .unwrap();
        assert!(cp.success(), "copy {d}");
    }
    let version = user.run("dyadfs --version", "dyadfs", &["--version".as_ref()]);
    assert!(
        version.contains("site-packages/libucx/lib/libucp.so.0"),
        "{version}"
    );
    for i in 0..2 {
        let out = node(i, &ucx);
        succeeded(&format!("UCX mount {i}"), out);
    }
    let (u0, u1) = (w.join("u0"), w.join("u1"));
    user.python(
        "produce on node 0",
        "import sys; open(sys.argv[1] + '/big.bin', 'wb').write(bytes(range(256)) * 12288)",
        &[&u0],
    );
    // Read as the user (the mount's owner: FUSE lets no one else in, root included).
    user.python(
        "read on node 1",
        "import sys; assert open(sys.argv[1] + '/big.bin', 'rb').read() == bytes(range(256)) * 12288",
        &[&u1],
    );
    let stats = user.run(
        "dyadfs stats",
        "dyadfs",
        &["stats".as_ref(), os(&u1), "--json".as_ref()],
    );
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert!(
        stats["bytes_from_peers"].as_u64().unwrap() >= 3 << 20,
        "{stats}"
    );
    let log = fs::read_to_string(w.join("t1/dyadfs.log")).unwrap_or_default();
    assert!(
        log.contains("UCX loaded") && log.contains("site-packages/libucx"),
        "{log}"
    );
    for m in [&u0, &u1] {
        user.run("fusermount3 -u", "fusermount3", &["-u".as_ref(), os(m)]);
    }
}
