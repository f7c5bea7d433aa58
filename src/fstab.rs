//! Mounting the way admins do: `mount -t fuse.dyadfs SOURCE MOUNTPOINT -o OPTIONS` (an
//! `/etc/fstab` line, a systemd mount unit) runs `/sbin/mount.fuse.dyadfs` with those
//! arguments. Installed as that name (`dyadfs install`), the binary turns them into `dyadfs
//! mount MOUNTPOINT --backing SOURCE ...`: every mount flag is accepted as an option
//! (`ssd=/nvme/dyadfs,capacity=500G,replicate`), the options `mount` itself handles are
//! dropped, and the rest are FUSE options (`allow_other`).

use std::ffi::OsString;
use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;

/// The names the binary answers to as a mount helper.
pub const HELPER_NAMES: [&str; 2] = ["mount.fuse.dyadfs", "mount.dyadfs"];

/// Options for `mount(8)` and systemd, not for the file system.
const MOUNT_OPTIONS: [&str; 12] = [
    "defaults", "auto", "noauto", "user", "nouser", "users", "_netdev", "nofail", "rw", "exec",
    "noexec", "owner",
];

/// Whether the program was started as a mount helper (by its name).
pub fn is_helper(argv0: &OsString) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|n| HELPER_NAMES.iter().any(|h| n == *h))
}

/// fstab sources that mean a managed directory (no `--backing`).
const MANAGED_SOURCES: [&str; 2] = ["managed", "none"];

/// `dyadfs mount` arguments from a mount helper's `SOURCE MOUNTPOINT [-o OPTIONS]...`
/// (`-n`, `-s`, `-v`: mount's own flags, ignored). The source `managed` (or `none`) mounts a
/// managed directory.
pub fn mount_argv(helper_args: &[OsString]) -> Result<Vec<OsString>, String> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut args = helper_args.iter();
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("-o") => options.push(
                args.next()
                    .ok_or("-o needs a value")?
                    .to_str()
                    .ok_or("options are not UTF-8")?
                    .to_string(),
            ),
            Some(o) if o.starts_with("-o") => options.push(o[2..].to_string()),
            Some("-n" | "-s" | "-v" | "-f") => {}
            _ => positional.push(a.clone()),
        }
    }
    let [source, mountpoint] = positional.as_slice() else {
        return Err("usage: mount.fuse.dyadfs SOURCE MOUNTPOINT [-o OPTIONS]".into());
    };
    let mount = Cli::command();
    let mount = mount
        .find_subcommand("mount")
        .expect("the mount subcommand");
    let flag = |name: &str| {
        mount
            .get_arguments()
            .find(|a| a.get_long() == Some(name))
            .map(|a| {
                // A value that may be left out (`replicate`): a flag without one.
                let optional = a.get_num_args().is_some_and(|n| n.min_values() == 0);
                (a.get_action().takes_values(), optional)
            })
    };
    let mut argv: Vec<OsString> = vec!["dyadfs".into(), "mount".into(), mountpoint.clone()];
    // The source "managed" (or "none", fstab's word for no device): a managed directory.
    if !MANAGED_SOURCES.iter().any(|m| source == m) {
        argv.extend(["--backing".into(), source.clone()]);
    }
    let mut fuse = Vec::new();
    for opt in options.iter().flat_map(|o| o.split(',')) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        if key.is_empty() || MOUNT_OPTIONS.contains(&key) || key.starts_with("x-") {
            continue;
        }
        match (flag(key), value) {
            // `=`: an optional value must not be taken for the next argument.
            (Some((true, true)), Some(v)) => argv.push(format!("--{key}={v}").into()),
            (Some((true, false)), Some(v)) => argv.extend([format!("--{key}").into(), v.into()]),
            (Some((true, false)), None) => {
                return Err(format!("option {key} needs a value ({key}=...)"));
            }
            (Some((false, _) | (true, true)), None) => argv.push(format!("--{key}").into()),
            (Some((false, _)), Some(_)) => return Err(format!("option {key} takes no value")),
            (None, _) => fuse.push(opt.to_string()),
        }
    }
    if !fuse.is_empty() {
        argv.extend(["-o".into(), fuse.join(",").into()]);
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        let args: Vec<OsString> = s.split(' ').map(OsString::from).collect();
        mount_argv(&args)
            .unwrap()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn a_managed_source_mounts_a_managed_directory() {
        for source in MANAGED_SOURCES {
            assert_eq!(
                argv(&format!("{source} /dyad -o ssd=/nvme")),
                ["dyadfs", "mount", "/dyad", "--ssd", "/nvme"]
            );
        }
    }

    #[test]
    fn an_fstab_line_becomes_a_mount_command() {
        assert_eq!(
            argv("/lustre/ds /dyad -o rw,ssd=/nvme/d,capacity=500G,_netdev,replicate,allow_other"),
            [
                "dyadfs",
                "mount",
                "/dyad",
                "--backing",
                "/lustre/ds",
                "--ssd",
                "/nvme/d",
                "--capacity",
                "500G",
                "--replicate",
                "-o",
                "allow_other"
            ]
        );
        // An option whose value may be left out takes it after `=`, never the next argument.
        assert_eq!(
            argv("/lustre/ds /dyad -o ssd=/nvme/d,replicate=off")[5..],
            ["--ssd", "/nvme/d", "--replicate=off"]
        );
        assert!(is_helper(&"/sbin/mount.fuse.dyadfs".into()));
        assert!(!is_helper(&"/usr/bin/dyadfs".into()));
        let bad = |s: &str| mount_argv(&s.split(' ').map(OsString::from).collect::<Vec<_>>());
        assert!(bad("/a /b -o ssd").unwrap_err().contains("needs a value"));
        assert!(bad("/a -o ssd=/x").unwrap_err().contains("usage"));
    }
}
