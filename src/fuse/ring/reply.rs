//! A ring entry's reply: the answer's arguments written into the entry's payload buffer (or
//! aside, for requests whose own arguments are still read from it), then handed back to the
//! ring thread, which writes the header and commits.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Duration;

use super::abi::{self, Writer};
use super::queue::{Buffers, Completion, Done};
use crate::core::Kind;
use crate::fs::Attr;
use crate::fuse::passthrough::Passthrough;
use crate::fuse::reply::{
    AttrReply, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply, Fail,
    OpenReply, StatfsReply, WriteReply, XattrReply,
};

pub struct RingReply {
    buffers: Arc<Buffers>,
    done: Completion,
    /// The arguments go straight into the payload buffer (the request's payload is not read).
    direct: bool,
    /// A listing's page: bytes written so far, and the most the kernel asked for.
    len: usize,
    limit: usize,
}

impl RingReply {
    /// A reply to a request in `buffers`; `direct`: the request's payload is not read, so
    /// the reply may be written over it; `limit`: the largest reply the kernel takes.
    pub fn new(buffers: Arc<Buffers>, done: Completion, direct: bool, limit: usize) -> Self {
        RingReply {
            buffers,
            done,
            direct,
            len: 0,
            limit,
        }
    }

    /// Sends a reply of `size` bytes of arguments that `write` produces.
    fn send(self, size: usize, write: impl FnOnce(&mut Writer) -> Option<()>) {
        if self.direct {
            // SAFETY: this reply holds the entry and the request's payload is not read (see
            // `direct`): the payload buffer is this reply's alone until it is done.
            let payload = unsafe { self.buffers.payload() };
            let mut w = Writer::new(payload);
            let done = match write(&mut w) {
                Some(()) => ok(w.len, None),
                None => failed(libc::EIO),
            };
            self.done.finish(done);
        } else {
            let mut scratch = vec![0u8; size];
            let mut w = Writer::new(&mut scratch);
            let done = match write(&mut w) {
                Some(()) => {
                    let len = w.len;
                    ok(len, Some(scratch))
                }
                None => failed(libc::EIO),
            };
            self.done.finish(done);
        }
    }

    /// The listing page's writer.
    fn page(&mut self) -> Writer<'_> {
        // SAFETY: listings are direct replies (a READDIR's payload is not read): the payload
        // buffer is this reply's until it is done.
        let payload = unsafe { self.buffers.payload() };
        let end = self.limit.min(payload.len());
        let mut w = Writer::new(&mut payload[..end]);
        w.len = self.len;
        w
    }
}

fn ok(len: usize, scratch: Option<Vec<u8>>) -> Done {
    Done {
        error: 0,
        len,
        scratch,
    }
}

fn failed(errno: i32) -> Done {
    Done {
        error: -errno,
        len: 0,
        scratch: None,
    }
}

impl Fail for RingReply {
    fn error(self, errno: i32) {
        self.done.finish(failed(errno));
    }

    fn may_leave(&self) -> bool {
        self.done.may_leave()
    }
}

impl EntryReply for RingReply {
    fn entry(self, attr: &Attr, ttl: Duration) {
        self.send(128, |w| abi::entry_out(w, attr, ttl));
    }
}

impl AttrReply for RingReply {
    fn attr(self, attr: &Attr, ttl: Duration) {
        self.send(104, |w| abi::attr_out(w, attr, ttl));
    }
}

impl DataReply for RingReply {
    fn data(self, bytes: &[u8]) {
        let n = bytes.len().min(self.limit);
        self.send(n, |w| w.bytes(&bytes[..n]));
    }
}

impl OpenReply for RingReply {
    fn opened(self, fh: u64, flags: u32) {
        self.send(16, |w| abi::open_out(w, fh, flags, 0));
    }

    fn opened_passthrough(self, fh: u64, flags: u32, file: &Passthrough) {
        let flags = flags | abi::FOPEN_PASSTHROUGH;
        self.send(16, |w| abi::open_out(w, fh, flags, file.id()));
    }
}

impl CreateReply for RingReply {
    fn created(self, attr: &Attr, ttl: Duration, fh: u64, flags: u32) {
        self.send(144, |w| {
            abi::entry_out(w, attr, ttl)?;
            abi::open_out(w, fh, flags, 0)
        });
    }
}

impl WriteReply for RingReply {
    fn written(self, n: u32) {
        self.send(8, |w| {
            w.u32(n)?;
            w.u32(0)
        });
    }
}

impl EmptyReply for RingReply {
    fn ok(self) {
        self.done.finish(ok(0, None));
    }
}

impl StatfsReply for RingReply {
    fn statfs(self, s: &libc::statvfs) {
        self.send(80, |w| abi::statfs_out(w, s));
    }
}

impl XattrReply for RingReply {
    fn xattr_size(self, n: u32) {
        self.send(8, |w| {
            w.u32(n)?;
            w.u32(0)
        });
    }

    fn xattr_data(self, bytes: &[u8]) {
        self.send(bytes.len(), |w| w.bytes(bytes));
    }
}

impl DirReply for RingReply {
    fn add(&mut self, ino: u64, next: u64, kind: Kind, name: &OsStr) -> bool {
        let mut w = self.page();
        let full = abi::dirent(&mut w, ino, next, kind, name.as_bytes()).is_none();
        self.len = w.len;
        full
    }

    fn done(self) {
        let len = self.len;
        self.done.finish(ok(len, None));
    }
}

impl DirPlusReply for RingReply {
    fn add_plus(&mut self, attr: &Attr, ttl: Duration, next: u64, name: &OsStr) -> bool {
        let mut w = self.page();
        let full = abi::direntplus(&mut w, attr, ttl, next, name.as_bytes()).is_none();
        self.len = w.len;
        full
    }

    fn done_plus(self) {
        let len = self.len;
        self.done.finish(ok(len, None));
    }
}
