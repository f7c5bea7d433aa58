//! One ring thread: an io_uring of its own (one issuer, task work run when it waits) with FUSE
//! ring entries registered for queue `qid` (the CPU whose requests it serves). A request is
//! taken from each completion and handled on this thread; its reply is committed with the
//! fetch of the next request in one submission. A reply made later on another thread (a
//! waiting lookup, a prefetch list) comes back through a channel and an eventfd: only this
//! thread submits to its ring. While such a reply is out its entry is held, so before each
//! request is handled the thread makes sure another of its entries is registered and free.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use io_uring::{IoUring, cqueue, opcode, squeue, types};

use super::abi::{self, ENT_IN_OUT, HEADER_BYTES, IN_OUT, InHeader, OP_IN};
use crate::core::sync::lock;

/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// The completion of the eventfd read that says replies came back from other threads.
const WAKE: u64 = u64::MAX;

/// The entries each ring thread registers, all before its first request. The kernel hands a
/// request that finds none of its queue's entries free to the next commit on that queue, and
/// gives an entry registered later only requests that arrive after it. So every entry is
/// registered up front, and fewer than the queue's entries hold requests whose replies are made
/// on other threads (waiting opens, for up to `--wait`; see [`Away`]): whenever requests queue,
/// some entries hold requests answered on a ring thread, whose commits hand the queued ones
/// out. (Registering one more only when the last was taken let a burst of waiting opens queue
/// everything behind them, anyone's requests, for the whole wait.)
const ENTRIES: usize = AWAY + 16;

/// The requests whose replies may be out on other threads at once, per ring thread of a queue.
pub const AWAY: usize = 128;

/// A queue's requests whose replies are out on other threads, shared by its ring threads:
/// past [`AWAY`] for each of them, such a request is answered as if it could not wait (see
/// `Fail::may_leave`), and so is one of a user who holds three quarters of them already: one
/// user's waiting opens leave the others a share (they failed at once with ENOENT behind 1,024
/// of one user's). (Two threads may both take the last place: each has entries to spare.)
pub struct Away {
    out: AtomicUsize,
    most: usize,
    /// The places each user holds.
    by_uid: Mutex<HashMap<u32, usize>>,
}

impl Away {
    pub fn for_queue(threads: usize) -> Away {
        Away {
            out: AtomicUsize::new(0),
            most: threads * AWAY,
            by_uid: Mutex::default(),
        }
    }

    /// The most places one user holds.
    fn one_user(&self) -> usize {
        self.most - self.most / 4
    }

    /// Whether a request of `uid` may leave. (Users are counted only once as many places are
    /// out as one may hold: below that none can be past their share.)
    fn may_leave(&self, uid: u32) -> bool {
        let out = self.out.load(Ordering::Acquire);
        out < self.most
            && (out < self.one_user()
                || lock(&self.by_uid).get(&uid).copied().unwrap_or(0) < self.one_user())
    }

    /// A request of `uid` left: its reply is made on another thread.
    fn left(&self, uid: u32) {
        *lock(&self.by_uid).entry(uid).or_default() += 1;
        self.out.fetch_add(1, Ordering::AcqRel);
    }

    /// The reply of a request of `uid` that left came back.
    fn back(&self, uid: u32) {
        let mut by_uid = lock(&self.by_uid);
        if let Some(n) = by_uid.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                by_uid.remove(&uid);
            }
        }
        self.out.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One ring entry's memory, shared with the kernel: it writes a request in and reads the reply
/// out, each only between a submission of ours and its completion; between a completion and the
/// next submission it is this entry's alone (the request's reader, then its one reply). The
/// payload is reserved, not touched: pages are only used as requests and replies fill them.
pub struct Buffers {
    header: NonNull<u8>,
    payload: NonNull<u8>,
    payload_len: usize,
}

// SAFETY: the buffers are plain bytes with one user at a time (see the type's comment): the
// ring thread reads the request, then the single `RingReply` (possibly on another thread)
// writes the reply, and the ring thread submits it only once that reply said it is done.
unsafe impl Send for Buffers {}
// SAFETY: as above; shared references never touch the bytes outside that order.
unsafe impl Sync for Buffers {}

impl Buffers {
    fn new(payload_len: usize) -> Buffers {
        let leak = |n: usize| {
            let b: Box<[u8]> = vec![0u8; n].into_boxed_slice();
            // A boxed slice's pointer is never null.
            NonNull::new(Box::into_raw(b).cast::<u8>()).expect("allocated")
        };
        Buffers {
            header: leak(HEADER_BYTES),
            payload: leak(payload_len),
            payload_len,
        }
    }

    /// The header buffer.
    ///
    /// # Safety
    /// The caller holds the entry (see [`Buffers`]) and no other reference to it is live.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn header(&self) -> &mut [u8] {
        // SAFETY: allocated with HEADER_BYTES bytes in `new`; exclusivity is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.header.as_ptr(), HEADER_BYTES) }
    }

    /// The payload buffer.
    ///
    /// # Safety
    /// As [`Buffers::header`].
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn payload(&self) -> &mut [u8] {
        // SAFETY: allocated with payload_len bytes in `new`; exclusivity is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.payload.as_ptr(), self.payload_len) }
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: both were made by Box::into_raw of boxed slices of these lengths in `new`,
        // and are freed once (the last `Arc<Buffers>` is gone: no reply and no ring uses them).
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.header.as_ptr(),
                HEADER_BYTES,
            )));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.payload.as_ptr(),
                self.payload_len,
            )));
        }
    }
}

/// What a finished reply hands back to its ring thread.
pub struct Done {
    /// 0 or a negative errno.
    pub error: i32,
    /// Bytes of the reply's arguments: in the payload buffer, or in `scratch`.
    pub len: usize,
    /// The arguments, when they were written aside (the request's own arguments were still
    /// borrowed from the payload buffer while the reply was made).
    pub scratch: Option<Vec<u8>>,
}

/// Where a reply says it is done: its entry's ring thread (woken if it is another thread).
pub struct Completion {
    entry: usize,
    tx: Sender<(usize, Done)>,
    wake: Arc<OwnedFd>,
    owner: ThreadId,
    sent: bool,
    /// The queue had places left for replies made elsewhere (see [`Away`]).
    may_leave: bool,
}

impl Completion {
    pub fn finish(mut self, done: Done) {
        self.send(done);
    }

    /// Whether the reply may be made later on another thread (see [`Away`]).
    pub fn may_leave(&self) -> bool {
        self.may_leave
    }

    fn send(&mut self, done: Done) {
        self.sent = true;
        let _ = self.tx.send((self.entry, done));
        if std::thread::current().id() != self.owner {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live local to an eventfd this struct keeps open.
            let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }
}

impl Drop for Completion {
    /// A reply dropped unsent is answered EIO (as fuser does).
    fn drop(&mut self) {
        if !self.sent {
            self.send(Done {
                error: -libc::EIO,
                len: 0,
                scratch: None,
            });
        }
    }
}

/// A request as it arrived in an entry: its header, its per-op header and where its payload
/// lies (a raw span: a reply may be written over it, see [`Arrived::payload`]).
pub struct Arrived<'a> {
    pub header: InHeader,
    pub op_in: &'a [u8],
    payload: (*const u8, usize),
}

impl Arrived<'_> {
    /// The request's payload (names, written bytes).
    ///
    /// # Safety
    /// The slice must be dropped before the request's reply writes into the payload buffer
    /// (replies that do are made only for requests whose payload is not read, or after it was
    /// copied out; others are written aside, see [`Done::scratch`]).
    pub unsafe fn payload(&self) -> &[u8] {
        // SAFETY: the span lies within the entry's payload buffer (bounded by its length in
        // `Ring::arrived`); the caller keeps it clear of the reply.
        unsafe { std::slice::from_raw_parts(self.payload.0, self.payload.1) }
    }
}

/// What handles each request: given the request, its entry's buffers and where its reply
/// says it is done.
pub type Handler<'h> = dyn Fn(Arrived<'_>, Arc<Buffers>, Completion) + Send + Sync + 'h;

/// One of this thread's entries.
struct Entry {
    buffers: Arc<Buffers>,
    iov: Box<[libc::iovec; 2]>,
    /// The request it holds (its commit id, the request's `unique`), while its reply is out.
    holds: Option<u64>,
    /// The kernel refused its last submission: it serves no more.
    dead: bool,
    /// Its reply is made on another thread: it holds one of the queue's [`Away`] places, for
    /// this user.
    away: Option<u32>,
}

struct Ring<'a> {
    uring: IoUring<squeue::Entry128, cqueue::Entry>,
    dev: types::Fd,
    qid: u16,
    payload_len: usize,
    entries: Vec<Entry>,
    tx: Sender<(usize, Done)>,
    rx: Receiver<(usize, Done)>,
    wake: Arc<OwnedFd>,
    wake_buf: Box<[u8; 8]>,
    handle: &'a Handler<'a>,
    away: &'a Away,
}

/// Serves queue `qid` of the FUSE connection behind `dev` until the connection ends: an
/// unmount (`Ok`), or a ring error (`Err`; the other ring threads and /dev/fuse go on).
/// `registered` runs once the kernel took this thread's first entry.
pub fn serve(
    dev: &Arc<OwnedFd>,
    qid: u16,
    payload_len: usize,
    handle: &Handler,
    away: &Away,
    registered: &dyn Fn(),
) -> io::Result<()> {
    // SQE128: the FUSE command sits in the big entry's command area. One issuer (this
    // thread), whose waits run the kernel's task work: requests are copied in on this thread.
    let uring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(64)?;
    // SAFETY: eventfd returns a new descriptor (or -1, checked) that nothing else owns.
    let wake = unsafe {
        let fd = libc::eventfd(0, libc::EFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        OwnedFd::from_raw_fd(fd)
    };
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut ring = Ring {
        uring,
        dev: types::Fd(dev.as_raw_fd()),
        qid,
        payload_len,
        entries: Vec::new(),
        tx,
        rx,
        wake: Arc::new(wake),
        wake_buf: Box::new([0u8; 8]),
        handle,
        away,
    };
    ring.arm_wake()?;
    ring.register_entry()?;
    ring.uring.submit()?;
    // A registration the kernel refuses completes at once (EAGAIN: INIT not finished yet).
    loop {
        let refused = ring.uring.completion().find(|c| c.user_data() != WAKE);
        match refused.map(|c| c.result()) {
            None => break,
            Some(r) if r == -libc::EAGAIN => {
                std::thread::sleep(Duration::from_millis(5));
                ring.register(0)?;
                ring.uring.submit()?;
            }
            Some(r) => return Err(io::Error::from_raw_os_error(-r)),
        }
    }
    // The others, now the kernel takes registrations (see ENTRIES).
    for _ in 1..ENTRIES {
        ring.register_entry()?;
    }
    ring.uring.submit()?;
    registered();
    ring.run()
}

impl Ring<'_> {
    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        loop {
            // SAFETY: every SQE pushed here points only at memory this ring keeps alive while
            // the kernel may use it (entries' buffers and iovecs, the eventfd buffer).
            if unsafe { self.uring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            self.uring.submit()?;
        }
    }

    /// Arms the read of the eventfd that says replies came back from other threads.
    fn arm_wake(&mut self) -> io::Result<()> {
        let read = opcode::Read::new(
            types::Fd(self.wake.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            8,
        )
        .build()
        .user_data(WAKE);
        self.push(&read.into())
    }

    /// Adds an entry and submits its registration.
    fn register_entry(&mut self) -> io::Result<()> {
        let buffers = Arc::new(Buffers::new(self.payload_len));
        let iov = Box::new([
            libc::iovec {
                iov_base: buffers.header.as_ptr().cast(),
                iov_len: HEADER_BYTES,
            },
            libc::iovec {
                iov_base: buffers.payload.as_ptr().cast(),
                iov_len: self.payload_len,
            },
        ]);
        self.entries.push(Entry {
            buffers,
            iov,
            holds: None,
            dead: false,
            away: None,
        });
        self.register(self.entries.len() - 1)
    }

    fn register(&mut self, i: usize) -> io::Result<()> {
        let sqe = opcode::UringCmd80::new(self.dev, CMD_REGISTER)
            .cmd(abi::cmd_req(0, self.qid))
            .addr(Some(self.entries[i].iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        self.push(&with_len(sqe, 2))
    }

    fn run(&mut self) -> io::Result<()> {
        let mut arrived = Vec::new();
        loop {
            match self.uring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            arrived.clear();
            arrived.extend(self.uring.completion().map(|c| (c.user_data(), c.result())));
            for &(what, res) in &arrived {
                if what == WAKE {
                    self.arm_wake()?;
                    continue;
                }
                if matches!(
                    -res,
                    libc::ENOTCONN | libc::ECANCELED | libc::ENODEV | libc::ECONNABORTED
                ) {
                    return Ok(());
                }
                if res < 0 {
                    // A commit the kernel could not match (the request was aborted): that
                    // entry is lost to it, not the others.
                    let e = io::Error::from_raw_os_error(-res);
                    tracing::debug!(error = %e, entry = what, "a ring entry was refused");
                    self.entries[what as usize].dead = true;
                    self.keep_serving()?;
                    continue;
                }
                self.arrived(what as usize)?;
            }
            self.commit_done()?;
        }
    }

    /// Hands the request that arrived in entry `i` to the handler, with another entry of this
    /// thread registered first if none is free (its reply may be made elsewhere).
    fn arrived(&mut self, i: usize) -> io::Result<()> {
        let buffers = self.entries[i].buffers.clone();
        // SAFETY: the completion gave this entry to this thread; nothing else holds it yet,
        // and replies never write the header buffer (this thread does, in `commit_done`).
        let header = unsafe { &*buffers.header() };
        let (commit_id, payload_sz) = abi::ent_in_out(&header[ENT_IN_OUT..]).unwrap_or((0, 0));
        let h = InHeader::parse(&header[IN_OUT..]);
        let completion = Completion {
            entry: i,
            tx: self.tx.clone(),
            wake: self.wake.clone(),
            owner: std::thread::current().id(),
            sent: false,
            may_leave: h.is_some_and(|h| self.away.may_leave(h.uid)),
        };
        self.entries[i].holds = Some(commit_id);
        // (Submitted only when something is queued, the wake's re-arm: an empty submit is a
        // syscall for nothing.)
        if !self.uring.submission().is_empty() {
            self.uring.submit()?;
        }
        let Some(h) = h else {
            drop(completion); // answered EIO
            return self.commit_done();
        };
        let request = Arrived {
            header: h,
            op_in: &header[OP_IN..ENT_IN_OUT],
            payload: (
                buffers.payload.as_ptr().cast_const(),
                (payload_sz as usize).min(buffers.payload_len),
            ),
        };
        (self.handle)(request, buffers.clone(), completion);
        // Replies made on this thread are in the channel already; the others hold entries.
        self.commit_done()?;
        if self.entries[i].holds.is_some() {
            self.entries[i].away = Some(h.uid);
            self.away.left(h.uid);
        }
        Ok(())
    }

    /// Registers an entry in place of each one the kernel refused (see ENTRIES).
    /// (At most ENTRIES times over: a kernel refusing every entry is not asked forever.)
    fn keep_serving(&mut self) -> io::Result<()> {
        let dead = self.entries.iter().filter(|e| e.dead).count();
        let replaced = self.entries.len().saturating_sub(ENTRIES);
        for _ in replaced..dead.min(ENTRIES) {
            self.register_entry()?;
        }
        Ok(())
    }

    /// Writes the header of each reply that is done and submits its commit (with the fetch
    /// of the entry's next request).
    fn commit_done(&mut self) -> io::Result<()> {
        while let Ok((i, done)) = self.rx.try_recv() {
            let Some(unique) = self.entries[i].holds.take() else {
                // (Already answered: a reply sends once.)
                continue;
            };
            if let Some(uid) = self.entries[i].away.take() {
                self.away.back(uid);
            }
            let buffers = self.entries[i].buffers.clone();
            // SAFETY: the reply is done (it said so): the entry is this thread's again.
            let (header, payload) = unsafe { (buffers.header(), buffers.payload()) };
            let mut len = if done.error == 0 { done.len } else { 0 };
            if let Some(s) = &done.scratch {
                len = len.min(s.len()).min(payload.len());
                payload[..len].copy_from_slice(&s[..len]);
            }
            abi::out_header(&mut header[IN_OUT..], unique, done.error);
            abi::set_payload_sz(header, len as u32);
            let sqe = opcode::UringCmd80::new(self.dev, CMD_COMMIT_AND_FETCH)
                .cmd(abi::cmd_req(unique, self.qid))
                .build()
                .user_data(i as u64);
            self.push(&sqe)?;
        }
        Ok(())
    }
}

/// `sqe` with its `len` field set: the FUSE register command counts its iovecs there, which
/// io-uring's `UringCmd80` builder does not expose.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `#[repr(C)]` of a 64-byte `io_uring_sqe` and 64 command bytes, all
    // plain integers (any bit pattern is valid); `len` is the u32 at byte 24 of the SQE (struct
    // io_uring_sqe: opcode, flags, ioprio, fd, off, addr, then len).
    unsafe {
        let mut bytes: [u8; 128] = std::mem::transmute(sqe);
        bytes[24..28].copy_from_slice(&len.to_le_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_leaves_the_others_a_share_of_a_queues_places() {
        let away = Away::for_queue(1);
        let mut taken = 0;
        while away.may_leave(7) {
            away.left(7);
            taken += 1;
        }
        assert_eq!(taken, AWAY - AWAY / 4, "one user holds three quarters");
        let mut others = 0;
        while away.may_leave(8) {
            away.left(8);
            others += 1;
        }
        assert_eq!(others, AWAY / 4, "another user the rest");
        assert!(!away.may_leave(9), "all places out");
        away.back(8);
        assert!(away.may_leave(9) && !away.may_leave(7));
        away.back(7);
        assert!(away.may_leave(7), "a place given back is the user's again");
        for _ in 1..taken {
            away.back(7);
        }
        assert!(lock(&away.by_uid).get(&7).is_none());
    }
}
