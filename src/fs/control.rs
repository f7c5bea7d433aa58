//! The mount root's control attributes: `dyadfs stats`, `status` and `scrub` read them, and
//! `dyadfs prefetch` hands its lists over as one (the only extended attributes dyadfs has).

use std::ffi::OsStr;

use super::inodes::ROOT_INO;
use super::{DyadFs, Error, prefetch};
use crate::core::source::Source;
use crate::stats::{MemberStatus, SCRUB_XATTR, STATS_XATTR, STATUS_XATTR, StatusReport};

impl<S: Source> DyadFs<S> {
    /// Extended attributes: only the root's control attributes exist (stats, status, scrub,
    /// prefetch requests), asked by thread `tid` as `uid`:`gid`.
    pub fn getxattr(
        &self,
        ino: u64,
        name: &OsStr,
        (uid, gid, tid): (u32, u32, u32),
    ) -> Result<Vec<u8>, Error> {
        if ino != ROOT_INO {
            return Err(Error::NoAttr);
        }
        if let Some((stream, list)) = name.to_str().and_then(prefetch::request) {
            let who = super::caller::Credentials::of_thread(tid, uid, gid);
            return self.prefetch_request(stream, list, who);
        }
        let cache = &self.reader.cache;
        // A scrub reads the whole cache, a status asks every member: work any local user could
        // otherwise start at will.
        if (name == SCRUB_XATTR || name == STATUS_XATTR) && !may_administer(uid) {
            return Err(Error::NotOwner);
        }
        if name == SCRUB_XATTR {
            return Ok(serde_json::to_vec(&cache.scrub()).expect("a report serializes"));
        }
        if name == STATUS_XATTR {
            let report = match self.status.get() {
                Some(f) => f(),
                None => StatusReport {
                    node: 0,
                    members: vec![MemberStatus {
                        id: 0,
                        addr: String::new(),
                        rack: String::new(),
                        state: "self".into(),
                        files: Some(cache.cached_files()),
                        bytes: Some(cache.used_bytes()),
                    }],
                },
            };
            return Ok(serde_json::to_vec(&report).expect("a report serializes"));
        }
        if name != STATS_XATTR {
            return Err(Error::NoAttr);
        }
        let snap = (self.snapshots())();
        Ok(serde_json::to_vec(&snap).expect("stats serialize"))
    }
}

/// Whether caller `uid` may ask for whole-cache or cluster-wide work: root or the mount's owner
/// (the daemon's user).
fn may_administer(uid: u32) -> bool {
    uid == 0 || uid == crate::sys::euid()
}
