//! A request from a ring entry, decoded and handed to the same handlers fuser's requests go to
//! (`ops.rs`), with a reply into the entry. Every length and field from the kernel is checked:
//! a short or malformed request is answered EINVAL, an opcode not handled ENOSYS (as fuser).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::abi::{self, Reader};
use super::queue::{Arrived, Buffers, Completion};
use super::reply::RingReply;
use crate::core::source::Source;
use crate::fs::{Changes, TimeSet};
use crate::fuse::ops::{Caller, Ops};
use crate::fuse::reply::{EmptyReply, Fail};

pub fn handle<S: Source>(
    ops: &Arc<Ops<S>>,
    a: Arrived<'_>,
    buffers: Arc<Buffers>,
    done: Completion,
) {
    let h = a.header;
    // SAFETY: the names are copied out before any reply exists; written bytes (WRITE) are
    // borrowed only by a reply written aside (`direct` false), never over them.
    let payload = unsafe { a.payload() };
    let limit = usize::MAX;
    // One reply per request: the arm that answers takes it; a malformed request leaves it.
    let mut slot = Some(done);
    let mut reply = |direct: bool, limit: usize| {
        let done = slot.take().expect("one reply per request");
        let reply = RingReply::new(buffers.clone(), done, direct, limit);
        crate::fuse::running::Counted::new(reply, ops.running())
    };
    let c = Caller {
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    };
    let ino = h.nodeid;
    if !sent_without_caller(h.opcode) && !ops.access().permits(h.uid) {
        return reply(true, limit).error(libc::EACCES);
    }
    let mut op = Reader(a.op_in);
    let mut names = Reader(payload);
    let mut name = || names.name().map(|n| OsStr::from_bytes(n).to_os_string());
    let handled = (|| -> Option<()> {
        match h.opcode {
            abi::LOOKUP => ops.lookup(c, ino, &name()?, reply(true, limit)),
            abi::GETATTR => ops.getattr(ino, reply(true, limit)),
            abi::SETATTR => ops.setattr(ino, &changes(&mut op)?, reply(true, limit)),
            abi::READLINK => ops.readlink(ino, reply(true, limit)),
            abi::SYMLINK => {
                let (link, target) = (name()?, name()?);
                let target = std::path::PathBuf::from(target);
                ops.symlink(c, ino, &link, &target, reply(true, limit))
            }
            abi::MKNOD => {
                let (mode, rdev, umask) = (op.u32()?, op.u32()?, op.u32()?);
                ops.mknod(c, ino, &name()?, mode, umask, rdev, reply(true, limit))
            }
            abi::MKDIR => {
                let (mode, umask) = (op.u32()?, op.u32()?);
                ops.mkdir(c, ino, &name()?, mode, umask, reply(true, limit))
            }
            abi::UNLINK => ops.unlink(ino, &name()?, reply(true, limit)),
            abi::RMDIR => ops.rmdir(ino, &name()?, reply(true, limit)),
            abi::RENAME | abi::RENAME2 => {
                let newdir = op.u64()?;
                let flags = if h.opcode == abi::RENAME2 {
                    op.u32()?
                } else {
                    0
                };
                let (from, to): (OsString, OsString) = (name()?, name()?);
                ops.rename(ino, &from, newdir, &to, flags, reply(true, limit))
            }
            abi::LINK => {
                let old = op.u64()?;
                ops.link(old, ino, &name()?, reply(true, limit))
            }
            abi::OPEN => ops.open(c, ino, op.u32()? as i32, reply(true, limit)),
            abi::READ => {
                let (fh, offset, size) = (op.u64()?, op.u64()?, op.u32()?);
                ops.read(ino, fh, offset, size, reply(true, size as usize))
            }
            abi::WRITE => {
                let (fh, offset, size) = (op.u64()?, op.u64()?, op.u32()?);
                let data = payload.get(..size as usize)?;
                ops.write(fh, offset, data, reply(false, limit))
            }
            abi::STATFS => ops.statfs(reply(true, limit)),
            abi::RELEASE => ops.release(ino, op.u64()?, reply(true, limit)),
            abi::FSYNC => ops.fsync(op.u64()?, reply(true, limit)),
            abi::GETXATTR => {
                let size = op.u32()?;
                ops.getxattr(c, ino, &name()?, size, reply(true, limit))
            }
            abi::LISTXATTR => ops.listxattr(op.u32()?, reply(true, limit)),
            abi::FLUSH => ops.flush(c, ino, op.u64()?, reply(true, limit)),
            abi::OPENDIR => ops.opendir(c, ino, reply(true, limit)),
            abi::READDIR | abi::READDIRPLUS => {
                let (fh, offset, size) = (op.u64()?, op.u64()?, op.u32()?);
                let page = reply(true, size as usize);
                if h.opcode == abi::READDIR {
                    ops.readdir(ino, fh, offset, page)
                } else {
                    ops.readdirplus(ino, fh, offset, page)
                }
            }
            abi::RELEASEDIR => ops.releasedir(op.u64()?, reply(true, limit)),
            abi::CREATE => {
                let (flags, mode, umask) = (op.u32()?, op.u32()?, op.u32()?);
                let n = name()?;
                ops.create(c, ino, &n, mode, umask, flags as i32, reply(true, limit))
            }
            abi::DESTROY => reply(true, limit).ok(),
            other => {
                tracing::debug!(opcode = other, "not handled on the ring");
                reply(true, limit).error(libc::ENOSYS)
            }
        }
        Some(())
    })();
    if handled.is_none() {
        tracing::warn!(opcode = h.opcode, "a malformed request on the ring");
        if let Some(done) = slot.take() {
            RingReply::new(buffers, done, true, 0).error(libc::EINVAL);
        }
    }
}

/// As fuser on /dev/fuse: a user the mount's options do not name is turned away, but for the
/// requests the kernel may send without the caller's uid (on a file already open).
fn sent_without_caller(opcode: u32) -> bool {
    matches!(
        opcode,
        abi::READ
            | abi::READDIR
            | abi::READDIRPLUS
            | abi::WRITE
            | abi::FSYNC
            | abi::FSYNCDIR
            | abi::RELEASE
            | abi::RELEASEDIR
            | abi::DESTROY
    )
}

/// `fuse_setattr_in` as the core's changes.
fn changes(op: &mut Reader) -> Option<Changes> {
    let valid = op.u32()?;
    op.skip(4 + 8)?; // padding, fh
    let size = op.u64()?;
    op.skip(8)?; // lock_owner
    let (atime, mtime) = (op.u64()?, op.u64()?);
    op.skip(8)?; // ctime
    let (atimensec, mtimensec) = (op.u32()?, op.u32()?);
    op.skip(4)?; // ctimensec
    let mode = op.u32()?;
    op.skip(4)?;
    let (uid, gid) = (op.u32()?, op.u32()?);
    let has = |bit: u32| valid & bit != 0;
    let time = |set: u32, now: u32, secs: u64, nsec: u32| {
        has(set).then(|| {
            if has(now) {
                TimeSet::Now
            } else {
                TimeSet::At((secs as i64).saturating_mul(1_000_000_000) + i64::from(nsec))
            }
        })
    };
    Some(Changes {
        mode: has(abi::FATTR_MODE).then_some(mode),
        uid: has(abi::FATTR_UID).then_some(uid),
        gid: has(abi::FATTR_GID).then_some(gid),
        size: has(abi::FATTR_SIZE).then_some(size),
        atime: time(abi::FATTR_ATIME, abi::FATTR_ATIME_NOW, atime, atimensec),
        mtime: time(abi::FATTR_MTIME, abi::FATTR_MTIME_NOW, mtime, mtimensec),
    })
}
