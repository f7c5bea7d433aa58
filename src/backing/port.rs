//! The shared file system's port: what the file system asks of it, and its answers as plain
//! data (so a double can make them without a file).

use std::ffi::OsString;
use std::fs::Metadata;
use std::io;
use std::path::PathBuf;
use std::time::Instant;

use crate::core::{Kind, Version};

/// What the file system asks of the shared file system (its bytes come through a
/// [`Source`](crate::core::source::Source), which [`BackingStore`](super::BackingStore) is too).
pub trait SharedFs: Send + Sync + 'static {
    /// The attributes of `rel` itself (a symlink is not followed).
    fn stat(&self, rel: &str) -> io::Result<BackingStat>;
    /// Every entry of directory `rel` with its kind.
    fn list(&self, rel: &str) -> io::Result<Vec<(OsString, Kind)>>;
    /// The target of symlink `rel`.
    fn read_link(&self, rel: &str) -> io::Result<PathBuf>;
    /// The figures of the file system it is (`statfs`).
    fn statvfs(&self) -> io::Result<libc::statvfs>;
    /// Whether `rel` is known not to exist without asking (so neither a stat nor a remembered
    /// one is looked for).
    fn surely_absent(&self, _rel: &str) -> bool {
        false
    }
}

/// A backing entry's attributes.
#[derive(Clone, Debug)]
pub struct BackingStat {
    pub meta: Meta,
    /// The permission bits (of 0o7777) the mount may present: all but where an ACL narrows
    /// them (see [`acl`](super::acl)).
    pub allowed: u16,
    /// When it was read: what the metadata TTL counts from, however long it is kept.
    pub read: Instant,
}

impl std::ops::Deref for BackingStat {
    type Target = Meta;
    fn deref(&self) -> &Meta {
        &self.meta
    }
}

/// What the shared file system says of an entry: the parts of a `stat` the mount presents, as
/// plain data (a double makes them without a file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// The permission and set-id bits (of 0o7777).
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    /// Seconds and nanoseconds since the epoch.
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Meta {
    pub fn of(m: &Metadata) -> Meta {
        use std::os::unix::fs::MetadataExt;
        Meta {
            kind: Kind::of(m.file_type()),
            size: m.len(),
            blocks: m.blocks(),
            mode: m.mode() & 0o7777,
            nlink: m.nlink(),
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev(),
            atime: (m.atime(), m.atime_nsec()),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }

    pub fn is_file(&self) -> bool {
        self.kind == Kind::File
    }

    /// The version a cache entry of this file is keyed by (as [`crate::core::version_of`]).
    pub fn version(&self) -> Version {
        crate::core::version_at(self.size, self.mtime)
    }
}
