//! The UCX worker in a process of its own (`dyadfs data-plane`, started by the daemon): on tcp,
//! UCX emulates RMA in software and its handlers read or write any address a request names,
//! with no rkey or bounds check, so whatever UCX listens with must hold nothing worth taking.
//! The process is exec'd fresh (none of the daemon's memory: no secret, no state), drops to
//! `nobody` when started as root, sets `no_new_privs` and is not dumpable, and shares with the
//! daemon only the slab of staged chunks (a memfd) and a socket of commands. The daemon checks
//! everything it says and treats the slab as hostile (see [`crate::transport::plane`]).
//!
//! If the process dies (a hostile get at an unmapped address kills it), the daemon's gets in
//! flight fail at once (pulls go on from another holder or the shared file system), and a new
//! process is started with a new address, which pullers learn on their next connection.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Sender, bounded};
use serde::{Deserialize, Serialize};

use super::{Completer, Completion, PeerId, PeerInfo, Slab, Slot, UcxError, completion};
use crate::core::sync::lock;

/// Commands from the daemon.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum ToChild {
    Connect {
        id: u64,
        #[serde(with = "crate::transport::frame::bytes")]
        address: Vec<u8>,
        #[serde(with = "crate::transport::frame::bytes")]
        rkey: Vec<u8>,
    },
    Disconnect {
        peer: u64,
    },
    Get {
        id: u64,
        peer: u64,
        remote_addr: u64,
        slot: u32,
        len: u32,
    },
}

/// Answers from the data-plane process (untrusted: checked before use).
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum FromChild {
    Ready {
        #[serde(with = "crate::transport::frame::bytes")]
        address: Vec<u8>,
        #[serde(with = "crate::transport::frame::bytes")]
        rkey: Vec<u8>,
        /// Where the slab is mapped in the data-plane process (what peers name in gets).
        base: u64,
    },
    Connected {
        id: u64,
        peer: Result<u64, String>,
    },
    GetDone {
        id: u64,
        error: Option<String>,
    },
    /// It could not start (instead of `Ready`).
    Failed(String),
}

/// Largest command or answer (addresses and rkeys are bounded by the hello's check).
pub(super) const MAX_MSG: usize = 64 << 10;
/// The descriptors the data-plane process finds its socket and slab at.
pub(super) const SOCK_FD: RawFd = 3;
pub(super) const SLAB_FD: RawFd = 4;
/// Waits between restarts of a data-plane process that keeps dying.
const RESTART_MIN: Duration = Duration::from_millis(100);
const RESTART_MAX: Duration = Duration::from_secs(5);

/// The daemon's handle on its data-plane process (restarted when it dies).
pub struct Child {
    inner: Arc<Inner>,
}

struct Inner {
    slots: usize,
    slot_size: usize,
    background: bool,
    /// UCX_TLS for the process, overriding the daemon's (RDMA transports only, on `auto`).
    tls: Option<String>,
    memfd: OwnedFd,
    /// The daemon's mapping of the shared slab.
    slab: Arc<Slab>,
    state: Mutex<State>,
    waiting: Mutex<HashMap<u64, Waiter>>,
    next: AtomicU64,
    stopping: AtomicBool,
}

/// The running process.
struct State {
    generation: u64,
    sock: Option<Arc<OwnedFd>>,
    pid: Option<i32>,
    info: PeerInfo,
    base: u64,
}

enum Waiter {
    Connect(u64, Sender<Result<PeerId, UcxError>>),
    Get(u64, Slot, Completer<(Slot, Result<(), UcxError>)>),
}

pub(super) fn io_err(op: &'static str) -> impl Fn(io::Error) -> UcxError {
    move |e| UcxError::io(op, e)
}

/// A `socketpair` of sequenced packets: one command or answer per message, never merged.
fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is an out array of two ints.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here only.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one message. `nowait`: fail with `WouldBlock` rather than wait for room (the daemon
/// never waits on its data-plane process: one that stops reading is killed and restarted).
pub(super) fn send_msg<T: Serialize>(sock: &OwnedFd, m: &T, nowait: bool) -> io::Result<()> {
    let bytes = rmp_serde::to_vec(m).map_err(io::Error::other)?;
    let flags = libc::MSG_NOSIGNAL | if nowait { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: a live socket and a buffer of bytes.len() readable bytes.
    let n = unsafe { libc::send(sock.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), flags) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The next message; `Ok(None)` at EOF.
pub(super) fn recv_msg<T: serde::de::DeserializeOwned>(
    sock: &OwnedFd,
    buf: &mut [u8],
) -> io::Result<Option<T>> {
    loop {
        // SAFETY: a live socket and a writable buffer of buf.len() bytes.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(None);
        }
        return rmp_serde::from_slice(&buf[..n as usize])
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
    }
}

impl Child {
    /// Creates the shared slab and starts the data-plane process; returns once it is ready.
    /// `tls`: the UCX_TLS it runs with (`None`: the daemon's, if any).
    pub fn start(
        slots: usize,
        slot_size: usize,
        background: bool,
        tls: Option<&str>,
    ) -> Result<Child, UcxError> {
        if crate::sys::euid() != 0 {
            tracing::warn!(
                "the data-plane process runs as this daemon's user (only root can start it as \
                 nobody): whoever takes it over through UCX can do what that user can; prefer \
                 --data-plane stream"
            );
        }
        let (slab, memfd) = Slab::new_shared(slots, slot_size).map_err(io_err("memfd"))?;
        let inner = Arc::new(Inner {
            slots,
            slot_size,
            background,
            tls: tls.map(str::to_string),
            memfd,
            slab: Arc::new(slab),
            state: Mutex::new(State {
                generation: 0,
                sock: None,
                pid: None,
                info: PeerInfo {
                    worker_address: Vec::new(),
                    rkey: Vec::new(),
                },
                base: 0,
            }),
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
        });
        let sock = inner.spawn()?;
        let watcher = inner.clone();
        std::thread::Builder::new()
            .name("data-plane".into())
            .spawn(move || watcher.watch(sock))
            .map_err(io_err("spawn"))?;
        Ok(Child { inner })
    }

    /// The shared slab, as the daemon maps it.
    pub fn slab(&self) -> &Arc<Slab> {
        &self.inner.slab
    }

    pub fn info(&self) -> PeerInfo {
        lock(&self.inner.state).info.clone()
    }

    /// The address a peer names to get the shared slot `slot`.
    pub fn remote_addr(&self, slot: &Slot) -> u64 {
        lock(&self.inner.state).base + (slot.index() * self.inner.slot_size) as u64
    }

    /// The pid of the running data-plane process (tests, `status`).
    pub fn pid(&self) -> Option<i32> {
        lock(&self.inner.state).pid
    }

    /// Sends a command to the running process if it is still generation `generation` (a
    /// restarted one numbers its peers and slots anew). Under the state lock, so no restart
    /// lands between the check and the send; never waits for room: a process whose socket is
    /// full has stopped reading, and is killed (the watcher restarts it).
    fn command(&self, generation: u64, cmd: &ToChild) -> Result<(), UcxError> {
        let st = lock(&self.inner.state);
        let sock = match &st.sock {
            Some(s) if st.generation == generation => s,
            _ => return Err(UcxError::gone("data plane")),
        };
        match send_msg(sock, cmd, true) {
            Ok(()) => Ok(()),
            Err(e) => {
                if e.kind() == io::ErrorKind::WouldBlock
                    && let Some(pid) = st.pid
                {
                    tracing::warn!(pid, "the data-plane process stopped reading; killing it");
                    // SAFETY: signalling our own child process.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                Err(UcxError::io("data plane", e))
            }
        }
    }

    /// Whether a data-plane process is running (one that died is being restarted).
    pub fn alive(&self) -> bool {
        lock(&self.inner.state).sock.is_some()
    }

    pub fn connect(&self, info: PeerInfo, timeout: Duration) -> Result<PeerId, UcxError> {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        let generation = lock(&self.inner.state).generation;
        lock(&self.inner.waiting).insert(id, Waiter::Connect(generation, tx));
        let sent = self.command(
            generation,
            &ToChild::Connect {
                id,
                address: info.worker_address,
                rkey: info.rkey,
            },
        );
        let r = sent.and_then(|_| {
            rx.recv_timeout(timeout)
                .map_err(|_| UcxError::gone("connect"))?
        });
        lock(&self.inner.waiting).remove(&id);
        r
    }

    pub fn disconnect(&self, peer: PeerId) {
        let (generation, peer) = split(peer);
        let _ = self.command(generation, &ToChild::Disconnect { peer });
    }

    /// Starts a get into the shared slot `slot`; it comes back with the result once the
    /// data-plane process is done with it (or is gone).
    pub fn get(
        &self,
        peer: PeerId,
        remote_addr: u64,
        slot: Slot,
        len: usize,
    ) -> Completion<(Slot, Result<(), UcxError>)> {
        let (done, rx) = completion();
        let (generation, child_peer) = split(peer);
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let index = slot.index() as u32;
        lock(&self.inner.waiting).insert(id, Waiter::Get(generation, slot, done));
        let cmd = ToChild::Get {
            id,
            peer: child_peer,
            remote_addr,
            slot: index,
            len: len as u32,
        };
        if self.command(generation, &cmd).is_err() {
            // Gone, or another generation (its peer numbers mean nothing to the running
            // process): the completer is dropped (abandoned), the slot returns.
            lock(&self.inner.waiting).remove(&id);
        }
        rx
    }
}

fn split(peer: PeerId) -> (u64, u64) {
    (peer.0 >> 40, peer.0 & ((1 << 40) - 1))
}

impl Drop for Child {
    fn drop(&mut self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        let st = lock(&self.inner.state);
        if let Some(pid) = st.pid {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl Inner {
    /// Starts a data-plane process and waits for its `Ready`; returns its socket.
    fn spawn(&self) -> Result<Arc<OwnedFd>, UcxError> {
        let (mine, theirs) = seqpacket_pair().map_err(io_err("socketpair"))?;
        let exe = std::env::current_exe().map_err(io_err("current_exe"))?;
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("data-plane")
            .arg("--slots")
            .arg(self.slots.to_string())
            .arg("--slot-size")
            .arg(self.slot_size.to_string());
        if self.background {
            cmd.arg("--background");
        }
        // Nothing of the daemon's environment but UCX's settings and the log filter.
        cmd.env_clear();
        for (k, v) in std::env::vars_os() {
            let k_str = k.to_string_lossy();
            if k_str.starts_with("UCX_") || k_str == "RUST_LOG" || k_str == "PATH" {
                cmd.env(k, v);
            }
        }
        if let Some(tls) = &self.tls {
            cmd.env("UCX_TLS", tls);
        }
        // The library this process loaded, and no other.
        if let Ok(lib) = ucx_sys::load() {
            cmd.env("DYADFS_UCX_LIB", lib);
        }
        // No `./ucx.conf` of the daemon's directory: it starts in `/` (see `ucx_sys::load`).
        cmd.current_dir("/");
        // Not even the daemon's log: a process anyone on the network may take over over tcp
        // must not write where root reads.
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let (sock_fd, slab_fd) = (theirs.as_raw_fd(), self.memfd.as_raw_fd());
        // SAFETY: only async-signal-safe calls between fork and exec: fcntl, dup2, prctl,
        // close_range or close, and sysconf (a read of the limit).
        unsafe {
            cmd.pre_exec(move || {
                // Both first moved above the targets, so neither dup2 clobbers the other.
                let a = libc::fcntl(sock_fd, libc::F_DUPFD, 16);
                let b = libc::fcntl(slab_fd, libc::F_DUPFD, 16);
                if a < 0
                    || b < 0
                    || libc::dup2(a, SOCK_FD) < 0
                    || libc::dup2(b, SLAB_FD) < 0
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // Nothing else of the daemon's: no cache file, no /dev/fuse, no readiness
                // pipe (whose reader waits for every copy of it to close). close_range is
                // Linux 5.9; before it, each descriptor up to the limit.
                if libc::syscall(libc::SYS_close_range, SLAB_FD + 1, libc::c_uint::MAX, 0) != 0 {
                    let max = libc::sysconf(libc::_SC_OPEN_MAX).clamp(SLAB_FD as i64 + 1, 1 << 20);
                    for fd in SLAB_FD + 1..max as i32 {
                        libc::close(fd);
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(io_err("spawn data-plane process"))?;
        drop(theirs);
        let pid = child.id() as i32;
        // Reaped by the watcher once its socket closes.
        std::mem::forget(child);
        let mut buf = vec![0u8; MAX_MSG];
        let ready = set_recv_timeout(&mine, Some(Duration::from_secs(30)))
            .and_then(|()| recv_msg::<FromChild>(&mine, &mut buf));
        let _ = set_recv_timeout(&mine, None);
        let (address, rkey, base) = match ready {
            Ok(Some(FromChild::Ready {
                address,
                rkey,
                base,
            })) if !address.is_empty() && !rkey.is_empty() => (address, rkey, base),
            other => {
                // SAFETY: our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
                let why = match other {
                    Ok(Some(FromChild::Failed(why))) => why,
                    Ok(Some(_)) => "it answered out of turn".into(),
                    Ok(None) => "it exited without a word".into(),
                    Err(e) => format!("no answer ({e})"),
                };
                return Err(UcxError::io(
                    "data-plane process start",
                    io::Error::other(why),
                ));
            }
        };
        let sock = Arc::new(mine);
        let mut st = lock(&self.state);
        st.generation += 1;
        st.sock = Some(sock.clone());
        st.pid = Some(pid);
        st.info = PeerInfo {
            worker_address: address,
            rkey,
        };
        st.base = base;
        tracing::info!(pid, generation = st.generation, "data-plane process ready");
        Ok(sock)
    }

    /// Reads the process's answers until it goes away, then restarts it (for as long as the
    /// daemon runs).
    fn watch(self: Arc<Self>, mut sock: Arc<OwnedFd>) {
        let mut wait = RESTART_MIN;
        loop {
            self.read_answers(&sock);
            let (pid, generation) = {
                let mut st = lock(&self.state);
                st.sock = None;
                (st.pid.take(), st.generation)
            };
            if let Some(pid) = pid {
                let mut status = 0;
                // SAFETY: our own child; reaped once.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                if !self.stopping.load(Ordering::Relaxed) {
                    tracing::warn!(pid, status, "data-plane process died; restarting it");
                }
            }
            // Its gets and connects fail now (slots return: the process is gone).
            lock(&self.waiting).retain(|_, w| match w {
                Waiter::Connect(g, _) | Waiter::Get(g, _, _) => *g != generation,
            });
            if self.stopping.load(Ordering::Relaxed) {
                return;
            }
            loop {
                std::thread::sleep(wait);
                match self.spawn() {
                    Ok(s) => {
                        sock = s;
                        wait = RESTART_MIN;
                        break;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "restarting the data-plane process failed");
                        wait = (wait * 2).min(RESTART_MAX);
                    }
                }
            }
        }
    }

    fn read_answers(&self, sock: &OwnedFd) {
        let mut buf = vec![0u8; MAX_MSG];
        let generation = lock(&self.state).generation;
        loop {
            let msg = match recv_msg::<FromChild>(sock, &mut buf) {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(e) => {
                    // A process that speaks nonsense is treated as dead.
                    tracing::warn!(error = %e, "bad message from the data-plane process");
                    return;
                }
            };
            match msg {
                FromChild::Connected { id, peer } => {
                    if let Some(Waiter::Connect(_, tx)) = lock(&self.waiting).remove(&id) {
                        let r = match peer {
                            Ok(p) if p < (1 << 40) => Ok(PeerId((generation << 40) | p)),
                            Ok(_) => Err(UcxError::io("connect", io::Error::other("bad peer"))),
                            Err(m) => Err(UcxError::io("ucp_ep_create", io::Error::other(m))),
                        };
                        let _ = tx.send(r);
                    }
                }
                FromChild::GetDone { id, error } => {
                    let w = lock(&self.waiting).remove(&id);
                    if let Some(Waiter::Get(_, slot, done)) = w {
                        let r = match error {
                            None => Ok(()),
                            Some(m) => Err(UcxError::io("ucp_get_nbx", io::Error::other(m))),
                        };
                        done.complete((slot, r));
                    }
                }
                FromChild::Ready { .. } | FromChild::Failed(_) => return,
            }
        }
    }
}

fn set_recv_timeout(sock: &OwnedFd, t: Option<Duration>) -> io::Result<()> {
    let tv = match t {
        Some(t) => libc::timeval {
            tv_sec: t.as_secs() as libc::time_t,
            tv_usec: t.subsec_micros() as libc::suseconds_t,
        },
        None => libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
    };
    // SAFETY: a live socket and a timeval of the size given.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
