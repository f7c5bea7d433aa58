//! The core's attributes, kinds and times as fuser's types.

use std::time::UNIX_EPOCH;

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};

use crate::core::Kind;
use crate::fs::{Attr, TimeSet};

pub(super) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: UNIX_EPOCH,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize(),
        flags: 0,
    }
}

pub(super) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i64,
            Err(e) => -(e.duration().as_nanos() as i64),
        }),
    }
}

pub(super) fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Char => FileType::CharDevice,
        Kind::Block => FileType::BlockDevice,
        Kind::Socket => FileType::Socket,
    }
}
