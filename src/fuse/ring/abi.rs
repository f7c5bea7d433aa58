//! The kernel's FUSE structures as the ring carries them (include/uapi/linux/fuse.h, protocol
//! 7.42): a request's header and arguments read from the entry's buffers, a reply's arguments
//! written into them. Plain little-endian byte layouts, read and written field by field: no
//! transmutes, and every length from the kernel checked before it is used.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::core::Kind;
use crate::fs::Attr;

// Opcodes (enum fuse_opcode).
pub const LOOKUP: u32 = 1;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const READLINK: u32 = 5;
pub const SYMLINK: u32 = 6;
pub const MKNOD: u32 = 8;
pub const MKDIR: u32 = 9;
pub const UNLINK: u32 = 10;
pub const RMDIR: u32 = 11;
pub const RENAME: u32 = 12;
pub const LINK: u32 = 13;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const GETXATTR: u32 = 22;
pub const LISTXATTR: u32 = 23;
pub const FLUSH: u32 = 25;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const CREATE: u32 = 35;
pub const DESTROY: u32 = 38;
pub const READDIRPLUS: u32 = 44;
pub const RENAME2: u32 = 45;

// setattr's `valid` bits.
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;

/// An open reply's flag: reads and writes go to the backing file named by `backing_id`.
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;

/// The entry's header buffer: `in_out` (the request's `fuse_in_header`, the reply's
/// `fuse_out_header`), `op_in` (the request's first argument, its per-op header), then
/// `fuse_uring_ent_in_out`.
pub const IN_OUT: usize = 0;
pub const OP_IN: usize = 128;
pub const ENT_IN_OUT: usize = 256;
pub const HEADER_BYTES: usize = 256 + 32;

/// `fuse_uring_cmd_req` in the SQE's command area: flags, commit_id, qid.
pub fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

/// The first 40 bytes of a request: `fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        let mut r = Reader(b.get(..40)?);
        let _len = r.u32()?;
        Some(InHeader {
            opcode: r.u32()?,
            unique: r.u64()?,
            nodeid: r.u64()?,
            uid: r.u32()?,
            gid: r.u32()?,
            pid: r.u32()?,
        })
    }
}

/// The reply's `fuse_out_header` (its length is the ring's `payload_sz`, not this field's).
pub fn out_header(buf: &mut [u8], unique: u64, error: i32) {
    buf[..4].copy_from_slice(&16u32.to_le_bytes());
    buf[4..8].copy_from_slice(&error.to_le_bytes());
    buf[8..16].copy_from_slice(&unique.to_le_bytes());
}

/// `fuse_uring_ent_in_out`'s `commit_id` and `payload_sz`, as the kernel wrote them.
pub fn ent_in_out(b: &[u8]) -> Option<(u64, u32)> {
    let mut r = Reader(b.get(..32)?);
    let _flags = r.u64()?;
    Some((r.u64()?, r.u32()?))
}

/// Sets `fuse_uring_ent_in_out.payload_sz`: how many bytes of the payload the reply holds.
pub fn set_payload_sz(header: &mut [u8], n: u32) {
    header[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&n.to_le_bytes());
}

/// Little-endian fields in order, each read only if it is all there.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    pub fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    /// A NUL-terminated name (the NUL consumed, not returned).
    pub fn name(&mut self) -> Option<&'a [u8]> {
        let end = self.0.iter().position(|&c| c == 0)?;
        let name = self.take(end)?;
        self.skip(1)?;
        Some(name)
    }
}

/// A reply's arguments, appended to the payload buffer; `None` once they would not fit.
pub struct Writer<'a> {
    pub buf: &'a mut [u8],
    pub len: usize,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut [u8]) -> Writer<'a> {
        Writer { buf, len: 0 }
    }
    pub fn bytes(&mut self, b: &[u8]) -> Option<()> {
        let end = self.len.checked_add(b.len())?;
        self.buf.get_mut(self.len..end)?.copy_from_slice(b);
        self.len = end;
        Some(())
    }
    pub fn u32(&mut self, v: u32) -> Option<()> {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> Option<()> {
        self.bytes(&v.to_le_bytes())
    }
    pub fn room(&self) -> usize {
        self.buf.len() - self.len
    }
}

/// Seconds and nanoseconds since the epoch (before it: clamped to it, as `stat` shows).
fn secs(t: SystemTime) -> (u64, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

/// The kind bits of `st_mode`.
pub fn mode_kind(k: Kind) -> u32 {
    match k {
        Kind::File => libc::S_IFREG,
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Char => libc::S_IFCHR,
        Kind::Block => libc::S_IFBLK,
        Kind::Socket => libc::S_IFSOCK,
    }
}

/// `fuse_attr` (88 bytes).
pub fn attr(w: &mut Writer, a: &Attr) -> Option<()> {
    let (at, atn) = secs(a.atime);
    let (mt, mtn) = secs(a.mtime);
    let (ct, ctn) = secs(a.ctime);
    w.u64(a.ino)?;
    w.u64(a.size)?;
    w.u64(a.blocks)?;
    w.u64(at)?;
    w.u64(mt)?;
    w.u64(ct)?;
    w.u32(atn)?;
    w.u32(mtn)?;
    w.u32(ctn)?;
    w.u32(mode_kind(a.kind) | u32::from(a.perm))?;
    w.u32(a.nlink)?;
    w.u32(a.uid)?;
    w.u32(a.gid)?;
    w.u32(a.rdev)?;
    w.u32(a.blksize())?;
    w.u32(0) // flags
}

/// `fuse_entry_out` (128 bytes): the name's inode, its validity and attributes.
pub fn entry_out(w: &mut Writer, a: &Attr, ttl: Duration) -> Option<()> {
    w.u64(a.ino)?;
    w.u64(0)?; // generation
    w.u64(ttl.as_secs())?;
    w.u64(ttl.as_secs())?;
    w.u32(ttl.subsec_nanos())?;
    w.u32(ttl.subsec_nanos())?;
    attr(w, a)
}

/// `fuse_attr_out` (104 bytes).
pub fn attr_out(w: &mut Writer, a: &Attr, ttl: Duration) -> Option<()> {
    w.u64(ttl.as_secs())?;
    w.u32(ttl.subsec_nanos())?;
    w.u32(0)?;
    attr(w, a)
}

/// `fuse_open_out` (16 bytes).
pub fn open_out(w: &mut Writer, fh: u64, flags: u32, backing_id: u32) -> Option<()> {
    w.u64(fh)?;
    w.u32(flags)?;
    w.u32(backing_id)
}

/// One `fuse_dirent` (padded to 8 bytes); `None` if it does not fit.
pub fn dirent(w: &mut Writer, ino: u64, next: u64, kind: Kind, name: &[u8]) -> Option<()> {
    let len = 24 + name.len();
    let padded = len.next_multiple_of(8);
    if w.room() < padded {
        return None;
    }
    w.u64(ino)?;
    w.u64(next)?;
    w.u32(name.len() as u32)?;
    w.u32(mode_kind(kind) >> 12)?;
    w.bytes(name)?;
    w.bytes(&[0u8; 8][..padded - len])
}

/// One `fuse_direntplus`: an entry reply and a dirent; `None` if it does not fit.
pub fn direntplus(w: &mut Writer, a: &Attr, ttl: Duration, next: u64, name: &[u8]) -> Option<()> {
    let padded = (24 + name.len()).next_multiple_of(8);
    if w.room() < 128 + padded {
        return None;
    }
    entry_out(w, a, ttl)?;
    dirent(w, a.ino, next, a.kind, name)
}

/// `fuse_kstatfs` in `fuse_statfs_out` (80 bytes).
pub fn statfs_out(w: &mut Writer, s: &libc::statvfs) -> Option<()> {
    w.u64(s.f_blocks)?;
    w.u64(s.f_bfree)?;
    w.u64(s.f_bavail)?;
    w.u64(s.f_files)?;
    w.u64(s.f_ffree)?;
    w.u32(s.f_bsize as u32)?;
    w.u32(s.f_namemax as u32)?;
    w.u32(s.f_frsize as u32)?;
    w.u32(0)?;
    w.bytes(&[0u8; 24])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Version;

    fn a() -> Attr {
        Attr {
            ino: 7,
            kind: Kind::File,
            size: 5,
            blocks: 1,
            atime: UNIX_EPOCH + Duration::new(1, 2),
            mtime: UNIX_EPOCH + Duration::new(3, 4),
            ctime: UNIX_EPOCH + Duration::new(5, 6),
            perm: 0o644,
            nlink: 1,
            uid: 10,
            gid: 20,
            rdev: 0,
            version: Version {
                size: 5,
                mtime_ns: 3,
            },
            produced: false,
            pending: false,
        }
    }

    #[test]
    fn replies_have_the_kernels_sizes_and_fields() {
        let mut buf = [0u8; 512];
        let mut w = Writer::new(&mut buf);
        entry_out(&mut w, &a(), Duration::new(1, 500)).unwrap();
        assert_eq!(w.len, 128);
        let mut r = Reader(&buf[..128]);
        assert_eq!(r.u64(), Some(7)); // nodeid
        r.skip(8 + 8 + 8 + 4 + 4).unwrap();
        assert_eq!(r.u64(), Some(7)); // attr.ino
        assert_eq!(r.u64(), Some(5)); // attr.size
        r.skip(8 + 8 * 3 + 4 * 3).unwrap();
        assert_eq!(r.u32(), Some(libc::S_IFREG | 0o644));
        let mut w = Writer::new(&mut buf);
        attr_out(&mut w, &a(), Duration::ZERO).unwrap();
        assert_eq!(w.len, 104);
        let mut w = Writer::new(&mut buf);
        open_out(&mut w, 9, FOPEN_PASSTHROUGH, 3).unwrap();
        assert_eq!(w.len, 16);
    }

    #[test]
    fn dirents_are_padded_and_refused_when_full() {
        let mut buf = [0u8; 64];
        let mut w = Writer::new(&mut buf);
        dirent(&mut w, 1, 1, Kind::Dir, b".").unwrap();
        assert_eq!(w.len, 32);
        assert!(dirent(&mut w, 2, 2, Kind::File, b"abcdefghi").is_none());
        assert_eq!(w.len, 32, "a refused entry writes nothing");
    }

    #[test]
    fn a_short_header_or_name_is_refused() {
        assert_eq!(InHeader::parse(&[0u8; 39]), None);
        let mut r = Reader(b"abc");
        assert_eq!(r.name(), None, "no NUL");
        let mut r = Reader(b"a\0b\0");
        assert_eq!(r.name(), Some(&b"a"[..]));
        assert_eq!(r.name(), Some(&b"b"[..]));
    }
}
