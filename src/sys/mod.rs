//! The process's own calls into the system that no layer owns: file system space, the
//! descriptor limit, thread priority, signals, returning freed memory, which pages the page
//! cache holds, O_DIRECT, preallocation and a mount's readahead (a sysfs knob). Each wraps one
//! libc call or kernel file so the rest of the code calls Rust. (Calls that are a module's whole
//! purpose stay in it: UCX in `transport::ucx`, mappings in `cache::mapping`, `openat2` in
//! `fs::backing`.)
//! [`private`]: paths root must not be redirected through. [`children`]: a process's children,
//! through `/proc` files kept open. [`identity`]: acting as another user for one check (the node
//! service). [`seqpacket`]: the node service's local socket (messages, a descriptor with one,
//! the caller as the kernel knows it).

pub mod children;
pub mod elf;
pub mod identity;
pub mod private;
pub mod seqpacket;

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// The calling thread's id. By the system call, not glibc's wrapper, which only glibc 2.30+
/// has (the wheel is built for glibc 2.28).
pub fn gettid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// `statvfs(2)` of the file system holding `path`.
pub fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs is plain data, fully written by the call on success.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s)
}

/// Raises the soft limit of open files to the hard limit (shells commonly start at 1,024) and
/// returns the limit in force.
pub fn raise_descriptor_limit() -> u64 {
    // SAFETY: rlimit is plain data, fully written by getrlimit on success.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer for the call only.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "getrlimit(RLIMIT_NOFILE)");
        return 1024;
    }
    let soft = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: a valid pointer to an initialised rlimit, for the call only.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    tracing::info!(
        from = soft,
        to = lim.rlim_cur,
        hard = lim.rlim_max,
        "descriptor limit"
    );
    lim.rlim_cur
}

/// Makes the process's descriptor table hold `n` descriptors now. The kernel grows the table by
/// doubling as descriptors are opened, and in a process with several threads each growth waits
/// a whole RCU grace period (`expand_files` -> `synchronize_rcu`: 15-30 ms on a 16-core host)
/// inside whichever open crossed 64, 128, 256 ...: in a daemon's first seconds that was the
/// slowest 1% of its lookups (seen by sampling the threads' kernel stacks). Called before the
/// threads start, the growth waits for nothing; the table never shrinks.
pub fn presize_descriptor_table(n: u64) {
    let last = n.clamp(1, i32::MAX as u64) as i32 - 1;
    let Ok(dir) = File::open("/") else { return };
    // SAFETY: duplicates a live descriptor onto the lowest free number >= `last`; the result
    // is checked and closed at once.
    let dup = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, last) };
    if dup < 0 {
        tracing::debug!(n, error = %io::Error::last_os_error(), "descriptor table not presized");
        return;
    }
    // SAFETY: `dup` was just opened above and is owned by nothing else.
    drop(unsafe { OwnedFd::from_raw_fd(dup) });
}

/// Gives the calling thread the lowest CPU priority (nice 19; Linux sets it per thread): the
/// threads of background copies (`--replicate`) then run on CPU the readers leave idle.
pub fn lower_thread_priority() {
    // SAFETY: setpriority only reads its arguments.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, gettid() as libc::id_t, 19) };
    if r != 0 {
        let e = io::Error::last_os_error();
        tracing::warn!(error = %e, "a background thread keeps its priority");
    }
}

/// The offset of the first byte of data in `file` at or after `offset` (`lseek(SEEK_DATA)`);
/// `None` when only a hole follows. A file system that does not know holes says every byte is
/// data.
pub fn seek_data(file: &std::fs::File, offset: u64) -> io::Result<Option<u64>> {
    use std::os::fd::AsRawFd;
    let at = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: lseek on a descriptor `file` owns; it moves only the file offset, which nothing
    // else of ours relies on (every read and write of the cache is positioned).
    match unsafe { libc::lseek(file.as_raw_fd(), at, libc::SEEK_DATA) } {
        -1 => match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
            e => Err(e),
        },
        data => Ok(Some(data as u64)),
    }
}

/// The offset of the first hole in `file` at or after `offset` (`lseek(SEEK_HOLE)`; the end
/// of the file is one).
pub fn seek_hole(file: &std::fs::File, offset: u64) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    let at = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: as in `seek_data`.
    match unsafe { libc::lseek(file.as_raw_fd(), at, libc::SEEK_HOLE) } {
        -1 => Err(io::Error::last_os_error()),
        hole => Ok(hole as u64),
    }
}

/// Detaches the mount at `path` (`umount2(MNT_DETACH)`): gone from the tree at once, though
/// files still open on it (which made a plain unmount fail with EBUSY) keep it alive.
pub fn detach(path: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated path; umount2 touches no memory of ours.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The readahead, in KiB, of the file systems on device `(major, minor)` (`/sys/class/bdi/
/// MAJOR:MINOR/read_ahead_kb`): read, and set (root only).
pub fn readahead_kib((major, minor): (u32, u32)) -> io::Result<u32> {
    let s = std::fs::read_to_string(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"))?;
    s.trim()
        .parse()
        .map_err(|_| io::Error::other("read_ahead_kb: not a number"))
}

pub fn set_readahead_kib((major, minor): (u32, u32), kib: u32) -> io::Result<()> {
    std::fs::write(
        format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"),
        kib.to_string(),
    )
}

/// The signals that unmount a daemon.
pub struct StopSignals(libc::sigset_t);

impl StopSignals {
    /// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and every thread it starts
    /// from then on, so that one thread takes them with [`StopSignals::wait`].
    pub fn block() -> StopSignals {
        // SAFETY: sigset_t is plain data initialised by sigemptyset; pthread_sigmask only
        // reads it.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            set
        };
        StopSignals(set)
    }

    /// Waits for one of the signals; returns its number.
    pub fn wait(&self) -> i32 {
        let mut sig = 0;
        // SAFETY: the set is an initialised sigset_t and `sig` a valid out pointer.
        unsafe { libc::sigwait(&self.0, &mut sig) };
        sig
    }
}

/// Fixes malloc's mmap threshold at 1 MiB. glibc otherwise raises it to the size of any large
/// block freed (the cache's load tables, tens of MiB), after which each FUSE thread's 16 MiB
/// request buffer comes from the heap and is zeroed page by page: 16 MiB of RSS per thread
/// instead of the few pages requests touch of a fresh mapping.
pub fn fix_mmap_threshold() {
    // SAFETY: mallopt only changes an allocator setting; called before other threads start.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
}

/// Returns freed heap memory to the system (loading a million cache headers leaves tens of MiB
/// of it behind).
pub fn release_free_memory() {
    // SAFETY: malloc_trim only releases free heap memory; it touches no live allocation.
    unsafe { libc::malloc_trim(0) };
}

/// Whether this process has `CAP_SYS_ADMIN` (what FUSE passthrough needs to hand the kernel a
/// backing file), from `CapEff` in `/proc/self/status`.
pub fn has_cap_sys_admin() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
            u64::from_str_radix(hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// Whether every page of `[offset, offset + len)` of `file` is in the page cache, asked without
/// reading anything (`cachestat(2)`, Linux >= 6.5; `None` where unsupported). A probing read
/// would start readahead into the page cache, the very copy to avoid.
pub fn pages_cached(file: &std::fs::File, offset: u64, len: usize) -> Option<bool> {
    use std::os::fd::AsRawFd;
    /// cachestat's number on every architecture (numbers from 424 on are shared).
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range {
        off: offset,
        len: len as u64,
    };
    let mut stat = Stat::default();
    // SAFETY: both pointers are to live structs with the kernel's layout, for the call only.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    (r == 0).then(|| stat.nr_cache >= (len as u64).div_ceil(page))
}

/// Whether processes `a` and `b` share one address space (`kcmp` `KCMP_VM`): a `vfork` child
/// and its parent until the child execs or exits. Not if that cannot be told (a kernel built
/// without `kcmp`, or processes this one may not inspect).
pub fn shares_memory(a: u32, b: u32) -> bool {
    /// `enum kcmp_type` in linux/kcmp.h.
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp reads nothing from this process's memory; its arguments are plain numbers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            a as libc::c_long,
            b as libc::c_long,
            KCMP_VM,
            0,
            0,
        )
    };
    r == 0
}

/// Whether process `pid` has a shared mapping of file `ino` of device `(major, minor)`, asked
/// of the kernel one shared file-backed mapping at a time (`PROCMAP_QUERY` on
/// `/proc/PID/maps`, Linux >= 6.11): no text is made, where reading `maps` formats every
/// mapping's path (hundreds of microseconds for a process with torch loaded), and the kernel
/// skips the private mappings (a process's libraries) itself. `Ok(None)` where the kernel has
/// no such query.
pub fn maps_shared(pid: u32, (major, minor): (u32, u32), ino: u64) -> io::Result<Option<bool>> {
    use std::os::fd::AsRawFd;
    /// `struct procmap_query` (include/uapi/linux/fs.h).
    #[repr(C)]
    #[derive(Default)]
    struct Query {
        size: u64,
        query_flags: u64,
        query_addr: u64,
        vma_start: u64,
        vma_end: u64,
        vma_flags: u64,
        vma_page_size: u64,
        vma_offset: u64,
        inode: u64,
        dev_major: u32,
        dev_minor: u32,
        vma_name_size: u32,
        build_id_size: u32,
        vma_name_addr: u64,
        build_id_addr: u64,
    }
    /// `_IOWR('f', 17, struct procmap_query)`.
    const PROCMAP_QUERY: libc::c_ulong = 0xC068_6611;
    /// The mapping at the address or the next one after it, shared file-backed ones only.
    const VMA_SHARED: u64 = 0x08;
    const COVERING_OR_NEXT_VMA: u64 = 0x10;
    const FILE_BACKED_VMA: u64 = 0x20;
    let maps = std::fs::File::open(format!("/proc/{pid}/maps"))?;
    let mut addr = 0u64;
    loop {
        let mut q = Query {
            size: std::mem::size_of::<Query>() as u64,
            query_flags: VMA_SHARED | COVERING_OR_NEXT_VMA | FILE_BACKED_VMA,
            query_addr: addr,
            ..Query::default()
        };
        // SAFETY: the kernel reads and writes one `procmap_query` (repr(C), its layout, its
        // size given in `size`) in a live local; no name or build id buffer is given.
        let r = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY, &mut q as *mut Query) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                // No mapping at or after `addr`: none of them is the file.
                Some(libc::ENOENT) => Ok(Some(false)),
                Some(libc::ENOTTY) | Some(libc::EINVAL) => Ok(None),
                _ => Err(e),
            };
        }
        if (q.dev_major, q.dev_minor, q.inode) == (major, minor, ino) {
            return Ok(Some(true));
        }
        if q.vma_end <= addr {
            return Ok(Some(false));
        }
        addr = q.vma_end;
    }
}

/// Sets or clears O_DIRECT on an open file (`fcntl(F_SETFL)`); a file system that cannot read
/// around its page cache refuses it (EINVAL).
pub fn set_direct(file: &std::fs::File, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we hold open; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads into `buf` at `offset` of `file` until at least `len` bytes are in or the file ends,
/// and returns how many: for O_DIRECT reads, whose `buf` holds whole blocks (past `len`) and
/// whose only short count is at the end of the file. Interrupted reads are retried.
pub fn read_at_least(
    file: &std::fs::File,
    buf: &mut [u8],
    offset: u64,
    len: usize,
) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Makes `file` `len` bytes long with its blocks allocated now (`fallocate(2)`), so that writes
/// into it allocate none; sparse (`ftruncate`) on a file system that cannot preallocate.
pub fn preallocate(file: &std::fs::File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        // (fallocate refuses an empty range.)
        return file.set_len(0);
    }
    // SAFETY: fallocate on a descriptor we hold open; no memory is involved.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(e);
    }
    file.set_len(len)
}

/// A page of a file mapped for reading and writing (`MAP_PRIVATE` or `MAP_SHARED`), unmapped
/// when dropped: what the tests of [`maps_shared`] and its callers hold a file with.
#[cfg(test)]
pub(crate) struct MappedPage(*mut libc::c_void);

#[cfg(test)]
impl MappedPage {
    pub(crate) fn new(file: &std::fs::File, flags: i32) -> MappedPage {
        use std::os::fd::AsRawFd;
        // SAFETY: a new mapping of one page of an open file; nothing else refers to it, and
        // it is unmapped once, when dropped.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(m, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        MappedPage(m)
    }
}

#[cfg(test)]
impl Drop for MappedPage {
    fn drop(&mut self) {
        // SAFETY: the page `new` mapped, never unmapped before, not used after.
        unsafe { libc::munmap(self.0, 4096) };
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    /// The table is as large as asked at once (`FDSize` in /proc/self/status).
    #[test]
    fn the_descriptor_table_is_presized() {
        let n = super::raise_descriptor_limit().min(8192);
        super::presize_descriptor_table(n);
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let size: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("FDSize:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(size >= n, "{size} < {n}");
    }

    #[test]
    fn a_shared_mapping_of_a_file_is_found_by_the_kernels_query() {
        let path = std::env::temp_dir().join(format!("dyadfs-maps-{}", std::process::id()));
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        let me = std::process::id();
        let before = super::maps_shared(me, dev, meta.ino()).unwrap();
        let Some(false) = before else {
            // (Linux before 6.11 has no PROCMAP_QUERY: `None`, and callers read the text.)
            assert_eq!(before, None, "mapped before it was mapped");
            return;
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // A private mapping never writes to its file: not looked for.
        let private = super::MappedPage::new(&f, libc::MAP_PRIVATE);
        assert_eq!(
            super::maps_shared(me, dev, meta.ino()).unwrap(),
            Some(false)
        );
        let shared = super::MappedPage::new(&f, libc::MAP_SHARED);
        drop(f);
        assert_eq!(super::maps_shared(me, dev, meta.ino()).unwrap(), Some(true));
        // Another file system's file with the same inode number is not it.
        let other = (dev.0 + 1, dev.1);
        assert_eq!(
            super::maps_shared(me, other, meta.ino()).unwrap(),
            Some(false)
        );
        drop((shared, private));
        assert_eq!(
            super::maps_shared(me, dev, meta.ino()).unwrap(),
            Some(false)
        );
        std::fs::remove_file(&path).unwrap();
    }
}
