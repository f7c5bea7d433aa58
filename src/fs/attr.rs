//! What the kernel is told about a file: its kind and attributes, from the backing tree, a
//! file being written here, or a produced name.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Error;
use super::write::Staged;
use crate::backing::Meta;
use crate::core::names::Name;
use crate::core::sync::lock;
use crate::core::{Kind, Version};

fn time_of_ns(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// The object of a name a reader opens before it is produced (`--wait`), or of a directory
/// on its way: a placeholder in this node's inode table only, never published (no object's
/// key looks like it).
pub(super) const PENDING: &str = "//pending";

/// Attributes of a node, as the kernel will see them.
#[derive(Debug, Clone, Copy)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// A device node's number.
    pub rdev: u32,
    pub version: Version,
    /// Written under the mount (not in the backing tree): other nodes may change it.
    pub produced: bool,
    /// A name not produced yet that a reader opens (`--wait`): its open waits for it.
    pub pending: bool,
}

impl Attr {
    /// The I/O size readers are told (`st_blksize`): a MiB for a large file, so that buffered
    /// readers (Python's `open`, stdio) read it a MiB at a time. While it is filled by pages it
    /// is opened for direct I/O (see `Opened::direct`), where each read is a request to the
    /// daemon: with 4 KiB, Python's 8 KiB reads of a cold 1 GiB file took 3x the page cache's
    /// time. A smaller file is told its size (a power of two, 4-128 KiB: Python allocates a
    /// buffer of that size per open): a reader's first read then asks for the whole sample,
    /// the kernel reads it ahead whole in one READ (its readahead starts at the request's size,
    /// up to 128 KiB), and the seeks of np.load in an .npz find it in the page cache, where 4
    /// KiB made the first read's readahead 16 KiB and each seek past it another READ.
    pub fn blksize(&self) -> u32 {
        match self.kind {
            Kind::File if self.size > crate::fill::WHOLE_FILE_MAX => 1 << 20,
            Kind::File => self.size.next_power_of_two().clamp(4096, 128 << 10) as u32,
            _ => 4096,
        }
    }

    pub(super) fn from_meta(ino: u64, meta: &Meta) -> Attr {
        let kind = meta.kind;
        let time = |(s, ns): (i64, i64)| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
        Attr {
            ino,
            kind,
            size: meta.size,
            blocks: meta.blocks,
            atime: time(meta.atime),
            mtime: time(meta.mtime),
            ctime: time(meta.ctime),
            // Backing files are read-only: drop their write bits so tools do not try and fail.
            // Directories take new (produced) files.
            perm: if kind == Kind::Dir {
                (meta.mode & 0o7777) as u16
            } else {
                (meta.mode & 0o7555) as u16
            },
            nlink: meta.nlink as u32,
            uid: meta.uid,
            gid: meta.gid,
            rdev: meta.rdev as u32,
            version: meta.version(),
            produced: false,
            pending: false,
        }
    }

    /// Whether `who` may `want` (a mask of 4 read, 2 write, 1 search/execute) this file, as
    /// `default_permissions` has the kernel decide on these attributes: the owner's, the
    /// group's or the others' bits, the first class `who` is in; root may read and search
    /// anything.
    pub fn allows(&self, who: &super::caller::Credentials, want: u16) -> bool {
        if who.uid == 0 {
            return true;
        }
        let class = if who.uid == self.uid {
            self.perm >> 6
        } else if who.in_group(self.gid) {
            self.perm >> 3
        } else {
            self.perm
        };
        class & want & 7 == want
    }

    /// A backing entry's attributes: its mode bits as far as its ACL allows them.
    pub(super) fn from_backing(ino: u64, b: &crate::backing::BackingStat) -> Attr {
        let mut a = Attr::from_meta(ino, &b.meta);
        a.perm &= b.allowed;
        a
    }

    pub(super) fn from_staged(ino: u64, s: &Staged) -> Result<Attr, Error> {
        let meta = s.file.metadata().map_err(Error::Write)?;
        let mut a = Attr::from_meta(ino, &Meta::of(&meta));
        let set = lock(&s.set);
        a.perm = set.mode as u16;
        (a.uid, a.gid) = set.owner;
        if let Some(t) = set.atime_ns {
            a.atime = time_of_ns(t);
        }
        if let Some(t) = set.mtime_ns {
            a.mtime = time_of_ns(t);
        }
        if let Some(t) = set.ctime_ns {
            a.ctime = time_of_ns(t);
        }
        a.produced = true;
        Ok(a)
    }

    pub(super) fn from_name(ino: u64, n: &Name) -> Attr {
        let kind = Kind::of_name(n);
        let size = match kind {
            Kind::Symlink => n.meta.target.len() as u64,
            _ => n.size,
        };
        Attr {
            ino,
            kind,
            size,
            blocks: size.div_ceil(512),
            atime: time_of_ns(n.atime()),
            mtime: time_of_ns(n.mtime()),
            ctime: time_of_ns(n.ctime()),
            perm: (n.mode & 0o7777) as u16,
            nlink: if n.dir { 2 } else { n.meta.nlink.max(1) },
            uid: n.uid,
            gid: n.gid,
            rdev: n.meta.rdev as u32,
            version: Version {
                size: n.size,
                mtime_ns: n.mtime_ns,
            },
            produced: true,
            pending: n.object == PENDING,
        }
    }
}

/// A time `setattr` sets: now (`UTIME_NOW`, `touch`) or a given one, in ns since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(i64),
}

impl TimeSet {
    pub fn at(self, now: i64) -> i64 {
        match self {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        }
    }
}

/// What a `setattr` changes (`None`: left as it is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        *self == Changes::default()
    }
}
