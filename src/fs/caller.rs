//! Who is behind a request, as the file system asks it: a port ([`Context`]) the kernel adapter
//! implements (`fuse/caller.rs` reads `/proc`), so that the file system never reads `/proc` nor
//! takes a kernel thread id. The kernel looks a name up before any system call that names a
//! path, and FUSE does not say why: only a consumer's open may wait (`--wait`) for somebody
//! else to publish the name, while a producer's checks (`stat`, `access`, `cp`'s and
//! `shutil.copy`'s look at the destination, `os.makedirs`) and creations must be answered at
//! once. Each question is asked only when its answer is needed (the adapter's answers cost a
//! read of `/proc` each).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::core::sync::lock;

/// The caller of one request.
pub trait Context {
    /// The request's user and group.
    fn uid(&self) -> u32;
    fn gid(&self) -> u32;
    /// The thread that sent the request (0: none, or unknown); free to ask, unlike the rest.
    fn thread(&self) -> u32;
    /// Its process (thread group) and that process's parent, while it runs.
    fn process(&self) -> Option<(u32, u32)>;
    /// What it opens, if it is opening a name to read it: `open`, `openat` or `openat2`
    /// without `O_CREAT`, `O_DIRECTORY` or `O_PATH`, for reading or reading and writing.
    /// Anything else, and a caller that cannot be told, is not.
    fn opening_to_read(&self) -> Option<OpeningToRead>;
    /// Its credentials, supplementary groups included: none if they cannot be read, so an
    /// unknown caller gets fewer rights, never more.
    fn credentials(&self) -> Credentials;
}

/// What a caller opening a name to read is opening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpeningToRead {
    /// The last component of the path it opens (empty if it could not be read): a lookup of
    /// another name is of a directory on the way.
    pub last: Vec<u8>,
}

/// Whom a request runs for: the ids a file's permission bits are judged against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Credentials {
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// A caller nothing is known of but its ids (the core's own tests, and calls no process made).
#[derive(Debug, Clone, Copy)]
pub struct Unknown {
    pub uid: u32,
    pub gid: u32,
}

impl Unknown {
    /// Root, as the core's tests call.
    #[cfg(test)]
    pub const ROOT: Unknown = Unknown { uid: 0, gid: 0 };
}

impl Context for Unknown {
    fn uid(&self) -> u32 {
        self.uid
    }
    fn gid(&self) -> u32 {
        self.gid
    }
    fn thread(&self) -> u32 {
        0
    }
    fn process(&self) -> Option<(u32, u32)> {
        None
    }
    fn opening_to_read(&self) -> Option<OpeningToRead> {
        None
    }
    fn credentials(&self) -> Credentials {
        Credentials {
            uid: self.uid,
            gid: self.gid,
            groups: Vec::new(),
        }
    }
}

/// Names a process was just told are absent, by a lookup that did not wait (a check: `stat`,
/// `access`, an open that creates). A program that checked a name and found it absent is not
/// waiting for it when it then opens it to read: `rsync` stats the destination, then its
/// receiver (a child of the process that checked) opens it for reading as the basis of a delta;
/// that open is answered at once too. Within [`ToldAbsent::FOR`], for the process or its
/// parent; bounded, oldest dropped first.
#[derive(Default)]
pub struct ToldAbsent {
    told: Mutex<HashMap<(u32, String), Instant>>,
}

impl ToldAbsent {
    /// How long an answer counts.
    pub const FOR: Duration = Duration::from_secs(2);
    /// The most answers remembered.
    const MAX: usize = 4096;

    /// The caller's process was told `path` is absent.
    pub fn tell(&self, caller: &dyn Context, path: &str) {
        let Some((pid, _)) = caller.process() else {
            return;
        };
        let mut told = lock(&self.told);
        if told.len() >= Self::MAX {
            told.retain(|_, at| at.elapsed() < Self::FOR);
            if told.len() >= Self::MAX {
                told.clear();
            }
        }
        told.insert((pid, path.to_string()), Instant::now());
    }

    /// Whether the caller's process, or its parent, was told `path` is absent just now.
    pub fn told(&self, caller: &dyn Context, path: &str) -> bool {
        if lock(&self.told).is_empty() {
            return false;
        }
        // Asked before the lock is taken: other lookups need not wait on the answer.
        let Some((pid, parent)) = caller.process() else {
            return false;
        };
        let told = lock(&self.told);
        let recent = |p: u32| {
            told.get(&(p, path.to_string()))
                .is_some_and(|at| at.elapsed() < Self::FOR)
        };
        recent(pid) || recent(parent)
    }
}
