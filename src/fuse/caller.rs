//! Who sent a request and what its process is doing, read from `/proc`: the kernel adapter's
//! side of the file system's caller port ([`Context`]), and whether an opener still holds a
//! file it closes (a producer's `close()`). The caller is blocked in its system call while we
//! answer, so `/proc/<tid>/syscall` tells which one it is (see `fs/caller.rs` for why that
//! matters).

use crate::fs::caller::{Context, Credentials, OpeningToRead};
use crate::sys::children::Children;

/// Who sent a request: its ids and the thread the kernel names (the FUSE header's `pid` is the
/// calling thread's id).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Context for Caller {
    fn uid(&self) -> u32 {
        self.uid
    }

    fn gid(&self) -> u32 {
        self.gid
    }

    fn thread(&self) -> u32 {
        self.pid
    }

    fn process(&self) -> Option<(u32, u32)> {
        status_numbers(self.pid, ["Tgid:", "PPid:"]).map(|[pid, parent]| (pid, parent))
    }

    fn opening_to_read(&self) -> Option<OpeningToRead> {
        opening_to_read(self.pid)
    }

    /// The request's own ids, with the thread's supplementary groups from
    /// `/proc/<tid>/status`: none if the thread is gone already.
    fn credentials(&self) -> Credentials {
        let groups = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                let line = s.lines().find_map(|l| l.strip_prefix("Groups:"))?;
                Some(
                    line.split_whitespace()
                        .filter_map(|g| g.parse().ok())
                        .collect(),
                )
            })
            .unwrap_or_default();
        Credentials {
            uid: self.uid,
            gid: self.gid,
            groups,
        }
    }
}

/// What thread `tid` opens, if it is opening a name to read it: `open`, `openat` or `openat2`
/// without `O_CREAT`, `O_DIRECTORY` or `O_PATH`, for reading or reading and writing. Anything
/// else, and a thread that cannot be told, is not.
fn opening_to_read(tid: u32) -> Option<OpeningToRead> {
    let text = blocked_syscall(tid)?;
    // The number of the system call in decimal, then its arguments in hex.
    let mut fields = text.split_whitespace();
    let nr = fields.next()?.parse::<i64>().ok()?;
    let args: Vec<u64> = fields
        .map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).unwrap_or(0))
        .collect();
    let arg = |i: usize| args.get(i).copied().unwrap_or(0);
    let mem = std::fs::File::open(format!("/proc/{tid}/mem")).ok();
    // openat2's flags are the first field of the `open_how` it points to, in its memory.
    let how = |at: u64| {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        mem.as_ref()?.read_exact_at(&mut b, at).ok()?;
        Some(u64::from_ne_bytes(b))
    };
    if !opens_to_read(nr, arg, how) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    let at = if nr == libc::SYS_open { arg(0) } else { arg(1) };
    #[cfg(not(target_arch = "x86_64"))]
    let at = arg(1);
    let path = mem.map(|m| c_string_at(&m, at)).unwrap_or_default();
    Some(OpeningToRead {
        last: last_component(&path).to_vec(),
    })
}

/// `/proc/<tid>/syscall` once the thread is off its CPU. A thread that has just sent a FUSE
/// request may still be running when the daemon reads the request (on a machine with many
/// cores, the daemon's thread runs at once): the kernel then writes "running" instead of the
/// call. The thread is about to sleep until it is answered, so it is asked again, for up to
/// [`OFF_CPU_WAIT`]; taking "running" for an answer made a consumer's open under `--wait`
/// fail with ENOENT at once (seen on a 16-core machine).
fn blocked_syscall(tid: u32) -> Option<String> {
    let path = format!("/proc/{tid}/syscall");
    let deadline = std::time::Instant::now() + OFF_CPU_WAIT;
    loop {
        let text = std::fs::read_to_string(&path).ok()?;
        if !text.starts_with("running") || std::time::Instant::now() >= deadline {
            return Some(text);
        }
        std::thread::sleep(std::time::Duration::from_micros(20));
    }
}

/// How long a thread is waited for to leave its CPU (see [`blocked_syscall`]).
const OFF_CPU_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// The NUL-terminated string at `at` in a process's memory (at most `PATH_MAX` bytes; empty if
/// it cannot be read), read a page at a time (the next page may not be mapped).
fn c_string_at(mem: &std::fs::File, mut at: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    const PAGE: u64 = 4096;
    let mut out = Vec::new();
    while out.len() < libc::PATH_MAX as usize {
        let mut buf = vec![0u8; (PAGE - at % PAGE) as usize];
        let Ok(n) = mem.read_at(&mut buf, at) else {
            return Vec::new();
        };
        if n == 0 {
            return Vec::new();
        }
        if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..end]);
            return out;
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    Vec::new()
}

/// The last component of a path (trailing slashes aside).
fn last_component(path: &[u8]) -> &[u8] {
    let trimmed = match path.iter().rposition(|&b| b != b'/') {
        Some(i) => &path[..=i],
        None => return &[],
    };
    match trimmed.iter().rposition(|&b| b == b'/') {
        Some(i) => &trimmed[i + 1..],
        None => trimmed,
    }
}

/// The numbers of fields `keys` (`"Tgid:"`, `"PPid:"`...) of thread `tid`'s
/// `/proc/<tid>/status`, read once, while it runs.
fn status_numbers<const N: usize>(tid: u32, keys: [&str; N]) -> Option<[u32; N]> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let mut out = [0; N];
    for (slot, key) in out.iter_mut().zip(keys) {
        *slot = status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .trim()
            .parse()
            .ok()?;
    }
    Some(out)
}

/// Whether system call `nr` with arguments `arg(i)` opens to read (`how(ptr)`: the first 8
/// bytes at the caller's address `ptr`).
fn opens_to_read(nr: i64, arg: impl Fn(usize) -> u64, how: impl Fn(u64) -> Option<u64>) -> bool {
    let reading = |flags: u64| {
        let f = flags as i32;
        f & (libc::O_CREAT | libc::O_DIRECTORY | libc::O_PATH) == 0
            && matches!(f & libc::O_ACCMODE, libc::O_RDONLY | libc::O_RDWR)
    };
    match nr {
        libc::SYS_openat => reading(arg(2)),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open => reading(arg(1)),
        libc::SYS_openat2 => how(arg(2)).is_some_and(reading),
        _ => false,
    }
}

/// The process (thread group) of thread `tid`, while it runs.
pub fn process_of(tid: u32) -> Option<u32> {
    status_numbers(tid, ["Tgid:"]).map(|[pid]| pid)
}

/// A file: the device number (major, minor) of its file system and its inode number.
pub type FileId = ((u32, u32), u64);

/// Whether process `pid` or one of its descendants still holds file `id`: a descriptor (a
/// `dup`, or a copy a child inherited) or a shared mapping. A `close()` reaches FUSE as a flush
/// after its descriptor left the table, so what is found here is another reference to the open
/// file that may write to it (`np.memmap` closes its file and writes through the mapping; a
/// parent closes a file its child is still writing to): sealing it now would fail their later
/// writes. A private mapping never writes to its file (its reads keep going to the handle's
/// staged copy after the seal), so it holds nothing back.
///
/// A child spawned by another thread (`subprocess`, Rust's `Command`) holds a copy of every
/// descriptor of its parent until its exec, which closes those marked close-on-exec. Counted,
/// such a copy would leave the file unpublished when `close()` returns, so a child that holds
/// the file only by such copies is waited out: a `vfork` child (sharing its parent's memory
/// until it execs) for up to [`EXEC_WAIT`], any other (`fork` then exec, or a child already
/// past the exec's switch of memory but not yet at its closing of descriptors) for up to
/// [`FORK_WAIT`]: a forked worker that keeps the copy (`multiprocessing`) costs the close that
/// long, then holds the file as before.
pub fn held_elsewhere(pid: u32, id: FileId, children: Option<&Children>) -> bool {
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_micros(200);
    loop {
        let waited = start.elapsed();
        match hold_in_tree(pid, id, children) {
            Hold::No => return false,
            Hold::Yes => return true,
            Hold::UntilVforkExecs if waited >= EXEC_WAIT => return true,
            Hold::UntilForkExecs if waited >= FORK_WAIT => return true,
            Hold::UntilVforkExecs | Hold::UntilForkExecs => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// The longest a close waits for a `vfork` child to exec (a stopped one holds it that long).
pub const EXEC_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest a close waits for another child holding close-on-exec copies to exec.
pub const FORK_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// How a process holds a file, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Hold {
    No,
    /// Only by close-on-exec descriptors of a `vfork` child.
    UntilVforkExecs,
    /// Only by close-on-exec descriptors of another child.
    UntilForkExecs,
    Yes,
}

/// How `pid` and its descendants (`None`: it alone) hold file `id` (the strongest of theirs).
fn hold_in_tree(pid: u32, id: FileId, children: Option<&Children>) -> Hold {
    /// Processes looked at, at most (a process with more descendants defers the seal).
    const MAX_PROCESSES: usize = 4096;
    let mut todo = vec![(pid, None)];
    let mut looked = 0;
    let mut hold = Hold::No;
    while let Some((p, parent)) = todo.pop() {
        looked += 1;
        if looked > MAX_PROCESSES {
            return Hold::Yes;
        }
        hold = hold.max(holds(p, id, parent));
        if hold == Hold::Yes {
            return hold;
        }
        if let Some(children) = children {
            todo.extend(children.of(p).into_iter().map(|c| (c, Some(p))));
        }
    }
    hold
}

/// The device and inode of `path` as the kernel has them cached: never a request to a file
/// system (a FUSE mount may be this very daemon, busy answering the caller).
fn cached_id(path: &std::path::Path) -> Option<FileId> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statx is all-zero-bit-pattern valid plain data.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statx buffer that live for the call.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO,
            &mut stx,
        )
    };
    (r == 0).then_some(((stx.stx_dev_major, stx.stx_dev_minor), stx.stx_ino))
}

/// The device number of the file system mounted at `mountpoint`.
pub fn device_of(mountpoint: &std::path::Path) -> Option<(u32, u32)> {
    cached_id(mountpoint).map(|(dev, _)| dev)
}

/// How process `pid` holds file `id`: by a descriptor or a shared mapping. `parent`: that of
/// a descendant of the process that closed, whose close-on-exec descriptors may be on their
/// way out (whether it is a `vfork` child is asked only of one holding such a descriptor).
fn holds(pid: u32, id: FileId, parent: Option<u32>) -> Hold {
    let mut hold = Hold::No;
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if cached_id(&fd.path()) != Some(id) {
                continue;
            }
            let Some(parent) = parent else {
                return Hold::Yes;
            };
            hold = match close_on_exec(pid, &fd.file_name()) {
                // Gone since it was listed (the child's exec closed it).
                None => hold,
                Some(false) => return Hold::Yes,
                Some(true) if crate::sys::shares_memory(pid, parent) => {
                    hold.max(Hold::UntilVforkExecs)
                }
                Some(true) => hold.max(Hold::UntilForkExecs),
            };
        }
    }
    if hold == Hold::UntilVforkExecs {
        // Its mappings are its parent's, looked at already.
        return hold;
    }
    if mapped_shared(pid, id) {
        Hold::Yes
    } else {
        hold
    }
}

/// Whether process `pid` has a shared mapping of file `id`.
fn mapped_shared(pid: u32, id: FileId) -> bool {
    let ((major, minor), ino) = id;
    match crate::sys::maps_shared(pid, (major, minor), ino) {
        Ok(Some(mapped)) => return mapped,
        // Gone, or not ours to look at: as reading its maps would find.
        Err(_) => return false,
        Ok(None) => {}
    }
    // A kernel before 6.11: its maps as text. Each line: range, perms ("rw-s": shared),
    // offset, dev (hex major:minor), inode, path.
    let dev = format!("{major:02x}:{minor:02x}");
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
        maps.lines().any(|l| {
            let mut f = l.split_whitespace().skip(1);
            let shared = f.next().is_some_and(|perms| perms.ends_with('s'));
            let mut f = f.skip(1);
            shared
                && f.next() == Some(dev.as_str())
                && f.next().and_then(|i| i.parse().ok()) == Some(ino)
        })
    })
}

/// Whether descriptor `fd` of process `pid` is closed at its exec (its `fdinfo` flags, in
/// octal, have `O_CLOEXEC`); `None` if it is gone (closed, or its process exited).
fn close_on_exec(pid: u32, fd: &std::ffi::OsStr) -> Option<bool> {
    let path = format!("/proc/{pid}/fdinfo/{}", fd.to_string_lossy());
    let info = std::fs::read_to_string(path).ok()?;
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok());
    // Unreadable flags: taken as a descriptor that stays.
    Some(flags.is_some_and(|flags| flags & libc::O_CLOEXEC as u32 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_descriptor_or_a_shared_mapping_of_the_file_is_found() {
        let dir = std::env::temp_dir().join(format!("dyadfs-held-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let dev = meta.dev();
        let dev = (libc::major(dev), libc::minor(dev));
        let id = (dev, meta.ino());
        let kids = Children::default();
        let me = std::process::id();
        assert!(!held_elsewhere(me, id, Some(&kids)));
        // Another file system's file with the same inode number is not it.
        assert!(!held_elsewhere(
            me,
            ((dev.0 + 1, dev.1), meta.ino()),
            Some(&kids)
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        assert!(held_elsewhere(me, id, Some(&kids)));
        let private = crate::sys::MappedPage::new(&f, libc::MAP_PRIVATE);
        let shared = crate::sys::MappedPage::new(&f, libc::MAP_SHARED);
        drop(f);
        assert!(
            held_elsewhere(me, id, Some(&kids)),
            "the shared mapping holds it"
        );
        drop(shared);
        assert!(
            !held_elsewhere(me, id, Some(&kids)),
            "a private mapping never writes to the file: it holds nothing back"
        );
        drop(private);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A forked child's copy of the file: one closed at exec is waited out for [`FORK_WAIT`]
    /// (the child may be on its way to an exec), then holds the file; an inherited one holds it
    /// at once. (In a Python process of its own: a fork here would copy every other test's
    /// descriptors.)
    #[test]
    fn a_forked_childs_copy_holds_the_file_an_exec_closes_it_after_a_wait() {
        const FORKS: &str = r#"
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
os.set_inheritable(fd, sys.argv[2] == "inherited")
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
os.close(fd)
print(pid, flush=True)
sys.stdin.readline()
os.kill(pid, 9)
os.waitpid(pid, 0)
"#;
        let dir = std::env::temp_dir().join(format!("dyadfs-forked-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, [0u8; 16]).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let id = (
            (libc::major(meta.dev()), libc::minor(meta.dev())),
            meta.ino(),
        );
        for copy in ["closed at exec", "inherited"] {
            let mut parent = std::process::Command::new("python3")
                .args(["-c", FORKS])
                .arg(&path)
                .arg(copy)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(parent.stdout.as_mut().unwrap()),
                &mut line,
            )
            .unwrap();
            let started = std::time::Instant::now();
            let held = held_elsewhere(parent.id(), id, Some(&Children::default()));
            let took = started.elapsed();
            drop(parent.stdin.take());
            assert!(parent.wait().unwrap().success());
            assert!(held, "{copy}: the child's copy holds the file");
            if copy == "inherited" {
                assert!(took < FORK_WAIT, "{copy}: {took:?}");
            } else {
                assert!(took >= FORK_WAIT, "{copy}: {took:?}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_opens_to_read_are_told_reading() {
        let args = |f: i32| move |i: usize| if i == 2 { f as u64 } else { 0 };
        let no_how = |_: u64| None;
        let reads = |nr, f| opens_to_read(nr, args(f), no_how);
        assert!(reads(libc::SYS_openat, libc::O_RDONLY));
        assert!(reads(libc::SYS_openat, libc::O_RDWR | libc::O_CLOEXEC));
        assert!(!reads(libc::SYS_openat, libc::O_WRONLY | libc::O_CREAT));
        assert!(!reads(libc::SYS_openat, libc::O_RDONLY | libc::O_CREAT));
        assert!(!reads(libc::SYS_openat, libc::O_WRONLY | libc::O_TRUNC));
        assert!(!reads(libc::SYS_openat, libc::O_RDONLY | libc::O_DIRECTORY));
        assert!(!reads(libc::SYS_openat, libc::O_PATH));
        // stat, access, mkdir, rename: never.
        for nr in [
            libc::SYS_newfstatat,
            libc::SYS_faccessat,
            libc::SYS_mkdirat,
            libc::SYS_statx,
        ] {
            assert!(!reads(nr, 0), "{nr}");
        }
        // openat2: the flags in its `open_how`.
        let how = |f: i32| move |_: u64| Some(f as u64);
        assert!(opens_to_read(
            libc::SYS_openat2,
            args(0),
            how(libc::O_RDONLY)
        ));
        assert!(!opens_to_read(
            libc::SYS_openat2,
            args(0),
            how(libc::O_CREAT | libc::O_WRONLY)
        ));
        assert!(!opens_to_read(libc::SYS_openat2, args(0), no_how));
    }

    #[test]
    fn the_last_component_of_a_path() {
        assert_eq!(last_component(b"/dyad/run/f.bin"), b"f.bin");
        assert_eq!(last_component(b"run/sub/"), b"sub");
        assert_eq!(last_component(b"f"), b"f");
        assert_eq!(last_component(b"/"), b"");
        assert_eq!(last_component(b""), b"");
    }

    #[test]
    fn a_thread_still_running_into_its_open_is_waited_for() {
        // A thread that runs a while before it blocks in an open for reading: asked while it
        // runs, the answer is its open (the kernel's "running" is not taken for an answer).
        let dir = std::env::temp_dir().join(format!("dyadfs-running-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo =
            std::ffi::CString::new(dir.join("q").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        let t = std::thread::spawn(move || {
            tx.send(crate::sys::gettid()).unwrap();
            let spin = std::time::Instant::now();
            while spin.elapsed() < std::time::Duration::from_millis(3) {
                std::hint::spin_loop();
            }
            // SAFETY: a valid path; blocks until the writer below opens the FIFO.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
            // SAFETY: closing the descriptor we opened.
            unsafe { libc::close(fd) };
        });
        let tid = rx.recv().unwrap();
        let seen = opening_to_read(tid);
        let _writer = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("q"))
            .unwrap();
        t.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(seen.map(|o| o.last), Some(b"q".to_vec()));
    }

    #[test]
    fn a_thread_blocked_in_an_open_for_reading_is_told_so() {
        // An open of a FIFO for writing blocks until a reader comes: long enough to look.
        let dir = std::env::temp_dir().join(format!("dyadfs-caller-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo =
            std::ffi::CString::new(dir.join("p").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        let t = std::thread::spawn(move || {
            tx.send(crate::sys::gettid()).unwrap();
            // SAFETY: a valid path; blocks until the writer below opens the FIFO.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
            // SAFETY: closing the descriptor we opened.
            unsafe { libc::close(fd) };
        });
        let tid = rx.recv().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while opening_to_read(tid).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "never seen opening to read"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // And what it opens: the path's last component, read from its memory.
        assert_eq!(opening_to_read(tid).unwrap().last, b"p");
        let _writer = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("p"))
            .unwrap();
        t.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(opening_to_read(crate::sys::gettid()).is_none());
    }

    #[test]
    fn a_process_or_its_child_told_a_name_is_absent_is_not_waiting_for_it() {
        let told = crate::fs::caller::ToldAbsent::default();
        let of = |pid| Caller {
            uid: 0,
            gid: 0,
            pid,
        };
        let me = of(crate::sys::gettid());
        assert!(!told.told(&me, "run/x"));
        told.tell(&me, "run/x");
        assert!(told.told(&me, "run/x"));
        assert!(!told.told(&me, "run/y"), "another name");
        // A child process of ours: told through its parent.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(told.told(&of(child.id()), "run/x"));
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_thread_belongs_to_its_process() {
        let me = std::process::id();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tid_tx.send(crate::sys::gettid()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        assert_ne!(tid, me);
        assert_eq!(
            process_of(tid),
            Some(me),
            "a running thread names its process"
        );
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(process_of(me), Some(me));
        assert_eq!(process_of(u32::MAX), None);
    }
}
