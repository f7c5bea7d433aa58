//! Acting as another user for one question, on the calling thread alone. The node service runs
//! as root and serves cached bytes to many users; whether one of them may read a shared file is
//! asked of the shared file system *as that user* (its ACLs, the search rights of every
//! directory above, as it would decide), by giving this thread the user's file-system ids and
//! groups for the call. `setfsuid`, `setfsgid` and the raw `setgroups` system call change the
//! calling thread only (glibc's `setgroups` wrapper changes every thread: not used), and a
//! file-system uid other than 0 drops the thread's file capabilities (`CAP_DAC_OVERRIDE` and its
//! kin) until it is 0 again, so the kernel judges the call as it would the user's own.

use std::io;

/// Whom to act as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

/// The most supplementary groups a user may bring (the kernel's NGROUPS_MAX).
const NGROUPS_MAX: usize = 65536;

/// Runs `f` on this thread with `ids` as its file-system identity, then restores root's. Only a
/// process whose file-system uid is 0 may do this (the node service). A failure to restore
/// aborts the process: a thread left with another user's identity must never serve again.
pub fn as_user<T>(ids: &Ids, f: impl FnOnce() -> T) -> io::Result<T> {
    if ids.groups.len() > NGROUPS_MAX {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let saved = thread_groups()?;
    set_thread_groups(&ids.groups)?;
    let restore = Restore { groups: saved };
    // SAFETY: setfsgid changes only this thread's file-system gid; it returns the previous one.
    let before = unsafe { libc::setfsgid(ids.gid) };
    // SAFETY: as above; -1 (as u32) asks for the current value without changing it.
    if unsafe { libc::setfsgid(u32::MAX) } as u32 != ids.gid {
        drop(restore);
        return Err(refused("setfsgid", before));
    }
    // SAFETY: setfsuid changes only this thread's file-system uid; it returns the previous one.
    let before = unsafe { libc::setfsuid(ids.uid) };
    // SAFETY: as above; -1 asks for the current value.
    if unsafe { libc::setfsuid(u32::MAX) } as u32 != ids.uid {
        drop(restore);
        return Err(refused("setfsuid", before));
    }
    let out = f();
    drop(restore);
    Ok(out)
}

fn refused(what: &str, before: i32) -> io::Error {
    io::Error::other(format!(
        "{what} refused (file-system id {before}): only root acts as another user"
    ))
}

/// Gives the thread back root's file-system ids and its groups; aborts if it cannot.
struct Restore {
    groups: Vec<u32>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        // SAFETY: as in `as_user`; uid first, which gives the thread its capabilities back.
        unsafe {
            libc::setfsuid(0);
            libc::setfsgid(0);
        }
        // SAFETY: as in `as_user`.
        let back = unsafe { libc::setfsuid(u32::MAX) == 0 && libc::setfsgid(u32::MAX) == 0 };
        if !back || set_thread_groups(&self.groups).is_err() {
            eprintln!("dyadfs: a thread could not take back root's identity: aborting");
            std::process::abort();
        }
    }
}

/// This thread's supplementary groups.
fn thread_groups() -> io::Result<Vec<u32>> {
    // SAFETY: with a size of 0, getgroups only returns how many there are.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0u32; n as usize];
    // SAFETY: the buffer holds `n` gids; the kernel writes at most that many.
    let got = unsafe { libc::syscall(libc::SYS_getgroups, n, groups.as_mut_ptr()) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(got as usize);
    Ok(groups)
}

/// Sets this thread's supplementary groups (the system call, not glibc's all-threads wrapper).
fn set_thread_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: the kernel reads `groups.len()` gids from the slice, which holds them.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the user `ids` may access `path` (relative to the directory `dir`, or absolute) as
/// `mode` (`libc::R_OK`, `X_OK`, ...) asks, as the file system judges that user: `Ok(false)` for
/// EACCES or EPERM, the error otherwise (ENOENT: not there).
pub fn may_access(
    ids: &Ids,
    dir: std::os::fd::BorrowedFd<'_>,
    path: &std::ffi::CStr,
    mode: i32,
) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let r = as_user(ids, || {
        // SAFETY: `path` is NUL-terminated and `dir` an open descriptor; AT_EACCESS judges by
        // the thread's file-system ids, which `as_user` set.
        let r = unsafe { libc::faccessat(dir.as_raw_fd(), path.as_ptr(), mode, libc::AT_EACCESS) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    })?;
    match r {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_judged_as_itself_and_root_comes_back() {
        if crate::sys::euid() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        use std::os::fd::AsFd;
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("dyadfs-identity-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, b"x").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
        let open = std::fs::File::open(&dir).unwrap();
        let name = c"secret";
        let nobody = Ids {
            uid: 65534,
            gid: 65534,
            groups: vec![],
        };
        assert!(!may_access(&nobody, open.as_fd(), name, libc::R_OK).unwrap());
        // A group that owns the file grants it (root's file: group 0).
        let in_group = Ids {
            groups: vec![0],
            ..nobody.clone()
        };
        assert!(may_access(&in_group, open.as_fd(), name, libc::R_OK).unwrap());
        assert!(!may_access(&in_group, open.as_fd(), name, libc::W_OK).unwrap());
        // Root's own rights are back on this thread, and were never lost on another.
        assert!(std::fs::File::open(&secret).is_ok());
        assert_eq!(thread_groups().unwrap(), {
            let t = std::thread::spawn(|| thread_groups().unwrap());
            t.join().unwrap()
        });
        let other = std::thread::spawn({
            let secret = secret.clone();
            move || {
                as_user(&nobody, || {
                    std::fs::read(&secret).map_err(|e| e.raw_os_error())
                })
                .unwrap()
            }
        });
        assert_eq!(other.join().unwrap(), Err(Some(libc::EACCES)));
        assert_eq!(std::fs::read(&secret).unwrap(), b"x");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
