//! The data-plane process's own side (`dyadfs data-plane`, exec'd by the daemon: see
//! [`super::child`] for why it exists and what the daemon does with it): it drops what it does
//! not need, maps the slab, and serves the daemon's connects and gets until the daemon goes
//! away.

use std::collections::HashMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use super::child::{FromChild, MAX_MSG, SLAB_FD, SOCK_FD, ToChild, io_err, recv_msg, send_msg};
use super::{PeerInfo, Slab, UcxError, Worker};

/// Drops what the data-plane process does not need: root (to `nobody`), the ability to gain
/// privileges again, and being dumpable (no ptrace or /proc/PID/mem by other `nobody`s).
fn drop_privileges() -> io::Result<()> {
    let fail = || Err(io::Error::last_os_error());
    // SAFETY: plain syscalls on this process's credentials; results checked.
    unsafe {
        let parent = libc::getppid();
        if crate::sys::euid() == 0 {
            const NOBODY: libc::uid_t = 65534;
            // RDMA registers the slab as locked memory, which `nobody` could not raise past
            // the default limit (8 MiB) once root is gone. Best effort: a container may not
            // allow it, and tcp locks nothing.
            let unlimited = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            let _ = libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited);
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(NOBODY, NOBODY, NOBODY) != 0
                || libc::setresuid(NOBODY, NOBODY, NOBODY) != 0
            {
                return fail();
            }
        }
        // A change of credentials clears the parent-death signal set before exec: armed again,
        // and if the daemon died meanwhile (we were reparented), nothing is left to serve.
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
        {
            return fail();
        }
        if libc::getppid() != parent {
            return Err(io::Error::other(
                "the daemon exited while this process started",
            ));
        }
    }
    Ok(())
}

/// The data-plane process: `dyadfs data-plane`, started by a daemon with its socket at fd 3
/// and the slab's memfd at fd 4. Runs until the daemon goes away.
pub fn run(slots: usize, slot_size: usize, background: bool) -> Result<(), UcxError> {
    // SAFETY: the daemon passed these descriptors to this process for it alone.
    let (sock, memfd) = unsafe { (OwnedFd::from_raw_fd(SOCK_FD), OwnedFd::from_raw_fd(SLAB_FD)) };
    // Its stderr is /dev/null: a failure to start is told to the daemon, which logs it.
    let started = || -> Result<(Arc<Slab>, Worker), UcxError> {
        drop_privileges().map_err(io_err("dropping privileges"))?;
        let slab = Arc::new(Slab::map_shared(&memfd, slots, slot_size).map_err(io_err("mmap"))?);
        let worker = Worker::with_slab(slab.clone(), background)?;
        Ok((slab, worker))
    };
    let (slab, worker) = match started() {
        Ok(s) => s,
        Err(e) => {
            let _ = send_msg(&sock, &FromChild::Failed(e.to_string()), false);
            return Err(e);
        }
    };
    drop(memfd);
    let base = slab.base() as u64;
    let worker = Arc::new(worker);
    let info = worker.info();
    let sock = Arc::new(sock);
    send_msg(
        &sock,
        &FromChild::Ready {
            address: info.worker_address,
            rkey: info.rkey,
            base,
        },
        false,
    )
    .map_err(io_err("ready"))?;
    let mut buf = vec![0u8; MAX_MSG];
    let mut peers: HashMap<u64, super::PeerId> = HashMap::new();
    let mut next = 0u64;
    loop {
        let cmd = match recv_msg::<ToChild>(&sock, &mut buf) {
            Ok(Some(c)) => c,
            // The daemon went away (or spoke nonsense): nothing left to serve.
            Ok(None) | Err(_) => return Ok(()),
        };
        match cmd {
            ToChild::Connect { id, address, rkey } => {
                let r = worker
                    .connect(PeerInfo::padded(address, rkey), Duration::from_secs(10))
                    .map(|p| {
                        next += 1;
                        peers.insert(next, p);
                        next
                    })
                    .map_err(|e| e.to_string());
                let _ = send_msg(&sock, &FromChild::Connected { id, peer: r }, false);
            }
            ToChild::Disconnect { peer } => {
                if let Some(p) = peers.remove(&peer) {
                    worker.disconnect(p);
                }
            }
            ToChild::Get {
                id,
                peer,
                remote_addr,
                slot,
                len,
            } => {
                let answer = |error: Option<String>| {
                    let _ = send_msg(&sock, &FromChild::GetDone { id, error }, false);
                };
                let (Some(&p), Some(s)) = (peers.get(&peer), slab.take_index(slot as usize)) else {
                    answer(Some("unknown peer or busy slot".into()));
                    continue;
                };
                if len as usize > s.capacity() {
                    answer(Some("get larger than its slot".into()));
                    continue;
                }
                let done = worker.get(p, remote_addr, s, len as usize);
                let sock = sock.clone();
                // The get's completion is awaited off this loop, so a frozen peer holds
                // nobody else's get.
                std::thread::spawn(move || {
                    let error = match done.wait(Duration::from_secs(120)) {
                        Ok((_slot, Ok(()))) => None,
                        Ok((_slot, Err(e))) => Some(e.to_string()),
                        Err(e) => Some(format!("{e:?}")),
                    };
                    let _ = send_msg(&sock, &FromChild::GetDone { id, error }, false);
                });
            }
        }
    }
}
