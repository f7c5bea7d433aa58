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
