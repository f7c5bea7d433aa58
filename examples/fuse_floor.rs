//! What the kernel's FUSE requests of a small-file read cost a daemon that does nothing else: the
//! floor under a cached hit, and under the FUSE part of a pulled file, in
//! `scripts/bench_small_pull.sh` (`FLOOR=1`).
//!
//! Mounts a read-only view of the regular files of one flat directory, by fuser and /dev/fuse
//! with as many request threads as `dyadfs mount` (8) and its mount options, answering only what
//! a reader's `open(path, "rb").read()` sends: LOOKUP (an `fstatat` of the name, attributes and
//! entry trusted for 60 s, dyadfs's default `--metadata-ttl`), OPEN (the file opened and handed
//! to the kernel by passthrough: its reads never come here), IOCTL (Python's `isatty`: fuser's
//! default ENOSYS, as dyadfs), RELEASE (the backing id closed). No cache, no locator, no shared
//! file system behind it, no ACL read: what is left is the kernel's requests and their replies.
//! A listing (READDIR, as `os.listdir` sends: names only) is answered from the directory read
//! once, at the first: a DataLoader's dataset lists its files before it reads them
//! (`scripts/bench_dataloader.sh`, configuration `fusefloor`). Mounted read-only unless `--rw`:
//! on a writable mount the kernel asks for a file's attributes again at the first `fstat` after a
//! passthrough read (the atime it marks stale), as it does of dyadfs's default mount.
//! Runs until unmounted (`fusermount3 -u MOUNTPOINT`).
//!
//! `cargo run --release --example fuse_floor -- DIR MOUNTPOINT [--rw]` (root: passthrough needs
//! CAP_SYS_ADMIN).

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirEntryExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, Request,
};

/// As long as dyadfs trusts a name and its attributes by default (`--metadata-ttl 60s`).
const TTL: Duration = Duration::from_secs(60);
/// Inode numbers: the root's, and the offset a file's `st_ino` is moved by (never the root's).
const ROOT: u64 = 1;
const FILE_INO_BASE: u64 = 1 << 32;

struct Floor {
    dir: File,
    path: PathBuf,
    /// The directory's regular files (inode, name), read at the first listing.
    listing: OnceLock<Vec<(u64, OsString)>>,
    /// Names looked up, by inode (what an open opens).
    names: Mutex<HashMap<u64, CString>>,
    /// Open files' backing ids, by handle: dropped (closed with the kernel) at release.
    open: Mutex<HashMap<u64, BackingId>>,
    next_fh: AtomicU64,
}

fn time(secs: i64, nanos: i64) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs.max(0) as u64, nanos.clamp(0, 999_999_999) as u32)
}

fn attr_of(ino: u64, st: &libc::stat, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: time(st.st_ctime, st.st_ctime_nsec),
        kind,
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Floor {
    /// `fstatat` of `name` in the directory (the empty name: the directory itself).
    fn stat(&self, name: &CString) -> Result<libc::stat, Errno> {
        // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let flags = libc::AT_SYMLINK_NOFOLLOW
            | if name.is_empty() {
                libc::AT_EMPTY_PATH
            } else {
                0
            };
        // SAFETY: a NUL-terminated name and a live `stat` to fill, on a descriptor we hold.
        let r = unsafe { libc::fstatat(self.dir.as_raw_fd(), name.as_ptr(), &mut st, flags) };
        if r != 0 {
            return Err(Errno::from_i32(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO),
            ));
        }
        Ok(st)
    }
}

impl fuser::Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if !config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH) {
            return Err(std::io::Error::other(
                "the kernel offers no FUSE passthrough",
            ));
        }
        config
            .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
            .map_err(|_| std::io::Error::other("passthrough refused"))?;
        config
            .set_max_stack_depth(1)
            .map_err(|_| std::io::Error::other("stack depth refused"))?;
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Ok(name) = CString::new(name.as_bytes()) else {
            return reply.error(Errno::ENOENT);
        };
        if parent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        match self.stat(&name) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {
                let ino = FILE_INO_BASE + st.st_ino;
                self.names.lock().unwrap().insert(ino, name);
                reply.entry(
                    &TTL,
                    &attr_of(ino, &st, FileType::RegularFile),
                    Generation(0),
                );
            }
            Ok(_) => reply.error(Errno::ENOENT),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let name = if ino.0 == ROOT {
            CString::default()
        } else {
            match self.names.lock().unwrap().get(&ino.0) {
                Some(n) => n.clone(),
                None => return reply.error(Errno::ENOENT),
            }
        };
        let kind = if ino.0 == ROOT {
            FileType::Directory
        } else {
            FileType::RegularFile
        };
        match self.stat(&name) {
            Ok(st) => reply.attr(&TTL, &attr_of(ino.0, &st, kind)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let Some(name) = self.names.lock().unwrap().get(&ino.0).cloned() else {
            return reply.error(Errno::ENOENT);
        };
        // SAFETY: a NUL-terminated name, relative to a directory descriptor we hold.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return reply.error(Errno::EIO);
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        // The kernel holds its own reference once the id is made: the descriptor closes now.
        let id = match reply.open_backing(&file) {
            Ok(id) => id,
            Err(_) => return reply.error(Errno::EIO),
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
        self.open.lock().unwrap().insert(fh, id);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let listing = self.listing.get_or_init(|| {
            let Ok(dir) = std::fs::read_dir(&self.path) else {
                return Vec::new();
            };
            dir.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| (FILE_INO_BASE + e.ino(), e.file_name()))
                .collect()
        });
        // Offsets: 1 and 2 are "." and "..", then each file's index + 3.
        let dot = |name| (ROOT, FileType::Directory, OsStr::new(name));
        let files = listing
            .iter()
            .map(|(ino, name)| (*ino, FileType::RegularFile, name.as_os_str()));
        let all = [dot("."), dot("..")].into_iter().chain(files);
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let id = self.open.lock().unwrap().remove(&fh.0);
        drop(id);
        reply.ok();
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (dir, mountpoint, rw) = match &args[..] {
        [_, dir, mnt] => (dir, mnt, false),
        [_, dir, mnt, flag] if flag == "--rw" => (dir, mnt, true),
        _ => {
            eprintln!("usage: fuse_floor DIR MOUNTPOINT [--rw]");
            std::process::exit(2);
        }
    };
    let fs = Floor {
        dir: File::open(dir)?,
        path: PathBuf::from(dir),
        listing: OnceLock::new(),
        names: Mutex::default(),
        open: Mutex::default(),
        next_fh: AtomicU64::new(1),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("fuse_floor".into()),
        if rw {
            fuser::MountOption::RW
        } else {
            fuser::MountOption::RO
        },
        fuser::MountOption::NoAtime,
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
    ];
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(8);
    config.clone_fd = true;
    fuser::Session::new(fs, mountpoint, &config)?.run()
}
