//! How an answer leaves, whichever transport the request came by: one small trait per kind of
//! reply, implemented by fuser's reply objects (`dev.rs`) and by a ring entry's reply
//! (`ring/reply.rs`). The handlers in `ops.rs` are written once against them.

use std::ffi::OsStr;
use std::time::Duration;

use super::passthrough::Passthrough;
use crate::core::Kind;
use crate::fs::Attr;

/// Every reply can fail; a reply may be sent from another thread than the request's.
pub trait Fail: Send + 'static {
    /// Answers with `errno` (positive).
    fn error(self, errno: i32);

    /// Whether this reply may be made later on another thread. A ring entry's reply holds its
    /// entry until then, and a ring thread lets only so many go (see `ring::queue::AWAY`).
    fn may_leave(&self) -> bool {
        true
    }
}

pub trait EntryReply: Fail {
    fn entry(self, attr: &Attr, ttl: Duration);
}

pub trait AttrReply: Fail {
    fn attr(self, attr: &Attr, ttl: Duration);
}

pub trait DataReply: Fail {
    fn data(self, bytes: &[u8]);
}

pub trait OpenReply: Fail {
    /// `flags`: FOPEN_* bits.
    fn opened(self, fh: u64, flags: u32);
    /// Reads and writes of this open go to `backing` in the kernel.
    fn opened_passthrough(self, fh: u64, flags: u32, file: &Passthrough);
}

pub trait CreateReply: Fail {
    fn created(self, attr: &Attr, ttl: Duration, fh: u64, flags: u32);
}

pub trait WriteReply: Fail {
    fn written(self, n: u32);
}

pub trait EmptyReply: Fail {
    fn ok(self);
}

pub trait StatfsReply: Fail {
    fn statfs(self, s: &libc::statvfs);
}

pub trait XattrReply: Fail {
    /// The value's size (the caller asked with a zero-sized buffer).
    fn xattr_size(self, n: u32);
    fn xattr_data(self, bytes: &[u8]);
}

/// A page of a directory listing.
pub trait DirReply: Fail {
    /// Adds an entry; `true` when it did not fit (the page is full, the entry not in it).
    fn add(&mut self, ino: u64, next: u64, kind: Kind, name: &OsStr) -> bool;
    fn done(self);
}

/// A page of a listing with each entry's attributes (each one a lookup the kernel counts).
pub trait DirPlusReply: Fail {
    /// As [`DirReply::add`].
    fn add_plus(&mut self, attr: &Attr, ttl: Duration, next: u64, name: &OsStr) -> bool;
    fn done_plus(self);
}
