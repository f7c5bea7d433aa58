//! The FUSE request handlers, once for both transports: each opens a span, calls the core and
//! answers through a reply trait ([`super::reply`]) that fuser's replies (`dev.rs`) and a ring
//! entry's (`ring/`) implement. What an open of the kernel's becomes ([`super::super::io_modes`]),
//! who may finish a write at flush, and which requests wait on threads of their own are decided
//! here; the kernel resources of the session (its device, backing ids) are held here too.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::admission::{ListReaders, Waiters};
use super::caller;
pub use super::caller::Caller;
use super::passthrough::Passthrough;
use super::reply::{
    AttrReply, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply, OpenReply,
    StatfsReply, WriteReply, XattrReply,
};
use crate::core::source::Source;
use crate::core::sync::lock;
use crate::fs::listing::page;
use crate::fs::{Attr, Changes, DyadFs, Error, Opened};
use crate::fuse::io_modes::{IoModes, OpenMode};

/// Open reply flags (FOPEN_*).
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub const FOPEN_CACHE_DIR: u32 = 1 << 3;
pub const FOPEN_NOFLUSH: u32 = 1 << 5;

/// Shards of the I/O-mode table (see [`Ops::modes_of`]): enough that the request threads
/// rarely meet on one.
const MODE_SHARDS: usize = 64;

/// Who may make requests of the mount (`-o allow_other`, `-o allow_root`, or its owner
/// alone). The kernel lets every user through once `allow_other` is set, which `allow_root`
/// also sets: the daemon turns away the users it does not name (fuser does for /dev/fuse; the
/// ring's dispatcher asks [`Access::permits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    All,
    RootAndOwner(u32),
    Owner(u32),
}

impl Access {
    pub fn permits(self, uid: u32) -> bool {
        match self {
            Access::All => true,
            Access::RootAndOwner(owner) => uid == owner || uid == 0,
            Access::Owner(owner) => uid == owner,
        }
    }
}

pub struct Ops<S: Source> {
    pub(super) fs: Arc<DyadFs<S>>,
    /// The I/O modes of open inodes, in shards by inode: an open's decision and its backing-file
    /// registration (an ioctl) stay atomic for the inode without making every other open and
    /// release of the mount wait behind that syscall. (A passthrough open's reply is written
    /// after the shard is unlocked: the backing id it names is held by the open's own count.)
    modes: Box<[Mutex<IoModes<Arc<Passthrough>>>]>,
    /// The process that opened each handle whose close may finish a file being written: only
    /// its own `close()` finishes it at flush (a forked child closing an inherited descriptor
    /// must not publish the parent's half-written file; the last release still does).
    openers: Mutex<std::collections::HashMap<u64, Option<u32>>>,
    /// Where it is mounted, and the device number of the mount once known: a file of this
    /// mount is (device, inode) for `caller::held_elsewhere`.
    mountpoint: std::path::PathBuf,
    device: OnceLock<Option<(u32, u32)>>,
    /// The children of openers, for `caller::held_elsewhere` (their `/proc` files kept open).
    children: crate::sys::children::Children,
    /// The threads that look at a closing opener's children (see [`Ops::flush`]).
    finishers: super::finishers::Finishers,
    /// The session's /dev/fuse descriptor (backing ids are registered on it; the ring
    /// submits on it), once the mount is made.
    dev: OnceLock<Arc<OwnedFd>>,
    /// The kernel took the ring at INIT: ring threads may register entries.
    pub(super) ring_taken: AtomicBool,
    /// The session's notifications (on /dev/fuse under either transport), once the mount is
    /// made: a packed file is handed to the kernel's page cache at its open with them.
    notifier: OnceLock<fuser::Notifier>,
    /// Who may make requests (unset: the mount's owner alone).
    access: OnceLock<Access>,
    list_readers: Arc<ListReaders>,
    pub(super) waiters: Arc<Waiters>,
    /// Requests taken and not yet answered (see [`super::running`]).
    running: Arc<super::running::Running>,
}

fn errno(e: &Error) -> i32 {
    e.errno()
}

fn entry_or_error<S: Source>(fs: &DyadFs<S>, r: Result<Attr, Error>, reply: impl EntryReply) {
    match r {
        Ok(a) => reply.entry(&a, fs.ttl(&a)),
        Err(e) => reply.error(errno(&e)),
    }
}

fn empty_or_error(r: Result<(), Error>, reply: impl EmptyReply) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn xattr_or_error(r: Result<Vec<u8>, Error>, size: u32, reply: impl XattrReply) {
    match r {
        Ok(v) if size == 0 => reply.xattr_size(v.len() as u32),
        Ok(v) if v.len() <= size as usize => reply.xattr_data(&v),
        Ok(_) => reply.error(errno(&Error::Range)),
        Err(e) => reply.error(errno(&e)),
    }
}

impl<S: Source> Ops<S> {
    /// Wraps the file system mounted at `mountpoint` and starts its prefetch and directory
    /// read-ahead threads.
    pub fn new(fs: DyadFs<S>, mountpoint: &std::path::Path) -> std::io::Result<Self> {
        let fs = Arc::new(fs);
        DyadFs::start_prefetch(&fs)?;
        DyadFs::start_dir_ahead(&fs)?;
        DyadFs::start_stat_ahead(&fs)?;
        let waiters = Arc::new(Waiters::new(fs.max_waits_per_user()));
        Ok(Ops {
            fs,
            modes: (0..MODE_SHARDS).map(|_| Mutex::default()).collect(),
            openers: Mutex::default(),
            mountpoint: mountpoint.to_path_buf(),
            device: OnceLock::new(),
            children: Default::default(),
            finishers: super::finishers::Finishers::new("flush"),
            dev: OnceLock::new(),
            ring_taken: AtomicBool::new(false),
            notifier: OnceLock::new(),
            access: OnceLock::new(),
            list_readers: Arc::default(),
            waiters,
            running: Arc::default(),
        })
    }

    /// The session's /dev/fuse descriptor, found once the mount is made.
    pub fn attach_device(&self, dev: Arc<OwnedFd>) {
        let _ = self.dev.set(dev);
    }

    pub fn device_fd(&self) -> Option<&Arc<OwnedFd>> {
        self.dev.get()
    }

    /// The session's notifier: set once the mount is made, before requests are served.
    pub fn set_notifier(&self, notifier: fuser::Notifier) {
        let _ = self.notifier.set(notifier);
    }

    /// Who may make requests: set once, from the mount's options, before the ring starts.
    pub fn set_access(&self, access: Access) {
        let _ = self.access.set(access);
    }

    /// Requests taken and not yet answered.
    pub fn running(&self) -> &Arc<super::running::Running> {
        &self.running
    }

    pub fn access(&self) -> Access {
        *self
            .access
            .get_or_init(|| Access::Owner(crate::sys::euid()))
    }

    /// Whether the kernel took the ring at INIT.
    pub fn ring_taken(&self) -> bool {
        self.ring_taken.load(Ordering::Relaxed)
    }

    /// The core's counters.
    pub fn stats(&self) -> &crate::stats::Stats {
        self.fs.stats()
    }

    /// Whether the kernel's INIT has been answered (what it agreed to is known).
    pub fn initialised(&self) -> bool {
        self.fs.initialised()
    }

    /// Whether large files not cached whole are read by direct I/O while complete ones pass
    /// through (known once INIT is done).
    pub fn reads_large_files_directly(&self) -> bool {
        self.fs.reads_large_files_directly()
    }

    /// `--no-open` in effect (the kernel agreed to zero-message opens at INIT): opens and
    /// flushes are answered ENOSYS, reads come by inode.
    fn unasked(&self) -> bool {
        self.fs.kernel().no_open
    }

    /// The shard of the I/O-mode table that holds inode `ino`.
    fn modes_of(&self, ino: u64) -> std::sync::MutexGuard<'_, IoModes<Arc<Passthrough>>> {
        lock(&self.modes[(ino % MODE_SHARDS as u64) as usize])
    }

    /// Whether process `opener` (or, with `children`, its children) holds inode `ino` of this
    /// mount otherwise than through the descriptor being closed; if the mount's device cannot
    /// be told, it is taken as held (the write then finishes at the last release).
    fn held_elsewhere(&self, opener: u32, ino: u64, children: bool) -> bool {
        let device = self
            .device
            .get_or_init(|| caller::device_of(&self.mountpoint));
        match device {
            Some(dev) => {
                let children = children.then_some(&self.children);
                caller::held_elsewhere(opener, (*dev, ino), children)
            }
            None => true,
        }
    }

    /// The flags of an open reply for `opened`, made by thread `tid`: a handle whose close
    /// cannot finish anything is never flushed (no round trip per `close()`).
    fn open_flags(&self, opened: &Opened, tid: u32, flags: u32) -> u32 {
        if opened.finishes {
            lock(&self.openers).insert(opened.fh, caller::process_of(tid));
            flags
        } else {
            flags | FOPEN_NOFLUSH
        }
    }

    /// A lookup is answered at once, even of a name not produced yet that a reader opens
    /// (`--wait`): that one gets a pending entry, and its open waits (see [`Ops::open`]). A
    /// lookup waiting in the daemon would hold its directory in the kernel, and every creation
    /// in that directory on this node (the producer's, were it here) with it.
    pub fn lookup(&self, c: Caller, parent: u64, name: &OsStr, reply: impl EntryReply) {
        let _span = tracing::debug_span!("lookup", parent, ?name).entered();
        entry_or_error(&self.fs, self.fs.lookup(parent, name, &c), reply);
    }

    pub fn forget(&self, ino: u64, nlookup: u64) {
        self.fs.forget(ino, nlookup);
    }

    pub fn getattr(&self, ino: u64, reply: impl AttrReply) {
        let _span = tracing::debug_span!("getattr", ino).entered();
        let stats = self.fs.stats();
        stats.attr_requests.fetch_add(1, Ordering::Relaxed);
        match self.fs.getattr(ino) {
            Ok(a) => reply.attr(&a, self.fs.ttl(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub fn readlink(&self, ino: u64, reply: impl DataReply) {
        match self.fs.readlink(ino) {
            Ok(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `flags`: the open(2) flags.
    pub fn open(self: &Arc<Self>, c: Caller, ino: u64, flags: i32, reply: impl OpenReply) {
        if self.fs.open_waits(ino, &c, flags) {
            // (See `waiting.rs`.)
            return self.open_when_produced(c, ino, flags, reply);
        }
        self.open_now(c, ino, flags, reply)
    }

    pub(super) fn open_now(&self, c: Caller, ino: u64, flags: i32, reply: impl OpenReply) {
        let _span = tracing::debug_span!("open", ino).entered();
        if self.unasked() {
            // The first open answered so is the last one sent: reads then come by inode.
            return reply.error(errno(&Error::OpensUnasked));
        }
        let truncate = flags & libc::O_TRUNC != 0;
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || truncate;
        if let Err(e) = self.fs.may(ino, &c, libc::R_OK) {
            return reply.error(errno(&e));
        }
        let started = std::time::Instant::now();
        let opened = self.fs.open(ino, write, truncate);
        let latency = &self.fs.stats().latency.open;
        latency.observe(started.elapsed().as_secs_f64());
        let opened = match opened {
            Ok(o) => o,
            Err(e) => return reply.error(errno(&e)),
        };
        if write {
            self.fs.note_writer(opened.fh, &c);
        }
        let mut modes = self.modes_of(ino);
        let offered = opened.passthrough.as_ref().map(|e| e.version);
        let passthrough = match (
            modes.decide(ino, offered, opened.keep_pages),
            &opened.passthrough,
        ) {
            (OpenMode::Passthrough, _) => true,
            (OpenMode::Bind, Some(entry)) => {
                let dev = self
                    .dev
                    .get()
                    .ok_or_else(|| std::io::Error::other("the session's device was not found"));
                match dev.and_then(|d| entry.data_file().and_then(|f| Passthrough::open(d, &*f))) {
                    Ok(id) => {
                        modes.bind(ino, Arc::new(id), entry.version);
                        true
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "passthrough open failed; serving from the daemon");
                        false
                    }
                }
            }
            (OpenMode::Refuse, _) => {
                drop(modes);
                tracing::warn!(
                    ino,
                    "open refused: another version is open in passthrough mode"
                );
                let _ = self.fs.release(opened.fh);
                return reply.error(libc::EBUSY);
            }
            _ => false,
        };
        if passthrough {
            // Counted before the reply, so the opener sees it counted once its open returns.
            self.fs
                .stats()
                .passthrough_opens
                .fetch_add(1, Ordering::Relaxed);
            let id = modes.passthrough(opened.fh, ino).clone();
            // Replied outside the shard's lock: the reader's close comes right after the reply,
            // and its release, locking the same shard, waited for this thread's write of it.
            drop(modes);
            let flags = self.open_flags(&opened, c.pid, 0);
            reply.opened_passthrough(opened.fh, flags, &id);
            return;
        }
        modes.served_by_daemon(opened.fh, ino);
        drop(modes);
        if let (Some(bytes), Some(notifier)) = (&opened.store, self.notifier.get()) {
            // FUSE_NOTIFY_STORE before the reply, which keeps the pages (FOPEN_KEEP_CACHE): a
            // reader that seeks about in the file (np.load: six READs for a 256 KiB .npz) finds
            // every byte. A store that fails leaves the reads to come as before.
            if let Err(e) = notifier.store(fuser::INodeNo(ino), 0, bytes) {
                tracing::debug!(ino, error = %e, "storing a file in the kernel's page cache failed");
            }
        }
        let flags = if opened.direct {
            FOPEN_DIRECT_IO
        } else if opened.keep_cache {
            FOPEN_KEEP_CACHE
        } else {
            0
        };
        reply.opened(opened.fh, self.open_flags(&opened, c.pid, flags));
    }

    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32, reply: impl DataReply) {
        let _span = tracing::debug_span!("read", fh, offset, size).entered();
        let data = if self.unasked() {
            self.fs.read_unopened(ino, offset, size)
        } else {
            self.fs.read(fh, offset, size)
        };
        match data {
            Ok(data) => reply.data(&data),
            Err(e) => {
                tracing::warn!(error = %e, "read failed");
                reply.error(errno(&e))
            }
        }
    }

    pub fn release(&self, ino: u64, fh: u64, reply: impl EmptyReply) {
        // A backing id let go is closed in the kernel (an ioctl) after the shard is unlocked.
        let unbound = self.modes_of(ino).released(fh);
        drop(unbound);
        lock(&self.openers).remove(&fh);
        empty_or_error(self.fs.release(fh), reply);
    }

    pub fn flush(self: &Arc<Self>, c: Caller, ino: u64, fh: u64, reply: impl EmptyReply) {
        if self.unasked() {
            // Files opened unasked have nothing to flush: the kernel stops sending flushes.
            return reply.error(errno(&Error::OpensUnasked));
        }
        let _span = tracing::debug_span!("flush", fh).entered();
        let opener = lock(&self.openers).get(&fh).copied().flatten();
        let Some(p) = opener.filter(|&p| Some(p) == caller::process_of(c.pid)) else {
            return reply.ok();
        };
        // Whether the opener's children hold the file is read from their /proc files, which
        // wait for a child in the middle of an exec; that child may be closing descriptors of
        // this mount (its close-on-exec ones, each a FLUSH), which a request thread must be
        // free to answer, or the mount stops (over io_uring a queue may have one thread). So
        // an opener with children is looked at, and its file finished, on a kept thread (see
        // `finishers.rs`); one without is looked at here, alone (a child forked after the close
        // began never had its descriptor). Without a reply to spare (a ring queue's are all
        // out), the children are not looked at.
        let children = !self.children.of(p).is_empty();
        if !(children && reply.may_leave()) {
            return self.finish_flush(p, ino, fh, false, reply);
        }
        let me = self.clone();
        let started = self
            .finishers
            .run(move || me.finish_flush(p, ino, fh, true, reply));
        if let Err(e) = started {
            // (The reply went with the closure: a reply never sent is answered EIO.)
            tracing::warn!(error = %e, "cannot start a thread to finish a flush");
        }
    }

    /// A flush by opener `p`: finishes the file unless something else (`p`, or with
    /// `children` its children) holds it.
    fn finish_flush(&self, p: u32, ino: u64, fh: u64, children: bool, reply: impl EmptyReply) {
        if tracing::debug_span!("mappings").in_scope(|| self.held_elsewhere(p, ino, children)) {
            reply.ok();
        } else {
            empty_or_error(self.fs.flush(fh), reply);
        }
    }

    /// `flags`: the open(2) flags.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        c: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: impl CreateReply,
    ) {
        let _span = tracing::debug_span!("create", parent, ?name).entered();
        let exclusive = flags & libc::O_EXCL != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        let owner = (c.uid, c.gid);
        match self
            .fs
            .create(parent, name, mode & !umask, (exclusive, truncate), owner)
        {
            Ok((a, o)) => {
                self.fs.note_writer(o.fh, &c);
                self.modes_of(a.ino).served_by_daemon(o.fh, a.ino);
                let flags = self.open_flags(&o, c.pid, 0);
                reply.created(&a, self.fs.ttl(&a), o.fh, flags)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8], reply: impl WriteReply) {
        match self.fs.write(fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub fn fsync(&self, fh: u64, reply: impl EmptyReply) {
        if self.unasked() {
            // A file opened unasked has no handle, and a read-only mount nothing to sync.
            return reply.ok();
        }
        empty_or_error(self.fs.fsync(fh), reply);
    }

    pub fn setattr(&self, ino: u64, changes: &Changes, reply: impl AttrReply) {
        let _span = tracing::debug_span!("setattr", ino).entered();
        // The kernel checked the caller's right to each change (default_permissions).
        match self.fs.setattr(ino, changes) {
            Ok(a) => reply.attr(&a, self.fs.ttl(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub fn mkdir(
        &self,
        c: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: impl EntryReply,
    ) {
        let _span = tracing::debug_span!("mkdir", parent, ?name).entered();
        let made = self.fs.mkdir(parent, name, mode & !umask, (c.uid, c.gid));
        entry_or_error(&self.fs, made, reply);
    }

    pub fn symlink(
        &self,
        c: Caller,
        parent: u64,
        name: &OsStr,
        target: &std::path::Path,
        reply: impl EntryReply,
    ) {
        let _span = tracing::debug_span!("symlink", parent, ?name).entered();
        let made = self.fs.symlink(parent, name, target, (c.uid, c.gid));
        entry_or_error(&self.fs, made, reply);
    }

    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        c: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: impl EntryReply,
    ) {
        let _span = tracing::debug_span!("mknod", parent, ?name).entered();
        let mode = mode & !(umask & 0o7777);
        let made = self.fs.mknod(parent, name, mode, rdev, (c.uid, c.gid));
        entry_or_error(&self.fs, made, reply);
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr, reply: impl EntryReply) {
        let _span = tracing::debug_span!("link", ino, ?newname).entered();
        entry_or_error(&self.fs, self.fs.link(ino, newparent, newname), reply);
    }

    pub fn unlink(&self, parent: u64, name: &OsStr, reply: impl EmptyReply) {
        let _span = tracing::debug_span!("unlink", parent, ?name).entered();
        empty_or_error(self.fs.remove(parent, name, false), reply);
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr, reply: impl EmptyReply) {
        let _span = tracing::debug_span!("rmdir", parent, ?name).entered();
        empty_or_error(self.fs.remove(parent, name, true), reply);
    }

    /// `flags`: renameat2(2)'s.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: impl EmptyReply,
    ) {
        let _span = tracing::debug_span!("rename", ?name, ?newname).entered();
        if flags & (libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT) != 0 {
            return reply.error(libc::EINVAL);
        }
        let no_replace = flags & libc::RENAME_NOREPLACE != 0;
        let renamed = self.fs.rename(parent, name, newparent, newname, no_replace);
        empty_or_error(renamed, reply);
    }

    pub fn opendir(&self, c: Caller, ino: u64, reply: impl OpenReply) {
        let _span = tracing::debug_span!("opendir", ino).entered();
        match self
            .fs
            .may(ino, &c, libc::R_OK)
            .and_then(|()| self.fs.opendir(ino))
        {
            Ok(fh) => reply.opened(fh, FOPEN_CACHE_DIR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub fn readdir(&self, ino: u64, fh: u64, offset: u64, mut reply: impl DirReply) {
        let listing = match self.fs.listing(fh) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        for (next, e) in page(ino, &listing, offset) {
            if reply.add(e.ino, next, e.kind, &e.name) {
                break;
            }
        }
        reply.done();
    }

    // The kernel (AUTO mode) asks for attributes with a directory's first page, and with a
    // later page when it looked up an entry of the directory since the page before: a scan
    // that stats what it lists. Attributes for every entry of a first page made `find` over a
    // million files 3x slower (a stat per entry on the shared file system, an inode per entry
    // in the kernel; `find` stats none), so the first page is "." alone (the kernel links
    // neither "." nor ".."), after which a walk that does not stat gets plain READDIRs and a
    // scan that does gets its pages with attributes: one request per page, not one LOOKUP
    // per entry.
    pub fn readdirplus(&self, ino: u64, fh: u64, offset: u64, mut reply: impl DirPlusReply) {
        let _span = tracing::debug_span!("readdirplus", ino, offset).entered();
        let listing = match self.fs.listing(fh) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        if offset > 0 {
            self.fs.listing_with_attrs(ino, fh, &listing, offset);
        }
        for (next, e) in page(ino, &listing, offset) {
            let dots = next <= 2;
            // ("." and "..", which come first, carry the directory's own attributes.)
            let attr = if dots {
                match self.fs.getattr(ino) {
                    Ok(a) => a,
                    Err(e) => return reply.error(errno(&e)),
                }
            } else {
                match self.fs.lookup_listed(ino, &e.name) {
                    Ok(a) => a,
                    // Gone since the listing: as if listed a moment later.
                    Err(Error::NotFound) => continue,
                    Err(err) => {
                        tracing::warn!(name = ?e.name, error = %err, "a listed entry has no attributes");
                        continue;
                    }
                }
            };
            let ttl = self.fs.ttl(&attr);
            if reply.add_plus(&attr, ttl, next, &e.name) {
                // Not sent: the reference counted for it is not the kernel's.
                if !dots {
                    self.fs.forget(attr.ino, 1);
                }
                break;
            }
            if offset == 0 {
                break;
            }
        }
        reply.done_plus();
    }

    pub fn releasedir(&self, fh: u64, reply: impl EmptyReply) {
        self.fs.releasedir(fh);
        reply.ok();
    }

    pub fn statfs(&self, reply: impl StatfsReply) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(&s),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub fn getxattr(&self, c: Caller, ino: u64, name: &OsStr, size: u32, reply: impl XattrReply) {
        let is_prefetch = name
            .to_str()
            .and_then(crate::fs::prefetch::request)
            .is_some();
        if !is_prefetch {
            return xattr_or_error(self.fs.getxattr(ino, name, &c), size, reply);
        }
        // A prefetch list is read on a thread of its own: a list stored on this very mount is
        // read through the request threads, and with each of them waiting on such a read the
        // mount would stop. A few at once: they are one request per rank and epoch.
        let permit = reply
            .may_leave()
            .then(|| ListReaders::take(&self.list_readers))
            .flatten();
        let Some(permit) = permit else {
            return reply.error(errno(&Error::PrefetchFull));
        };
        let (fs, name) = (self.fs.clone(), name.to_owned());
        let spawned = std::thread::Builder::new()
            .name("prefetch-list".into())
            .spawn(move || {
                let _permit = permit;
                xattr_or_error(fs.getxattr(ino, &name, &c), size, reply);
            });
        if let Err(e) = spawned {
            // (The reply went with the closure: a reply never sent is answered EIO.)
            tracing::warn!(error = %e, "cannot start a thread to read a prefetch list");
        }
    }

    pub fn listxattr(&self, size: u32, reply: impl XattrReply) {
        if size == 0 {
            reply.xattr_size(0)
        } else {
            reply.xattr_data(&[])
        }
    }
}
