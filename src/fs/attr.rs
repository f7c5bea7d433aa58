//! What the kernel is told about a file: its kind and attributes, from the backing tree, a
//! file being written here, or a produced name.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Error;
use super::write::Staged;
use crate::core::Version;
use crate::core::names::Name;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    pub(super) fn of(ft: std::fs::FileType) -> Kind {
        if ft.is_file() {
            Kind::File
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_symlink() {
            Kind::Symlink
        } else {
            Kind::Other
        }
    }
}

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
    pub version: Version,
    /// Written under the mount (not in the backing tree): other nodes may change it.
    pub produced: bool,
}

impl Attr {
    pub(super) fn from_meta(ino: u64, meta: &Metadata) -> Attr {
        let kind = Kind::of(meta.file_type());
        let time = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
        Attr {
            ino,
            kind,
            size: meta.len(),
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            // Backing files are read-only: drop their write bits so tools do not try and fail.
            // Directories take new (produced) files.
            perm: if kind == Kind::Dir {
                (meta.mode() & 0o7777) as u16
            } else {
                (meta.mode() & 0o7555) as u16
            },
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            version: crate::core::version_of(meta),
            produced: false,
        }
    }

    pub(super) fn from_staged(ino: u64, s: &Staged) -> Result<Attr, Error> {
        let meta = s.file.metadata().map_err(Error::Write)?;
        let mut a = Attr::from_meta(ino, &meta);
        a.perm = s.mode.load(Ordering::Relaxed) as u16;
        (a.uid, a.gid) = s.owner;
        a.produced = true;
        Ok(a)
    }

    pub(super) fn from_name(ino: u64, n: &Name) -> Attr {
        let t = UNIX_EPOCH + Duration::from_nanos(n.mtime_ns.max(0) as u64);
        Attr {
            ino,
            kind: if n.dir { Kind::Dir } else { Kind::File },
            size: n.size,
            blocks: n.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            perm: (n.mode & 0o7777) as u16,
            nlink: if n.dir { 2 } else { 1 },
            uid: n.uid,
            gid: n.gid,
            version: Version {
                size: n.size,
                mtime_ns: n.mtime_ns,
            },
            produced: true,
        }
    }
}
