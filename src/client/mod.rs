//! The commands that talk to a running mount, not part of any mount's life: `dyadfs stats`,
//! `status` and `scrub` (questions to the daemon behind a mount point, as extended attributes
//! of its root), `warm` and `prefetch`.

pub mod prefetch;
pub mod warm;

use std::path::Path;

use crate::daemon::UserError;

/// `dyadfs stats`: asks the daemon behind a mount point for its counters.
pub fn stats(mountpoint: &Path) -> Result<crate::stats::Snapshot, UserError> {
    ask(mountpoint, crate::stats::STATS_XATTR)
}

/// `dyadfs status`: the cluster as the daemon behind a mount point sees it, and its counters.
pub fn status(
    mountpoint: &Path,
) -> Result<(crate::stats::StatusReport, crate::stats::Snapshot), UserError> {
    Ok((
        ask(mountpoint, crate::stats::STATUS_XATTR)?,
        stats(mountpoint)?,
    ))
}

/// `dyadfs scrub`: has the daemon behind a mount point re-check every cached chunk against its
/// checksum and drop the bad ones; returns what it found.
pub fn scrub(mountpoint: &Path) -> Result<crate::cache::ScrubReport, UserError> {
    ask(mountpoint, crate::stats::SCRUB_XATTR)
}

/// A JSON answer of the daemon behind a mount point, read as an extended attribute of its
/// root (the daemon answers it; no other file system has it).
fn ask<T: serde::de::DeserializeOwned>(mountpoint: &Path, xattr: &str) -> Result<T, UserError> {
    let not_ours = || UserError::NotOurs(mountpoint.to_path_buf());
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| not_ours())?;
    let name = std::ffi::CString::new(xattr).expect("no NUL");
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: valid NUL-terminated strings and a buffer of the length we pass.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA | libc::ENOTSUP) => Err(not_ours()),
            // Its daemon is gone: say how to clear it.
            Some(libc::ENOTCONN) => Err(UserError::DeadMount(mountpoint.to_path_buf())),
            _ => Err(UserError::Stats {
                path: mountpoint.to_path_buf(),
                source: e,
            }),
        };
    }
    buf.truncate(n as usize);
    serde_json::from_slice(&buf).map_err(|source| UserError::StatsUnreadable {
        path: mountpoint.to_path_buf(),
        source,
    })
}
