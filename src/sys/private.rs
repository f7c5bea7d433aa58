//! Paths root must not be redirected through. dyadfs runs as root on nodes shared with other
//! users' jobs, so a path it writes or trusts must be one no other user can swap: a directory
//! owned by the daemon's user (or root) and writable by no one else, under ancestors no one else
//! can rename it in (owned by root or us, and writable by others only when sticky, like /tmp);
//! a file opened without following a final symlink (`O_NOFOLLOW`), created 0600, and never
//! truncated when someone else owns it. The checks are sshd's StrictModes, and the refusals are
//! one line naming the path and the fix.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use super::euid;

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

/// Checks that `dir` is a directory only this process's user (or root) can change, reached
/// through ancestors no other user can rename it in. Errs with a one-line reason.
pub fn check_private_dir(dir: &Path) -> io::Result<()> {
    let me = euid();
    let abs = std::path::absolute(dir)?;
    // A symlink on the way must be root's or ours: another user's could point anywhere.
    let mut prefix = PathBuf::new();
    for c in abs.components() {
        prefix.push(c);
        if matches!(c, Component::RootDir) {
            continue;
        }
        let m = std::fs::symlink_metadata(&prefix)?;
        if m.file_type().is_symlink() && m.uid() != 0 && m.uid() != me {
            return Err(refused(format!(
                "{} is a symlink owned by uid {}",
                prefix.display(),
                m.uid()
            )));
        }
    }
    let real = std::fs::canonicalize(&abs)?;
    let m = std::fs::metadata(&real)?;
    if !m.is_dir() {
        return Err(refused(format!("{} is not a directory", real.display())));
    }
    if m.uid() != me {
        return Err(refused(format!(
            "{} is owned by uid {}, not {me}: another user could plant files in it",
            real.display(),
            m.uid()
        )));
    }
    if m.mode() & 0o022 != 0 {
        // A shared directory (a sticky /nvme or /tmp) is for everyone: a subdirectory of it,
        // not a chmod that would lock the others out.
        let fix = if m.mode() & 0o1000 != 0 {
            format!(
                "use a directory of your own in it, e.g. {}",
                real.join(format!("dyadfs-{me}")).display()
            )
        } else {
            format!(
                "chmod 700 {}, or use a directory of your own",
                real.display()
            )
        };
        return Err(refused(format!(
            "{} is writable by group or others (mode {:o}): {fix}",
            real.display(),
            m.mode() & 0o7777,
        )));
    }
    for a in real.ancestors().skip(1) {
        let m = std::fs::metadata(a)?;
        let sticky = m.mode() & 0o1000 != 0;
        if m.uid() != 0 && m.uid() != me {
            return Err(refused(format!(
                "{} (above {}) is owned by uid {}, who could move it",
                a.display(),
                real.display(),
                m.uid()
            )));
        }
        if m.mode() & 0o022 != 0 && !sticky {
            return Err(refused(format!(
                "{} (above {}) is writable by group or others (mode {:o}) and not sticky",
                a.display(),
                real.display(),
                m.mode() & 0o7777
            )));
        }
    }
    Ok(())
}

/// Checks that a file root is about to trust for code (a binary, a library) can be changed by
/// root only: owned by root, writable by no one else, in a directory [`check_private_dir`]
/// accepts for root.
pub fn check_root_file(path: &Path) -> io::Result<()> {
    let real = std::fs::canonicalize(path)?;
    let m = std::fs::metadata(&real)?;
    if m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(refused(format!(
            "{} is owned by uid {} (mode {:o}): root would run code another user can change",
            real.display(),
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    check_private_dir(real.parent().unwrap_or(Path::new("/")))
}

/// The files of the shared libraries this process has loaded whose names start with one of
/// `prefixes` (from /proc/self/maps).
pub fn loaded_libraries(prefixes: &[&str]) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut out: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(PathBuf::from)
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| prefixes.iter().any(|x| n.starts_with(x)))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Opens a file of ours without following a final symlink, creating it 0600 if missing, and
/// refuses one another user owns. `append`: writes go to its end; else it is emptied (only
/// after the ownership check, so nobody else's file is ever truncated).
pub fn open_private(path: &Path, append: bool) -> io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .write(!append)
        .append(append)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused(format!("{} is a symlink", path.display())),
            _ => e,
        })?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(refused(format!("{} is not a regular file", path.display())));
    }
    if m.uid() != euid() {
        return Err(refused(format!(
            "{} is owned by uid {}, not {}",
            path.display(),
            m.uid(),
            euid()
        )));
    }
    // A hard link of another file of ours (say /etc/shadow for root, where protected_hardlinks
    // is off) would pass the checks above.
    if m.nlink() != 1 {
        return Err(refused(format!(
            "{} has {} hard links",
            path.display(),
            m.nlink()
        )));
    }
    if m.mode() & 0o077 != 0 {
        // Ours, but made readable by others (an older dyadfs created logs 0644).
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    if !append {
        f.set_len(0)?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn open_and_redirectable_paths_are_refused() {
        let base = std::env::temp_dir().join(format!("dyadfs-private-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("ok")).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_private_dir(&base.join("ok")).unwrap();
        // Writable by others, not sticky: refused, as is a directory below it.
        std::fs::create_dir_all(base.join("open/cache")).unwrap();
        std::fs::set_permissions(base.join("open"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        let e = check_private_dir(&base.join("open/cache")).unwrap_err();
        assert!(e.to_string().contains("not sticky"), "{e}");
        std::fs::set_permissions(base.join("open"), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
        check_private_dir(&base.join("open/cache")).unwrap();
        std::fs::set_permissions(base.join("ok"), std::fs::Permissions::from_mode(0o775)).unwrap();
        assert!(check_private_dir(&base.join("ok")).is_err());
        // Sticky does not make a cache dir private (a fresh tmpfs root is 1777): refused.
        std::fs::set_permissions(base.join("ok"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(check_private_dir(&base.join("ok")).is_err());
        // A file: a symlink is never followed, a file of ours is emptied only when asked.
        let f = base.join("log");
        std::fs::write(&f, b"kept").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(open_private(&f, true).unwrap());
        assert_eq!(std::fs::read(&f).unwrap(), b"kept");
        let mode = std::fs::metadata(&f).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "an old 0644 log is made private");
        drop(open_private(&f, false).unwrap());
        assert_eq!(std::fs::read(&f).unwrap(), b"");
        let victim = base.join("victim");
        std::fs::write(&victim, b"victim").unwrap();
        std::os::unix::fs::symlink(&victim, base.join("link")).unwrap();
        let e = open_private(&base.join("link"), false).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");
        let hard = base.join("hard");
        std::fs::hard_link(&victim, &hard).unwrap();
        let e = open_private(&hard, false).unwrap_err();
        assert!(e.to_string().contains("hard links"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");
        let made = base.join("made");
        drop(open_private(&made, true).unwrap());
        assert_eq!(
            std::fs::metadata(&made).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let _ = std::fs::remove_dir_all(base);
    }
}
