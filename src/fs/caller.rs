//! What the process behind a request is doing. The kernel looks a name up before it creates
//! it, and FUSE does not say why it looks up: a lookup made for `open(O_CREAT)`, `mkdir` or
//! `rename` must not wait (`--wait`) for somebody else to publish the name the caller is about
//! to create. The caller is blocked in that system call while we answer, so
//! `/proc/<tid>/syscall` tells which one it is.

/// Whether thread `tid` is in a system call that creates names.
pub fn is_creating(tid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{tid}/syscall")) else {
        return false;
    };
    // The number of the system call in decimal, then its arguments in hex.
    let mut fields = text.split_whitespace();
    let Some(Ok(nr)) = fields.next().map(str::parse::<i64>) else {
        return false;
    };
    let args: Vec<u64> = fields
        .map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).unwrap_or(0))
        .collect();
    let flags = |i: usize| args.get(i).copied().unwrap_or(0) as i32;
    creates(nr, flags)
}

/// Whom a request runs for: the ids a file's permission bits are judged against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Credentials {
    /// The caller of a request made by thread `tid` as `uid`:`gid` (the request's own ids),
    /// with the thread's supplementary groups from `/proc/<tid>/status`: none if the thread is
    /// gone already, so an unknown caller gets fewer rights, never more.
    pub fn of_thread(tid: u32, uid: u32, gid: u32) -> Credentials {
        let groups = std::fs::read_to_string(format!("/proc/{tid}/status"))
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
        Credentials { uid, gid, groups }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The process (thread group) of thread `tid`, while it runs.
pub fn process_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// A file: the device number (major, minor) of its file system and its inode number.
pub type FileId = ((u32, u32), u64);

/// Whether process `pid` or one of its descendants still holds file `id`: a descriptor (a
/// `dup`, or a copy a child inherited) or a mapping. A `close()` reaches FUSE as a flush after
/// its descriptor left the table, so what is found here is another reference to the open file
/// (`np.memmap` closes its file and writes through the mapping; a parent closes a file its
/// child is still writing to): sealing it now would fail their later writes.
pub fn held_elsewhere(pid: u32, id: FileId) -> bool {
    /// Processes looked at, at most (a process with more descendants defers the seal).
    const MAX_PROCESSES: usize = 4096;
    let mut todo = vec![pid];
    let mut looked = 0;
    while let Some(p) = todo.pop() {
        looked += 1;
        if looked > MAX_PROCESSES || holds(p, id) {
            return true;
        }
        todo.extend(children(p));
    }
    false
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

/// Whether process `pid` has a descriptor of, or a mapping of, file `id`.
fn holds(pid: u32, id: FileId) -> bool {
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if cached_id(&fd.path()) == Some(id) {
                return true;
            }
        }
    }
    // Each line: range, perms, offset, dev (hex major:minor), inode, path.
    let ((major, minor), ino) = id;
    let dev = format!("{major:02x}:{minor:02x}");
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
        maps.lines().any(|l| {
            let mut f = l.split_whitespace().skip(3);
            f.next() == Some(dev.as_str()) && f.next().and_then(|i| i.parse().ok()) == Some(ino)
        })
    })
}

/// The children of every thread of process `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn creates(nr: i64, flags: impl Fn(usize) -> i32) -> bool {
    let o_creat = |f: i32| f & libc::O_CREAT != 0;
    match nr {
        libc::SYS_openat => o_creat(flags(2)),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open => o_creat(flags(1)),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_creat
        | libc::SYS_mkdir
        | libc::SYS_rename
        | libc::SYS_link
        | libc::SYS_symlink
        | libc::SYS_mknod => true,
        libc::SYS_mkdirat
        | libc::SYS_renameat
        | libc::SYS_renameat2
        | libc::SYS_linkat
        | libc::SYS_symlinkat
        | libc::SYS_mknodat => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_descriptor_or_a_mapping_of_the_file_is_found() {
        let dir = std::env::temp_dir().join(format!("dyadfs-held-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let dev = meta.dev();
        let dev = (libc::major(dev), libc::minor(dev));
        let id = (dev, meta.ino());
        let me = std::process::id();
        assert!(!held_elsewhere(me, id));
        // Another file system's file with the same inode number is not it.
        assert!(!held_elsewhere(me, ((dev.0 + 1, dev.1), meta.ino())));
        let f = std::fs::File::open(&path).unwrap();
        assert!(held_elsewhere(me, id));
        // SAFETY: a private read-only mapping of a file this test owns, unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        drop(f);
        assert!(held_elsewhere(me, id), "the mapping holds it");
        // SAFETY: the mapping made above, of that length, not used after.
        unsafe { libc::munmap(map, 4096) };
        assert!(!held_elsewhere(me, id));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn creating_calls_are_told_apart_from_reads() {
        let args = |f: i32| move |i: usize| if i == 2 { f } else { 0 };
        assert!(creates(
            libc::SYS_openat,
            args(libc::O_WRONLY | libc::O_CREAT)
        ));
        assert!(!creates(libc::SYS_openat, args(libc::O_RDONLY)));
        assert!(creates(libc::SYS_mkdirat, args(0)));
        assert!(!creates(libc::SYS_newfstatat, args(0)));
    }

    #[test]
    fn a_thread_blocked_in_an_open_with_o_creat_is_creating() {
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
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            // SAFETY: a valid path; blocks until the reader below opens the FIFO.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CREAT, 0o600) };
            // SAFETY: closing the descriptor we opened.
            unsafe { libc::close(fd) };
        });
        let tid = rx.recv().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !is_creating(tid) {
            assert!(std::time::Instant::now() < deadline, "never seen creating");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _reader = std::fs::File::open(dir.join("p")).unwrap();
        t.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        // SAFETY: gettid has no preconditions.
        assert!(!is_creating(unsafe { libc::gettid() } as u32));
    }

    #[test]
    fn a_thread_belongs_to_its_process() {
        let me = std::process::id();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
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
