//! The threads that serve pull connections: at most a bound, however many connections peers
//! open. A connection mostly waits for its next request, so a thread keeps an idle connection
//! (blocked in `poll` on its socket, woken by the request itself as a thread of its own was)
//! only until another connection needs a thread: then the longest-idle one is parked on the
//! reactor, which hands it back to the pool once it has something to read. A connection busy
//! past [`SLICE`] while others wait goes to the back of the queue.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::core::sync::lock;

/// How long a busy connection keeps its thread while other connections wait for one.
const SLICE: Duration = Duration::from_millis(20);

/// A connection the pool serves.
pub(super) trait Conn: Send + 'static {
    /// Its socket: readable when it has something to serve.
    fn fd(&self) -> RawFd;
    /// Serves what has arrived, until nothing is left ([`Step::Idle`]) or `turn` is over.
    fn serve(&mut self, turn: &Turn) -> io::Result<Step>;
    /// Takes back what it holds past its lease; returns when the next lease ends.
    fn expire(&mut self) -> Option<Instant>;
    /// Logs why it ended.
    fn ended(&self, e: io::Error);
}

pub(super) enum Step {
    /// Nothing to serve until its socket is readable.
    Idle,
    /// Its turn is over with work left.
    Yield,
}

/// One connection's time on a thread: over once it has had [`SLICE`] and others wait.
pub(super) struct Turn<'a> {
    since: Instant,
    waiting: &'a AtomicUsize,
}

impl Turn<'_> {
    pub(super) fn over(&self) -> bool {
        self.others_wait() && self.since.elapsed() >= SLICE
    }

    /// Whether other connections wait for a thread (an idle one is then parked on the reactor).
    pub(super) fn others_wait(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }
}

/// The threads of a control server's pull connections: readers' pulls, and background copies
/// (`--replicate`) at the lowest CPU priority.
#[derive(Clone)]
pub struct Serving {
    pub pulls: Pool,
    pub copies: Pool,
}

impl Serving {
    /// At most `threads` threads for pulls and a quarter of that (at least one) for copies.
    pub fn new(threads: usize) -> Serving {
        Self::pools("serve-pull", threads, false)
    }

    /// As [`Serving::new`], every thread at the lowest CPU priority: a node service serving
    /// other jobs' pulls (the site) leaves its own job's readers the CPU they want.
    pub fn yielding(threads: usize) -> Serving {
        Self::pools("serve-site", threads, true)
    }

    fn pools(name: &'static str, threads: usize, pulls_background: bool) -> Serving {
        Serving {
            pulls: Pool::new(name, threads, pulls_background),
            copies: Pool::new("serve-copy", (threads / 4).max(1), true),
        }
    }

    pub(super) fn attach(&self, reactor: tokio::runtime::Handle) {
        self.pulls.attach(reactor.clone());
        self.copies.attach(reactor);
    }
}

/// A bounded pool of serving threads (cheap to clone: one pool).
#[derive(Clone)]
pub struct Pool(Arc<Inner>);

struct Inner {
    name: &'static str,
    max: usize,
    /// Its threads run at the lowest CPU priority (`--replicate`'s copies).
    background: bool,
    state: Mutex<State>,
    work: Condvar,
    /// `state.ready.len()`, read without the lock by busy threads.
    waiting: AtomicUsize,
    /// Where idle connections are parked (set by the server before its first connection).
    reactor: OnceLock<tokio::runtime::Handle>,
}

#[derive(Default)]
struct State {
    /// Connections with something to serve, waiting for a thread.
    ready: VecDeque<Box<dyn Conn>>,
    threads: usize,
    /// Threads waiting for a connection.
    idle: usize,
    /// Threads keeping an idle connection, the longest-idle first.
    lingering: VecDeque<Arc<Wake>>,
}

impl Pool {
    /// At most `max` threads, named `name`, started as they are needed.
    pub fn new(name: &'static str, max: usize, background: bool) -> Pool {
        Pool(Arc::new(Inner {
            name,
            max: max.max(1),
            background,
            state: Mutex::default(),
            work: Condvar::new(),
            waiting: AtomicUsize::new(0),
            reactor: OnceLock::new(),
        }))
    }

    /// The runtime idle connections are parked on.
    pub(super) fn attach(&self, reactor: tokio::runtime::Handle) {
        let _ = self.0.reactor.set(reactor);
    }

    /// Serves `conn` on a thread of the pool once one is free (it is readable, or has work).
    pub(super) fn submit(&self, conn: Box<dyn Conn>) {
        let inner = &self.0;
        let mut st = lock(&inner.state);
        st.ready.push_back(conn);
        inner.waiting.store(st.ready.len(), Ordering::Relaxed);
        if st.idle >= st.ready.len() {
            inner.work.notify_one();
        } else if st.threads < inner.max {
            let pool = self.clone();
            let spawned = std::thread::Builder::new()
                .name(inner.name.into())
                .spawn(move || pool.run());
            match spawned {
                Ok(_) => st.threads += 1,
                // The connection waits for a thread already running (none: for the next
                // connection to try again).
                Err(e) => tracing::warn!(error = %e, "starting a serving thread failed"),
            }
        } else if let Some(w) = st.lingering.pop_front() {
            w.signal();
        }
        // Else every thread is busy: the first whose connection goes idle or whose turn is
        // over takes it.
    }

    fn take(&self) -> Box<dyn Conn> {
        let inner = &self.0;
        let mut st = lock(&inner.state);
        st.idle += 1;
        loop {
            if let Some(c) = st.ready.pop_front() {
                st.idle -= 1;
                inner.waiting.store(st.ready.len(), Ordering::Relaxed);
                return c;
            }
            st = inner
                .work
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn run(self) {
        if self.0.background {
            crate::sys::lower_thread_priority();
        }
        let wake = match Wake::new() {
            Ok(w) => Arc::new(w),
            Err(e) => {
                tracing::warn!(error = %e, "a serving thread has no eventfd; it ends");
                lock(&self.0.state).threads -= 1;
                return;
            }
        };
        loop {
            let conn = self.take();
            self.serve(conn, &wake);
        }
    }

    /// Serves one connection until it ends, yields, or is parked.
    fn serve(&self, mut conn: Box<dyn Conn>, wake: &Arc<Wake>) {
        let waiting = &self.0.waiting;
        let mut turn = Turn {
            since: Instant::now(),
            waiting,
        };
        loop {
            match conn.serve(&turn) {
                Err(e) => return conn.ended(e),
                Ok(Step::Yield) => return self.requeue(conn),
                Ok(Step::Idle) => {}
            }
            // Under the lock a submit takes: no connection can queue unseen in between.
            let mut st = lock(&self.0.state);
            if !st.ready.is_empty() {
                drop(st);
                return self.park(conn);
            }
            st.lingering.push_back(wake.clone());
            drop(st);
            loop {
                let next_lease = conn.expire();
                match wait(conn.fd(), wake, next_lease) {
                    Woken::Timeout => continue,
                    Woken::Signalled => {
                        wake.clear();
                        return self.park(conn);
                    }
                    Woken::Readable => break,
                }
            }
            let mut st = lock(&self.0.state);
            let Some(at) = st.lingering.iter().position(|w| Arc::ptr_eq(w, wake)) else {
                // Signalled as the request came: the thread is promised to another connection.
                drop(st);
                wake.clear();
                return self.requeue(conn);
            };
            st.lingering.remove(at);
            drop(st);
            turn.since = Instant::now();
        }
    }

    /// Back to the end of the queue (it has work; the caller's thread takes the front).
    fn requeue(&self, conn: Box<dyn Conn>) {
        let mut st = lock(&self.0.state);
        st.ready.push_back(conn);
        self.0.waiting.store(st.ready.len(), Ordering::Relaxed);
    }

    /// Idle: waits on the reactor, holding no thread, until it has something to read.
    fn park(&self, mut conn: Box<dyn Conn>) {
        let Some(reactor) = self.0.reactor.get() else {
            // Not served by `server::serve`, which attaches one: the puller reconnects.
            return conn.ended(io::Error::other("no reactor to park an idle connection on"));
        };
        let pool = self.clone();
        reactor.spawn(async move {
            let fd = Fd(conn.fd());
            // SAFETY: `fd` is the socket of `conn`, which owns it and keeps it open, unchanged,
            // until it is handed on below, after the AsyncFd is dropped.
            let registered = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) };
            let fd = match registered {
                Ok(fd) => fd,
                Err(e) => return conn.ended(e.into_parts().1),
            };
            loop {
                let Some(at) = conn.expire() else {
                    drop(fd.readable().await);
                    break;
                };
                tokio::select! {
                    r = fd.readable() => drop(r),
                    () = tokio::time::sleep_until(at.into()) => continue,
                }
                break;
            }
            // Deregistered before the socket changes hands.
            drop(fd);
            pool.submit(conn);
        });
    }
}

/// A parked connection's socket, registered with the reactor.
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A lingering thread's eventfd: written when the pool needs the thread for another connection.
struct Wake(OwnedFd);

impl Wake {
    fn new() -> io::Result<Wake> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        Ok(Wake(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes the 8 bytes of a local array to a descriptor this Wake owns.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    fn clear(&self) {
        let mut n = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a local array of 8 (nonblocking: 0 if unset).
        unsafe { libc::read(self.0.as_raw_fd(), n.as_mut_ptr().cast(), n.len()) };
    }
}

enum Woken {
    Readable,
    Signalled,
    Timeout,
}

/// Waits until `sock` is readable (or closed), `wake` is signalled, or `until`.
fn wait(sock: RawFd, wake: &Wake, until: Option<Instant>) -> Woken {
    let mut fds = [
        libc::pollfd {
            fd: sock,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = until.map_or(-1, |t| {
        let left = t.saturating_duration_since(Instant::now());
        // Rounded up: a wake before the lease ends would find nothing to take back.
        left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32
    });
    // SAFETY: `fds` is a local array of two pollfds, its length passed with it.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        // Timed out, or interrupted: the caller looks again.
        return Woken::Timeout;
    }
    if fds[1].revents != 0 {
        Woken::Signalled
    } else {
        Woken::Readable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::AtomicU64;

    /// Echoes one byte per byte read; counts what it served.
    struct Echo {
        s: TcpStream,
        served: Arc<AtomicU64>,
    }

    impl Conn for Echo {
        fn fd(&self) -> RawFd {
            self.s.as_raw_fd()
        }
        fn serve(&mut self, _: &Turn) -> io::Result<Step> {
            self.s.set_nonblocking(true)?;
            let mut b = [0u8; 64];
            let r = self.s.read(&mut b);
            self.s.set_nonblocking(false)?;
            match r {
                Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.served.fetch_add(n as u64, Ordering::Relaxed);
                    self.s.write_all(&b[..n])?;
                    Ok(Step::Idle)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Step::Idle),
                Err(e) => Err(e),
            }
        }
        fn expire(&mut self) -> Option<Instant> {
            None
        }
        fn ended(&self, _: io::Error) {}
    }

    /// 40 idle connections on a pool of 2 threads: each is still answered, the idle ones are
    /// parked, and the pool never starts a third thread.
    #[test]
    fn idle_connections_hold_no_threads() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let pool = Pool::new("test-serve", 2, false);
        pool.attach(rt.handle().clone());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let served = Arc::new(AtomicU64::new(0));
        let mut clients = Vec::new();
        for _ in 0..40 {
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            let served = served.clone();
            pool.submit(Box::new(Echo { s, served }));
            clients.push(c);
        }
        for round in 0..3u8 {
            for c in &mut clients {
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                c.write_all(&[round]).unwrap();
                let mut b = [0u8; 1];
                c.read_exact(&mut b).unwrap();
                assert_eq!(b[0], round);
            }
        }
        assert_eq!(served.load(Ordering::Relaxed), 120);
        assert_eq!(lock(&pool.0.state).threads, 2);
    }
}
