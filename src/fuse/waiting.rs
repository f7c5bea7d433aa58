//! Opens that wait for a produced name (`--wait`): admitted within their bounds
//! ([`Waiters`], and over io_uring the ring queue's share), then left to `fs::waits`, which
//! replies from one of its few threads once the name is published or the wait is over.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::admission::Waiters;
use super::ops::{Caller, Ops};
use super::reply::OpenReply;
use crate::core::source::Source;
use crate::fs::Error;
use crate::fs::caller::Context;

impl<S: Source> Ops<S> {
    /// Waits (`--wait`) for a pending name to be produced holding no thread (see `fs::waits`),
    /// then opens it and replies from one of the mount's few waiting threads: a request thread
    /// held by each waiting consumer would stop every other request of the mount once there are
    /// as many consumers as threads. Past `--max-waits-per-user` waits of caller `c.uid`
    /// ([`Waiters::total`] of all users, and over io_uring a share of its queue's entries: see
    /// `ring::queue::Away`), the open fails at once (ENOENT), as without `--wait`.
    pub(super) fn open_when_produced(
        self: &Arc<Self>,
        c: Caller,
        ino: u64,
        flags: i32,
        reply: impl OpenReply,
    ) {
        let place = reply
            .may_leave()
            .then(|| Waiters::take(&self.waiters, c.uid))
            .flatten();
        let Some(place) = place else {
            self.fs
                .stats()
                .name_waits_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                uid = c.uid,
                "too many waiting opens (this user's, all, or this ring queue's): not waiting"
            );
            return reply.error(Error::NotFound.errno());
        };
        let me = self.clone();
        let done = Box::new(move |r: Result<(), Error>| {
            let _place = place;
            match r {
                Ok(()) => me.open_now(c, ino, flags, reply),
                Err(e) => reply.error(e.errno()),
            }
        });
        self.fs.wait_produced(ino, c.credentials(), flags, done);
    }
}
