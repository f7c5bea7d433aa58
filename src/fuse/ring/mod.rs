//! FUSE over io_uring (Linux 6.14+, `enable_uring`): the kernel hands each request to a ring
//! entry of the queue of the CPU it was made on, and the reply and the fetch of the next
//! request are one submission; no read or write of /dev/fuse, and the thread that answers
//! stays on the request's CPU. fuser still mounts and answers INIT (where the ring was asked
//! for), FORGET and INTERRUPT on /dev/fuse; the ring carries everything else once every
//! queue has an entry.
//!
//! Each ring thread owns an io_uring with its entries (`queue`): a request's handler runs on it
//! (`dispatch`, the same handlers as fuser's) and answers into the entry (`reply`); the kernel
//! structures are `abi`.

mod abi;
mod dispatch;
mod queue;
mod reply;

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::dev::MAX_REQUEST;
use super::ops::Ops;
use crate::core::source::Source;

/// A ring entry's payload: the kernel refuses one smaller than its largest request or reply
/// (max_write, max_pages: both [`MAX_REQUEST`] here).
const PAYLOAD: usize = MAX_REQUEST as usize;

/// The queues the kernel makes: one per possible CPU (`num_possible_cpus`).
pub fn queues() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    possible_cpus(text.trim())
        .ok_or_else(|| io::Error::other(format!("unreadable list of possible CPUs: {text:?}")))
}

/// How many CPUs a list like `0-3,5` names.
fn possible_cpus(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => {
                b.parse::<usize>()
                    .ok()?
                    .checked_sub(a.parse::<usize>().ok()?)?
                    + 1
            }
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    (n > 0).then_some(n)
}

/// Starts `per_queue` ring threads for each queue of the connection behind `dev`, each pinned
/// to its queue's CPU. `on_ready` runs once every queue has a registered entry (from then on
/// the kernel sends requests by the ring). A thread that fails logs why; requests then keep
/// coming by /dev/fuse if the ring never became ready.
pub fn start<S: Source>(
    ops: Arc<Ops<S>>,
    dev: Arc<OwnedFd>,
    per_queue: usize,
    on_ready: impl Fn() + Send + Sync + 'static,
) -> io::Result<()> {
    let queues = queues()?;
    let registered: Arc<Vec<AtomicUsize>> =
        Arc::new((0..queues).map(|_| AtomicUsize::new(0)).collect());
    let on_ready = Arc::new(on_ready);
    for qid in 0..queues {
        let away = Arc::new(queue::Away::for_queue(per_queue.max(1)));
        for t in 0..per_queue.max(1) {
            let (ops, dev, registered, on_ready, away) = (
                ops.clone(),
                dev.clone(),
                registered.clone(),
                on_ready.clone(),
                away.clone(),
            );
            std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}.{t}"))
                .spawn(move || {
                    pin_to(qid);
                    let first = || {
                        // (SeqCst: of two queues registering at once, one sees the other.)
                        let before = registered[qid].fetch_add(1, Ordering::SeqCst);
                        let all = registered.iter().all(|r| r.load(Ordering::SeqCst) > 0);
                        if before == 0 && all {
                            on_ready();
                        }
                    };
                    let handler =
                        move |a: queue::Arrived<'_>, b, d| dispatch::handle(&ops, a, b, d);
                    match queue::serve(&dev, qid as u16, PAYLOAD, &handler, &away, &first) {
                        Ok(()) => tracing::debug!(qid, "ring queue ended"),
                        Err(e) => tracing::warn!(qid, error = %e, "a ring thread stopped"),
                    }
                })?;
        }
    }
    Ok(())
}

/// Keeps this thread on CPU `cpu` (where the kernel queues that CPU's requests); a CPU that
/// is not online is left to the scheduler.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it for any
    // cpu < CPU_SETSIZE (checked), and sched_setaffinity reads it.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::debug!(cpu, error = %io::Error::last_os_error(), "ring thread not pinned");
        }
    }
}

/// The /dev/fuse descriptor of the session just mounted: fuser opened it and keeps it to
/// itself, and it is the only one in the process before the session's threads clone theirs.
pub fn find_device() -> io::Result<OwnedFd> {
    use std::os::fd::BorrowedFd;
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd")? {
        let e = e?;
        if std::fs::read_link(e.path()).is_ok_and(|t| t == std::path::Path::new("/dev/fuse"))
            && let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>()
        {
            found.push(fd);
        }
    }
    let [fd] = found[..] else {
        return Err(io::Error::other(format!(
            "{} /dev/fuse descriptors in this process, not one",
            found.len()
        )));
    };
    // SAFETY: `fd` was listed open in /proc/self/fd just now and is owned by fuser's session,
    // which outlives this borrow; the duplicate made from it is ours alone.
    unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn possible_cpu_lists() {
        assert_eq!(possible_cpus("0-1"), Some(2));
        assert_eq!(possible_cpus("0"), Some(1));
        assert_eq!(possible_cpus("0-3,5,7-8"), Some(7));
        assert_eq!(possible_cpus("3-1"), None);
        assert_eq!(possible_cpus(""), None);
    }
}
