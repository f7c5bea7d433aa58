//! Root runs nothing a user planted through UCX's configuration (issue 68). libucs reads
//! `./ucx.conf`, `$HOME/ucx.conf` and `$UCX_CONFIG_DIR/ucx.conf` when it loads, and `dlopen`s
//! the modules of the `UCX_MODULE_DIR` they name. A user's directory holds such a file and a
//! module whose constructor leaves a mark; every root command that loads UCX is started there,
//! with `HOME` pointing there too, and no mark may appear. A plain UCX program started the same
//! way leaves one: the plant works, so its absence means dyadfs did not read it.
mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::attack::build_attack_client;
use common::*;

/// The module names UCX of the project's build looks for (its frameworks' module lists: ucm
/// `cuda`, uct `cuda` and `cma`), and two of libucs's own.
const MODULES: [&str; 5] = [
    "libucm_cuda.so.0",
    "libuct_cuda.so.0",
    "libuct_cma.so.0",
    "libucs_fuse.so.0",
    "libucs_signal.so.0",
];

/// The planted module: its constructor leaves `ran-<uid>-<pid>` in the marks directory.
const MODULE_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ran-%u-%d", MARKS, (unsigned)getuid(), (int)getpid());
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
}
"#;

/// A user's directory with `ucx.conf` naming its module directory, and the marks left so far.
struct Plant {
    dir: PathBuf,
    marks: PathBuf,
}

impl Plant {
    fn new(root: &Path) -> Plant {
        let dir = root.join("userdir");
        let mods = dir.join("mods");
        let marks = root.join("marks");
        fs::create_dir_all(&mods).unwrap();
        fs::create_dir_all(&marks).unwrap();
        // Anyone may leave a mark: the data-plane processes run as nobody.
        fs::set_permissions(&marks, fs::Permissions::from_mode(0o1777)).unwrap();
        let src = dir.join("planted.c");
        fs::write(&src, MODULE_C).unwrap();
        let so = mods.join(MODULES[0]);
        let out = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O1"])
            .arg(format!("-DMARKS=\"{}\"", marks.display()))
            .arg("-o")
            .arg(&so)
            .arg(&src)
            .output()
            .unwrap();
        succeeded("gcc planted.c", out);
        for name in &MODULES[1..] {
            fs::copy(&so, mods.join(name)).unwrap();
        }
        fs::write(
            dir.join("ucx.conf"),
            format!("UCX_MODULE_DIR={}\n", mods.display()),
        )
        .unwrap();
        // The directory is a user's, as a job directory is.
        let owner = plain_user().unwrap_or((65534, 65534));
        let chown = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", owner.0, owner.1))
            .arg(&dir)
            .status()
            .unwrap();
        assert!(chown.success());
        Plant { dir, marks }
    }

    /// `c` started in the user's directory with `HOME` there too.
    fn aim<'a>(&self, c: &'a mut Command) -> &'a mut Command {
        c.current_dir(&self.dir).env("HOME", &self.dir)
    }

    fn marks(&self) -> Vec<String> {
        let mut m: Vec<String> = fs::read_dir(&self.marks)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        m.sort();
        m
    }

    fn clear(&self) {
        for e in fs::read_dir(&self.marks).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
    }
}

#[test]
fn no_root_command_loads_a_users_ucx_conf_or_module() {
    let f = Fixture::new("ucxconf");
    let plant = Plant::new(&f.root);

    // Armed: a plain UCX program started there loads the module (it runs, whatever it says).
    let client = build_attack_client();
    let _ = plant.aim(&mut Command::new(&client)).output().unwrap();
    assert!(
        !plant.marks().is_empty(),
        "the plant is not armed: a UCX program in {} loaded no module of its ucx.conf",
        plant.dir.display()
    );
    plant.clear();

    // `dyadfs --version` (it loads UCX to say which).
    let out = plant.aim(&mut dyadfs()).arg("--version").output().unwrap();
    let version = succeeded("dyadfs --version", out);
    assert!(version.contains("UCX: 1."), "UCX loaded: {version}");
    assert_eq!(
        plant.marks(),
        Vec::<String>::new(),
        "--version ran the module"
    );

    // `dyadfs install`.
    let out = plant
        .aim(&mut dyadfs())
        .arg("install")
        .arg("--dir")
        .arg(f.root.join("sbin"))
        .arg("--prefix")
        .arg(f.root.join("prefix"))
        .arg("--bin-dir")
        .arg(f.root.join("bin"))
        .output()
        .unwrap();
    succeeded("dyadfs install", out);
    assert_eq!(
        plant.marks(),
        Vec::<String>::new(),
        "install ran the module"
    );

    // A mount with each data plane on one node.
    fs::write(f.backing.join("a"), b"bytes").unwrap();
    for plane in ["stream", "auto", "ucx"] {
        let mut c = dyadfs();
        plant
            .aim(&mut c)
            .arg("mount")
            .arg(&f.mnt)
            .arg("--ssd")
            .arg(&f.ssd)
            .arg("--backing")
            .arg(&f.backing)
            .args(["--data-plane", plane, "--ucx-over-tcp"])
            .env("UCX_TLS", "tcp")
            .env("UCX_NET_DEVICES", "lo");
        let m = mounted_at(&f.mnt, c.output().unwrap());
        assert_eq!(fs::read(m.path("a")).unwrap(), b"bytes");
        m.unmount();
        assert_eq!(
            plant.marks(),
            Vec::<String>::new(),
            "mount --data-plane {plane}"
        );
    }

    // Two nodes pulling by UCX RMA: the daemons and their data-plane processes.
    let mut c = Cluster::new("ucxconf", 2);
    c.extra = ["--data-plane", "ucx", "--ucx-over-tcp", "--eager-max", "0"]
        .map(String::from)
        .to_vec();
    for i in 0..2 {
        let mut cmd = c.mount_cmd(i);
        plant.aim(&mut cmd);
        let m = mounted_at(&c.root.join(format!("m{i}")), cmd.output().unwrap());
        c.nodes.insert(i as usize, m);
    }
    let data = pattern(4 << 20, 68);
    fs::write(c.backing.join("x"), &data).unwrap();
    assert!(fs::read(c.nodes[0].path("x")).unwrap() == data);
    wait_until("the publish", std::time::Duration::from_secs(10), || {
        c.total("home_global_files") > 0
    });
    assert!(fs::read(c.nodes[1].path("x")).unwrap() == data);
    assert!(
        c.nodes[1].stat("bytes_from_peers") > 0,
        "pulled from node 0"
    );
    assert_eq!(c.nodes[1].stats()["data_plane"], "ucx");
    assert_eq!(
        plant.marks(),
        Vec::<String>::new(),
        "a node or its data plane"
    );
}
