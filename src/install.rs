//! `dyadfs install`: puts the mount helper where mount(8) looks. `mount` runs the helper as
//! root, so what it runs must be code only root can change: the running binary and the UCX
//! libraries it would load (`ucx_sys::load`) are checked (root's, in root's directories) and
//! then *copied* under a prefix of root's (`bin/dyadfs`, `lib/` with UCX's libraries and its
//! `ucx/` modules, `etc/ucx`), where the copy loads UCX from (`lib/` beside its `bin/`; a copy
//! outside the build's tree never looks in the build's UCX). A binary that carries a library
//! search path has it rewritten to `$ORIGIN/../lib` ([`crate::sys::elf`]): one into a checkout
//! would be searched before the system's directories for every library, libc included.
//! `DIR/mount.fuse.dyadfs` then links to the copy.

use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::fstab::HELPER_NAMES;
use crate::sys::private::{check_root_file, loaded_libraries};

/// The copy's library search path: its own `lib/`.
const RUNPATH: &str = "$ORIGIN/../lib";

/// Installs this binary (and its UCX) under `prefix` and links `dir/mount.fuse.dyadfs` and
/// `bin_dir/dyadfs` to the copy (making either directory if it is missing). Returns the links.
pub fn install(dir: &Path, prefix: &Path, bin_dir: &Path) -> io::Result<Vec<PathBuf>> {
    let exe = std::env::current_exe()?;
    // The UCX a UCX data plane would load, mapped now so that it is found and copied (none
    // loadable: the copy is made without, and its UCX data plane says so when asked for).
    if let Err(why) = ucx_sys::load() {
        tracing::warn!("installing without UCX: {why}");
    }
    let libs = loaded_libraries(&["libucp", "libucs", "libuct", "libucm"]);
    if crate::sys::euid() == 0 {
        check_root_file(&exe)?;
        for lib in &libs {
            check_root_file(lib)?;
        }
    }
    let installed = copy_with_ucx(&exe, &libs, prefix)?;
    [dir.join(HELPER_NAMES[0]), bin_dir.join("dyadfs")]
        .into_iter()
        .map(|link| link_to(&installed, link))
        .collect()
}

/// Makes `link` a symlink to `target` (its directory made if missing), replacing a symlink
/// there but nothing else.
fn link_to(target: &Path, link: PathBuf) -> io::Result<PathBuf> {
    if let Some(dir) = link.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)?;
    }
    match std::fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&link)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a symlink", link.display()),
            ));
        }
        Err(_) => {}
    }
    std::os::unix::fs::symlink(target, &link)?;
    Ok(link)
}

/// Copies `exe` to `prefix/bin/dyadfs` with its search path rewritten, and the UCX libraries
/// it loaded (`libs`: each library by the name the loader asks for, the modules of its `ucx/`
/// directory, and UCX's `etc/ucx`) to `prefix/lib`. Returns the copied binary.
fn copy_with_ucx(exe: &Path, libs: &[PathBuf], prefix: &Path) -> io::Result<PathBuf> {
    let (bin, lib) = (prefix.join("bin"), prefix.join("lib"));
    for d in [prefix, &bin, &lib, &lib.join("ucx")] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(d)?;
    }
    if crate::sys::euid() == 0 {
        // The prefix itself must be root's: it is where root's code will live.
        crate::sys::private::check_private_dir(prefix)?;
    }
    let mut image = std::fs::read(exe)?;
    if !crate::sys::elf::runpaths(&image)
        .map_err(io::Error::other)?
        .is_empty()
    {
        crate::sys::elf::set_runpath(&mut image, RUNPATH).map_err(io::Error::other)?;
    }
    let installed = bin.join("dyadfs");
    write_new(&installed, &image, 0o755)?;
    let Some(from) = libs.first().and_then(|l| l.parent()) else {
        // Built against a system UCX: the loader finds it where it always does.
        return Ok(installed);
    };
    for l in libs.iter().filter(|l| l.parent() == Some(from)) {
        copy_as_soname(l, &lib)?;
    }
    // UCX's modules and its configuration are loaded by root as surely as the libraries are:
    // held to the same checks (root's, in root's directories).
    let root = crate::sys::euid() == 0;
    if let Ok(modules) = std::fs::read_dir(from.join("ucx")) {
        for m in modules.flatten() {
            if m.file_name().to_str().is_some_and(|n| n.ends_with(".so.0")) {
                if root {
                    check_root_file(&m.path())?;
                }
                copy_as_soname(&m.path(), &lib.join("ucx"))?;
            }
        }
    }
    let conf = from.join("../etc/ucx/ucx.conf");
    if conf.exists() {
        if root {
            check_root_file(&conf)?;
        }
        let text = String::from_utf8_lossy(&std::fs::read(&conf)?).into_owned();
        let etc = prefix.join("etc/ucx");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&etc)?;
        write_new(&etc.join("ucx.conf"), kept_conf(&text).as_bytes(), 0o644)?;
    }
    Ok(installed)
}

/// UCX's configuration as the copy keeps it: every setting but the module directory, which
/// would make root load modules from outside the prefix (the copy finds its own in `lib/ucx`).
fn kept_conf(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("UCX_MODULE_DIR"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Copies library `path` (its contents, symlinks followed) into `dir` under the name the
/// loader asks for: `libucp.so.0.0.0` as `libucp.so.0`.
fn copy_as_soname(path: &Path, dir: &Path) -> io::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let soname = match name.find(".so.") {
        Some(i) => {
            let major = name[i + 4..].split('.').next().unwrap_or("0");
            format!("{}.so.{major}", &name[..i])
        }
        None => name.to_string(),
    };
    write_new(&dir.join(soname), &std::fs::read(path)?, 0o755)
}

/// Writes `bytes` to `path` as a new file of `mode` that replaces any old one at once (a
/// running mount keeps the file it loaded).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("new-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_copied_conf_names_no_module_dir() {
        let kept = super::kept_conf("UCX_MEM_MMAP_HOOK_MODE=none\nUCX_MODULE_DIR=/home/u/evil\n");
        assert_eq!(kept, "UCX_MEM_MMAP_HOOK_MODE=none\n");
    }
}
