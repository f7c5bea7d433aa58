//! Rights asked of the shared file system as the caller ([`crate::fs::rights`]): the service
//! holds the dataset's root opened (as the user who attached, so it is a root that user could
//! reach) and asks `faccessat(AT_EACCESS)` beneath it with the caller's file-system ids and
//! groups on the asking thread (`sys::identity`). Nothing is remembered between asks: each open
//! and each lookup is judged by what the shared file system says then.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};

use crate::fs::caller::Credentials;
use crate::fs::rights::Rights;
use crate::sys::identity::{Ids, may_access};

pub struct AsCaller {
    /// The dataset's root (`O_PATH`).
    pub root: OwnedFd,
}

impl Rights for AsCaller {
    fn may(&self, path: &str, who: &Credentials, mode: i32) -> Option<bool> {
        let rel = if path.is_empty() { "." } else { path };
        let Ok(rel) = CString::new(rel) else {
            return Some(false);
        };
        let ids = Ids {
            uid: who.uid,
            gid: who.gid,
            groups: who.groups.clone(),
        };
        match may_access(&ids, self.root.as_fd(), &rel, mode) {
            Ok(yes) => Some(yes),
            // Not on the shared file system (a name produced here): the mode bits decide.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
            Err(e) => {
                tracing::warn!(error = %e, path, "a caller's rights could not be asked: refused");
                Some(false)
            }
        }
    }
}
