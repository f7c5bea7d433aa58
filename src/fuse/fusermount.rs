//! A mount made by `fusermount3` for the calling user, its `/dev/fuse` descriptor handed back
//! to us and not served here: the node service serves it. This is libfuse's own way for a plain
//! user to mount (the setuid `fusermount3` checks the mount point is the user's to mount on,
//! mounts with the user's id, so only that user may use it, and passes the descriptor back over
//! the socket named by `_FUSE_COMMFD`); the user unmounts it with `fusermount3 -u` as any FUSE
//! mount.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::sys::seqpacket::Conn;

/// Mounts an empty FUSE file system at `mountpoint` with `options` (fusermount3's `-o`; it adds
/// the user's ids itself) and returns its `/dev/fuse` descriptor, whose first request, the
/// kernel's INIT, waits for whoever serves it.
pub fn mount(mountpoint: &Path, options: &[String]) -> io::Result<OwnedFd> {
    let (ours, theirs) = Conn::pair()?;
    let theirs_fd = theirs.as_raw_fd();
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-o")
        .arg(options.join(","))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs_fd.to_string())
        .stdin(Stdio::null());
    // SAFETY: runs in the forked child before exec and only calls the async-signal-safe fcntl,
    // which lets fusermount3 inherit its end of the socket.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(theirs_fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("fusermount3 could not be started ({e}): install fuse3"),
        )
    })?;
    drop(theirs);
    let received = ours.recv();
    let status = child.wait()?;
    match received {
        Ok((_, Some(fd))) if status.success() => Ok(fd),
        // It mounted and then failed: nothing must stay mounted.
        Ok((_, Some(_))) => {
            unmount(mountpoint);
            Err(io::Error::other(format!("fusermount3 failed ({status})")))
        }
        Ok((_, None)) => Err(io::Error::other(format!(
            "fusermount3 did not mount {} ({status}; it says why above)",
            mountpoint.display()
        ))),
        Err(e) => Err(e),
    }
}

/// Unmounts what [`mount`] mounted, lazily (nothing may be using it yet, but a refusal is not
/// left mounted).
pub fn unmount(mountpoint: &Path) {
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg("--")
        .arg(mountpoint)
        .stdin(Stdio::null())
        .status();
}
