//! The children of a process (of all its threads), read from `/proc/PID/task/TID/children`
//! through files kept open: reading an open one again takes a microsecond, where an open walks
//! /proc. (1% of a producer's closes once took 10-33 ms in that open, on Linux 6.18 during the
//! hand-off benchmark; the stall was most likely the daemon's descriptor table growing, which
//! `sys::presize_descriptor_table` now does at start.) A process's files are kept while it
//! lives: its pidfd says when it has exited, after which its number may name another process
//! whose children these files would not list. A thread's file is kept with the thread's own
//! pidfd for the same reason inside a process (Linux 6.9 and later; before, it is opened again
//! at each look).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, MutexGuard};

/// Processes whose files are kept, at most (those that exited go first, then all), and threads
/// of one process (the rest are opened at each look): 1,024 descriptors at most (a file and a
/// pidfd per thread), which the cache's data files need more (a producer, `cp`, `tar` or a
/// Python script, has a few threads).
const MAX_PROCESSES: usize = 16;
const MAX_THREADS: usize = 32;

/// Open `children` files, by process.
#[derive(Default)]
pub struct Children {
    processes: Mutex<HashMap<u32, Kept>>,
}

/// One live process's files: its pidfd and each thread's `children` file with the thread's own
/// pidfd, which says when that thread has exited (its id may then be given to a new thread of
/// the same process, whose children the old file would not list).
struct Kept {
    pidfd: OwnedFd,
    threads: HashMap<u32, (OwnedFd, File)>,
}

impl Children {
    /// The processes whose parent is a thread of process `pid`; none if it has gone.
    pub fn of(&self, pid: u32) -> Vec<u32> {
        let Ok(tids) = threads(pid) else {
            lock(&self.processes).remove(&pid);
            return Vec::new();
        };
        // Taken out while it is read, so that no open (the slow part) happens under the lock.
        let kept = lock(&self.processes)
            .remove(&pid)
            .filter(|k| !exited(&k.pidfd));
        let mut kept = match kept {
            Some(k) => k,
            None => match pidfd_open(pid) {
                Ok(pidfd) => Kept {
                    pidfd,
                    threads: HashMap::new(),
                },
                // Gone since its threads were listed, or a kernel without pidfds (before 5.3):
                // read without keeping anything.
                Err(_) => return uncached(pid, &tids),
            },
        };
        kept.threads
            .retain(|tid, (thread, _)| tids.contains(tid) && !exited(thread));
        let mut out = Vec::new();
        for &tid in &tids {
            let text = match kept.threads.get(&tid) {
                Some((_, f)) => read_all(f),
                None => match File::open(path(pid, tid)) {
                    Ok(f) => {
                        let text = read_all(&f);
                        // Kept only with the thread's own pidfd (Linux 6.9 and later): else
                        // opened again at each look.
                        if kept.threads.len() < MAX_THREADS
                            && let Ok(thread) = pidfd_open_thread(tid)
                        {
                            kept.threads.insert(tid, (thread, f));
                        }
                        text
                    }
                    Err(_) => continue,
                },
            };
            out.extend(parse(&text));
        }
        let mut all = lock(&self.processes);
        if all.len() >= MAX_PROCESSES {
            all.retain(|_, k| !exited(&k.pidfd));
            if all.len() >= MAX_PROCESSES {
                all.clear();
            }
        }
        all.insert(pid, kept);
        out
    }

    /// Processes whose files are kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        lock(&self.processes).len()
    }

    /// Threads of process `pid` whose files are kept now.
    #[cfg(test)]
    fn kept_threads(&self, pid: u32) -> usize {
        lock(&self.processes)
            .get(&pid)
            .map_or(0, |k| k.threads.len())
    }
}

/// A lock that outlives a panic of its holder (what it guards is only a cache).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The thread ids of process `pid`.
fn threads(pid: u32) -> io::Result<Vec<u32>> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/task"))?
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect())
}

fn path(pid: u32, tid: u32) -> String {
    format!("/proc/{pid}/task/{tid}/children")
}

/// Reads without keeping files (see [`Children::of`]).
fn uncached(pid: u32, tids: &[u32]) -> Vec<u32> {
    tids.iter()
        .filter_map(|&tid| std::fs::read_to_string(path(pid, tid)).ok())
        .flat_map(|t| parse(&t))
        .collect()
}

/// A `children` file's whole text, read from its start (a seq_file: each read from offset 0
/// lists the children anew).
fn read_all(f: &File) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match f.read_at(&mut buf, out.len() as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse(text: &str) -> Vec<u32> {
    text.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A pidfd of thread `tid` alone (`PIDFD_THREAD`, Linux 6.9): readable once that thread exits.
fn pidfd_open_thread(tid: u32) -> io::Result<OwnedFd> {
    // The kernel's PIDFD_THREAD is O_EXCL (include/uapi/linux/pidfd.h); libc does not name it.
    const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;
    // SAFETY: pidfd_open takes a thread id and flags and touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::pid_t, PIDFD_THREAD) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the call returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process (or thread) of `pidfd` has exited (a pidfd polls readable then).
fn exited(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd that lives for the call; a zero timeout never blocks.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn spawn(script: &str) -> std::process::Child {
        Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_process_children_are_listed_again_from_kept_files_until_it_exits() {
        let children = Children::default();
        // A shell whose child sleeps: the shell's only child, named on its first line.
        let mut shell = spawn("sleep 30 & echo $!; wait");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(shell.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let sleeper: u32 = line.trim().parse().unwrap();
        let pid = shell.id();
        assert_eq!(children.of(pid), vec![sleeper]);
        assert_eq!(children.kept(), 1);
        // The shell's one thread, with its own pidfd (Linux 6.9 and later).
        assert_eq!(children.kept_threads(pid), 1);
        // Read again through the kept file: the same answer.
        assert_eq!(children.of(pid), vec![sleeper]);
        // Our own children include the shell, beside whatever else the test runner started.
        assert!(children.of(std::process::id()).contains(&pid));
        // The sleeper goes: the kept file lists nothing.
        // SAFETY: kill takes a pid and a signal and touches no memory.
        unsafe { libc::kill(sleeper as i32, libc::SIGKILL) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !children.of(pid).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the killed child is still listed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        shell.kill().unwrap();
        shell.wait().unwrap();
        // The shell itself has gone: nothing listed, and its files are let go at the next look.
        assert!(children.of(pid).is_empty());
        assert!(!lock(&children.processes).contains_key(&pid));
    }
}
