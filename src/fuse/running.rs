//! Requests taken from the kernel and not yet answered, whichever transport brought them and
//! whichever thread answers (a waiting open, a flush finished elsewhere, a prefetch list): each
//! reply is wrapped in [`Counted`], which counts from the request's arrival until its reply is
//! made or dropped. A stop signal exits at once when none is running, whatever files are still
//! held open on the detached mount (it waited 5 s and logged an error before).

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::passthrough::Passthrough;
use super::reply::*;
use crate::core::Kind;
use crate::fs::Attr;

/// The count of requests running.
#[derive(Default)]
pub struct Running(AtomicUsize);

impl Running {
    pub fn now(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// A reply counted in [`Running`] until it is made or dropped.
pub struct Counted<R> {
    reply: R,
    _taken: Taken,
}

/// One request's place in the count.
struct Taken(Arc<Running>);

impl Drop for Taken {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<R> Counted<R> {
    pub fn new(reply: R, running: &Arc<Running>) -> Counted<R> {
        running.0.fetch_add(1, Ordering::AcqRel);
        Counted {
            reply,
            _taken: Taken(running.clone()),
        }
    }
}

impl<R: Fail> Fail for Counted<R> {
    fn error(self, errno: i32) {
        self.reply.error(errno)
    }
    fn may_leave(&self) -> bool {
        self.reply.may_leave()
    }
}

impl<R: EntryReply> EntryReply for Counted<R> {
    fn entry(self, attr: &Attr, ttl: Duration) {
        self.reply.entry(attr, ttl)
    }
}

impl<R: AttrReply> AttrReply for Counted<R> {
    fn attr(self, attr: &Attr, ttl: Duration) {
        self.reply.attr(attr, ttl)
    }
}

impl<R: DataReply> DataReply for Counted<R> {
    fn data(self, bytes: &[u8]) {
        self.reply.data(bytes)
    }
}

impl<R: OpenReply> OpenReply for Counted<R> {
    fn opened(self, fh: u64, flags: u32) {
        self.reply.opened(fh, flags)
    }
    fn opened_passthrough(self, fh: u64, flags: u32, file: &Passthrough) {
        self.reply.opened_passthrough(fh, flags, file)
    }
}

impl<R: CreateReply> CreateReply for Counted<R> {
    fn created(self, attr: &Attr, ttl: Duration, fh: u64, flags: u32) {
        self.reply.created(attr, ttl, fh, flags)
    }
}

impl<R: WriteReply> WriteReply for Counted<R> {
    fn written(self, n: u32) {
        self.reply.written(n)
    }
}

impl<R: EmptyReply> EmptyReply for Counted<R> {
    fn ok(self) {
        self.reply.ok()
    }
}

impl<R: StatfsReply> StatfsReply for Counted<R> {
    fn statfs(self, s: &libc::statvfs) {
        self.reply.statfs(s)
    }
}

impl<R: XattrReply> XattrReply for Counted<R> {
    fn xattr_size(self, n: u32) {
        self.reply.xattr_size(n)
    }
    fn xattr_data(self, bytes: &[u8]) {
        self.reply.xattr_data(bytes)
    }
}

impl<R: DirReply> DirReply for Counted<R> {
    fn add(&mut self, ino: u64, next: u64, kind: Kind, name: &OsStr) -> bool {
        self.reply.add(ino, next, kind, name)
    }
    fn done(self) {
        self.reply.done()
    }
}

impl<R: DirPlusReply> DirPlusReply for Counted<R> {
    fn add_plus(&mut self, attr: &Attr, ttl: Duration, next: u64, name: &OsStr) -> bool {
        self.reply.add_plus(attr, ttl, next, name)
    }
    fn done_plus(self) {
        self.reply.done_plus()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;
    impl Fail for Nothing {
        fn error(self, _: i32) {}
    }
    impl EmptyReply for Nothing {
        fn ok(self) {}
    }

    #[test]
    fn a_request_counts_until_its_reply_is_made_or_dropped() {
        let running = Arc::new(Running::default());
        let (a, b) = (
            Counted::new(Nothing, &running),
            Counted::new(Nothing, &running),
        );
        assert_eq!(running.now(), 2);
        a.ok();
        assert_eq!(running.now(), 1);
        drop(b);
        assert_eq!(running.now(), 0);
    }
}
