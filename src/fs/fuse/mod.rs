//! The only module that knows fuser: each handler opens a span, calls the core, and replies with
//! data or an errno ([`convert`]: the core's types as fuser's). The I/O-mode rules of opens ([`super::io_modes`]) and the offsets of
//! directory listings ([`super::listing`]) are the core's; this file keeps the passthrough
//! backing ids (a kernel resource of this session) in them.

use std::ffi::OsStr;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use fuser::{
    BackingId, Errno, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};

mod convert;

use convert::{file_attr, file_type, time_set};

use super::Opened;
use super::caller;
use super::io_modes::{IoModes, OpenMode};
use super::listing::page;
use super::{Attr, Capabilities, Changes, DyadFs, Error, Looked};
use crate::core::source::Source;
use crate::core::sync::lock;

/// Largest read/write request the kernel sends us: 1 MiB (256 pages) instead of 128 KiB.
const MAX_REQUEST: u32 = 1 << 20;

/// Shards of the I/O-mode table (see [`FuseAdapter::modes_of`]): enough that the FUSE threads
/// rarely meet on one.
const MODE_SHARDS: usize = 64;

pub struct FuseAdapter<S: Source> {
    fs: Arc<DyadFs<S>>,
    /// The I/O modes of open inodes, in shards by inode: an open's decision, its backing-file
    /// registration (an ioctl) and its reply stay atomic for the inode without making every
    /// other open and release of the mount wait behind those syscalls.
    modes: Box<[Mutex<IoModes<BackingId>>]>,
    /// The process that opened each handle whose close may finish a file being written: only
    /// its own `close()` finishes it at flush (a forked child closing an inherited descriptor
    /// must not publish the parent's half-written file; the last release still finishes it).
    openers: Mutex<std::collections::HashMap<u64, Option<u32>>>,
    /// Where it is mounted, and the device number of the mount once known: a file of this
    /// mount is (device, inode) for `caller::held_elsewhere`.
    mountpoint: std::path::PathBuf,
    device: std::sync::OnceLock<Option<(u32, u32)>>,
    /// `--no-open` in effect (the kernel offered zero-message opens at INIT): opens and
    /// flushes are answered ENOSYS, reads come by inode.
    unasked: bool,
    list_readers: Arc<ListReaders>,
    waiters: Arc<Waiters>,
}

impl<S: Source> FuseAdapter<S> {
    /// Wraps the file system mounted at `mountpoint` and starts its prefetch and directory
    /// read-ahead threads.
    pub fn new(fs: DyadFs<S>, mountpoint: &std::path::Path) -> io::Result<Self> {
        let fs = Arc::new(fs);
        DyadFs::start_prefetch(&fs)?;
        DyadFs::start_dir_ahead(&fs)?;
        DyadFs::start_stat_ahead(&fs)?;
        Ok(FuseAdapter {
            fs,
            modes: (0..MODE_SHARDS).map(|_| Mutex::default()).collect(),
            openers: Mutex::default(),
            mountpoint: mountpoint.to_path_buf(),
            device: std::sync::OnceLock::new(),
            unasked: false,
            list_readers: Arc::default(),
            waiters: Arc::default(),
        })
    }

    /// The shard of the I/O-mode table that holds inode `ino`.
    fn modes_of(&self, ino: u64) -> std::sync::MutexGuard<'_, IoModes<BackingId>> {
        lock(&self.modes[(ino % MODE_SHARDS as u64) as usize])
    }

    /// Whether process `opener` (or its children) holds inode `ino` of this mount otherwise
    /// than through the descriptor being closed; if the mount's device cannot be told, it is
    /// taken as held (finishing the file then waits for the last release).
    fn held_elsewhere(&self, opener: u32, ino: u64) -> bool {
        let device = self
            .device
            .get_or_init(|| caller::device_of(&self.mountpoint));
        match device {
            Some(dev) => caller::held_elsewhere(opener, (*dev, ino)),
            None => true,
        }
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn reply_entry<S: Source>(fs: &DyadFs<S>, r: Result<Attr, Error>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&fs.ttl(&a), &file_attr(&a), Generation(0)),
        Err(e) => reply.error(errno(&e)),
    }
}

/// A waiting lookup's stack: it resolves a name (an RPC to its home) and sleeps.
const WAITER_STACK: usize = 256 << 10;

/// Lookups waiting for names (`--wait`), by caller.
#[derive(Default)]
struct Waiters(Mutex<std::collections::HashMap<u32, usize>>);

/// One waiting lookup's place; given back when dropped.
struct Waiter(Arc<Waiters>, u32);

impl Waiters {
    /// Waits one user may have at once (a thread each, asleep).
    const PER_USER: usize = 1024;

    fn take(this: &Arc<Waiters>, uid: u32) -> Option<Waiter> {
        let mut by_user = lock(&this.0);
        let n = by_user.entry(uid).or_default();
        (*n < Self::PER_USER).then(|| {
            *n += 1;
            Waiter(this.clone(), uid)
        })
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut by_user = lock(&self.0.0);
        if let Some(n) = by_user.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                by_user.remove(&self.1);
            }
        }
    }
}

fn reply_xattr(r: Result<Vec<u8>, Error>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() <= size as usize => reply.data(&v),
        Ok(_) => reply.error(errno(&Error::Range)),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Threads reading prefetch lists, at most [`ListReaders::MAX`] at once.
#[derive(Default)]
struct ListReaders(std::sync::atomic::AtomicUsize);

/// One list reader's place; given back when dropped.
struct ListReader(Arc<ListReaders>);

impl ListReaders {
    const MAX: usize = 4;

    fn take(this: &Arc<ListReaders>) -> Option<ListReader> {
        let taken = this
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < Self::MAX).then_some(n + 1)
            });
        taken.is_ok().then(|| ListReader(this.clone()))
    }
}

impl Drop for ListReader {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn reply_empty(r: Result<(), Error>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

impl<S: Source> FuseAdapter<S> {
    /// The flags of an open reply for `opened`, made by thread `tid`: a handle whose close
    /// cannot finish anything is never flushed (no round trip per `close()`).
    fn open_flags(&self, opened: &Opened, tid: u32, flags: FopenFlags) -> FopenFlags {
        if opened.finishes {
            lock(&self.openers).insert(opened.fh, caller::process_of(tid));
            flags
        } else {
            flags | FopenFlags::FOPEN_NOFLUSH
        }
    }

    /// Replies to a request that made or found a name.
    fn reply_entry(&self, r: Result<Attr, Error>, reply: ReplyEntry) {
        reply_entry(&self.fs, r, reply)
    }

    /// Waits (`--wait`) for a name of `parent` on a thread of its own and replies from there:
    /// a FUSE thread held by each waiting consumer would stop every other request of the
    /// mount once there are as many consumers as threads. Past [`Waiters::PER_USER`] waits of
    /// caller `uid`, the lookup answers at once, as without `--wait`.
    fn wait_elsewhere(&self, uid: u32, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let Some(place) = Waiters::take(&self.waiters, uid) else {
            self.fs
                .stats()
                .name_waits_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(uid, "too many waiting lookups of this user: not waiting");
            return reply.error(errno(&Error::NotFound));
        };
        let (fs, name) = (self.fs.clone(), name.to_owned());
        let spawned = std::thread::Builder::new()
            .name("name-wait".into())
            .stack_size(WAITER_STACK)
            .spawn(move || {
                let _place = place;
                reply_entry(&fs, fs.lookup_waiting(parent, &name), reply);
            });
        if let Err(e) = spawned {
            // (The reply went with the closure: fuser answers EIO for a reply never sent.)
            tracing::warn!(error = %e, "cannot start a thread to wait for a name");
        }
    }
}

impl<S: Source> fuser::Filesystem for FuseAdapter<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.set_max_readahead(MAX_REQUEST);
        let _ = config.set_max_write(MAX_REQUEST);
        // ATOMIC_O_TRUNC: an open with O_TRUNC arrives as one open, so rewriting a produced
        // file does not first copy the bytes it is about to discard.
        // READDIRPLUS in AUTO mode: attributes come with a listing only where the caller
        // stats what it lists (see `readdirplus`).
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO;
        let _ = config.add_capabilities(wanted & config.capabilities());
        if self.fs.opens_unasked() {
            // AUTO_INVAL_DATA: without opens to say a file changed, the kernel drops a file's
            // cached pages itself when a refresh of its attributes finds a new size or mtime.
            let offered = config.capabilities();
            self.unasked = offered.contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
            if self.unasked {
                let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA & offered);
            } else {
                tracing::warn!("kernel does not offer zero-message opens: --no-open ignored");
            }
        }
        let mut passthrough = false;
        if self.fs.passthrough_enabled() {
            if !crate::sys::has_cap_sys_admin() {
                tracing::warn!(
                    "not privileged (no CAP_SYS_ADMIN): the daemon serves every read itself \
                     (FUSE passthrough needs CAP_SYS_ADMIN)"
                );
            } else if config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH) {
                passthrough = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                    && config.set_max_stack_depth(1).is_ok();
            } else {
                tracing::warn!(
                    "kernel does not offer FUSE passthrough; serving reads in the daemon"
                );
            }
        }
        self.fs.kernel_offers(Capabilities {
            passthrough,
            no_open: self.unasked,
        });
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _span = tracing::debug_span!("lookup", parent = parent.0, ?name).entered();
        match self.fs.lookup_at_once(parent.0, name, req.pid()) {
            Ok(Looked::Wait) => self.wait_elsewhere(req.uid(), parent.0, name, reply),
            Ok(Looked::Found(a)) => self.reply_entry(Ok(a), reply),
            Err(e) => self.reply_entry(Err(e), reply),
        }
    }

    // (batch_forget's default calls this for each inode.)
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _span = tracing::debug_span!("getattr", ino = ino.0).entered();
        let stats = self.fs.stats();
        stats.attr_requests.fetch_add(1, Ordering::Relaxed);
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&self.fs.ttl(&a), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(target) => reply.data(target.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _span = tracing::debug_span!("open", ino = ino.0).entered();
        if self.unasked {
            // The first open answered so is the last one sent: reads then come by inode.
            return reply.error(errno(&Error::OpensUnasked));
        }
        let truncate = flags.0 & libc::O_TRUNC != 0;
        let write = flags.0 & libc::O_ACCMODE != libc::O_RDONLY || truncate;
        let started = std::time::Instant::now();
        let opened = self.fs.open(ino.0, write, truncate);
        let latency = &self.fs.stats().latency.open;
        latency.observe(started.elapsed().as_secs_f64());
        let opened = match opened {
            Ok(o) => o,
            Err(e) => return reply.error(errno(&e)),
        };
        let fh = FileHandle(opened.fh);
        let mut modes = self.modes_of(ino.0);
        let offered = opened.passthrough.as_ref().map(|e| e.version);
        let passthrough = match (
            modes.decide(ino.0, offered, opened.keep_pages),
            &opened.passthrough,
        ) {
            (OpenMode::Passthrough, _) => true,
            (OpenMode::Bind, Some(entry)) => {
                match entry.data_file().and_then(|f| reply.open_backing(&*f)) {
                    Ok(id) => {
                        modes.bind(ino.0, id, entry.version);
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
                    ino = ino.0,
                    "open refused: another version is open in passthrough mode"
                );
                let _ = self.fs.release(opened.fh);
                return reply.error(Errno::from_i32(libc::EBUSY));
            }
            _ => false,
        };
        if passthrough {
            // Counted before the reply, so the opener sees it counted once its open returns.
            self.fs
                .stats()
                .passthrough_opens
                .fetch_add(1, Ordering::Relaxed);
            let id = modes.passthrough(opened.fh, ino.0);
            let flags = self.open_flags(&opened, req.pid(), FopenFlags::empty());
            reply.opened_passthrough(fh, flags, id);
            return;
        }
        modes.served_by_daemon(opened.fh, ino.0);
        let flags = if opened.keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        reply.opened(fh, self.open_flags(&opened, req.pid(), flags));
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _span = tracing::debug_span!("read", fh = fh.0, offset, size).entered();
        let data = if self.unasked {
            self.fs.read_unopened(ino.0, offset, size)
        } else {
            self.fs.read(fh.0, offset, size)
        };
        match data {
            Ok(data) => reply.data(&data),
            Err(e) => {
                tracing::warn!(error = %e, "read failed");
                reply.error(errno(&e))
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // A backing id let go is closed in the kernel (an ioctl) after the shard is unlocked.
        let unbound = self.modes_of(ino.0).released(fh.0);
        drop(unbound);
        lock(&self.openers).remove(&fh.0);
        reply_empty(self.fs.release(fh.0), reply);
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        if self.unasked {
            // Files opened unasked have nothing to flush: the kernel stops sending flushes.
            return reply.error(errno(&Error::OpensUnasked));
        }
        let opener = lock(&self.openers).get(&fh.0).copied().flatten();
        if let Some(p) = opener
            && Some(p) == caller::process_of(req.pid())
            && !self.held_elsewhere(p, ino.0)
        {
            let _span = tracing::debug_span!("flush", fh = fh.0).entered();
            reply_empty(self.fs.flush(fh.0), reply);
        } else {
            reply.ok();
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _span = tracing::debug_span!("create", parent = parent.0, ?name).entered();
        let exclusive = flags & libc::O_EXCL != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        let owner = (req.uid(), req.gid());
        match self
            .fs
            .create(parent.0, name, mode & !umask, (exclusive, truncate), owner)
        {
            Ok((a, o)) => {
                self.modes_of(a.ino).served_by_daemon(o.fh, a.ino);
                let flags = self.open_flags(&o, req.pid(), FopenFlags::empty());
                reply.created(
                    &self.fs.ttl(&a),
                    &file_attr(&a),
                    Generation(0),
                    FileHandle(o.fh),
                    flags,
                )
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.unasked {
            // A file opened unasked has no handle, and a read-only mount nothing to sync.
            return reply.ok();
        }
        reply_empty(self.fs.fsync(fh.0), reply);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _span = tracing::debug_span!("setattr", ino = ino.0).entered();
        // The kernel checked the caller's right to each change (default_permissions).
        let changes = Changes {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        match self.fs.setattr(ino.0, &changes) {
            Ok(a) => reply.attr(&self.fs.ttl(&a), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _span = tracing::debug_span!("mkdir", parent = parent.0, ?name).entered();
        self.reply_entry(
            self.fs
                .mkdir(parent.0, name, mode & !umask, (req.uid(), req.gid())),
            reply,
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let _span = tracing::debug_span!("symlink", parent = parent.0, ?link_name).entered();
        self.reply_entry(
            self.fs
                .symlink(parent.0, link_name, target, (req.uid(), req.gid())),
            reply,
        );
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _span = tracing::debug_span!("mknod", parent = parent.0, ?name).entered();
        let mode = mode & !(umask & 0o7777);
        self.reply_entry(
            self.fs
                .mknod(parent.0, name, mode, rdev, (req.uid(), req.gid())),
            reply,
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _span = tracing::debug_span!("link", ino = ino.0, ?newname).entered();
        self.reply_entry(self.fs.link(ino.0, newparent.0, newname), reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _span = tracing::debug_span!("unlink", parent = parent.0, ?name).entered();
        reply_empty(self.fs.remove(parent.0, name, false), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _span = tracing::debug_span!("rmdir", parent = parent.0, ?name).entered();
        reply_empty(self.fs.remove(parent.0, name, true), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _span = tracing::debug_span!("rename", ?name, ?newname).entered();
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        reply_empty(
            self.fs
                .rename(parent.0, name, newparent.0, newname, no_replace),
            reply,
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _span = tracing::debug_span!("opendir", ino = ino.0).entered();
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_CACHE_DIR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing = match self.fs.listing(fh.0) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        for (next, e) in page(ino.0, &listing, offset) {
            if reply.add(INodeNo(e.ino), next, file_type(e.kind), &e.name) {
                break;
            }
        }
        reply.ok();
    }

    // The kernel (AUTO mode) asks for attributes with a directory's first page, and with a
    // later page when it looked up an entry of the directory since the page before: a scan
    // that stats what it lists. Attributes for every entry of a first page made `find` over a
    // million files 3x slower (a stat per entry on the shared file system, an inode per entry
    // in the kernel; `find` stats none), so the first page is "." alone (the kernel links
    // neither "." nor ".."), after which a walk that does not stat gets plain READDIRs and a
    // scan that does gets its pages with attributes: one request per page, not one LOOKUP
    // per entry.
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _span = tracing::debug_span!("readdirplus", ino = ino.0, offset).entered();
        let listing = match self.fs.listing(fh.0) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        if offset > 0 {
            self.fs.listing_with_attrs(ino.0, fh.0, &listing, offset);
        }
        for (next, e) in page(ino.0, &listing, offset) {
            let dots = next <= 2;
            // ("." and "..", which come first, carry the directory's own attributes.)
            let attr = if dots {
                match self.fs.getattr(ino.0) {
                    Ok(a) => a,
                    Err(e) => return reply.error(errno(&e)),
                }
            } else {
                match self.fs.lookup_listed(ino.0, &e.name) {
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
            let full = reply.add(
                INodeNo(attr.ino),
                next,
                &e.name,
                &ttl,
                &file_attr(&attr),
                Generation(0),
            );
            if full {
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
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let caller = (req.uid(), req.gid(), req.pid());
        let is_prefetch = name.to_str().and_then(super::prefetch::request).is_some();
        if !is_prefetch {
            return reply_xattr(self.fs.getxattr(ino.0, name, caller), size, reply);
        }
        // A prefetch list is read on a thread of its own: a list stored on this very mount is
        // read through the FUSE threads, and with each of them waiting on such a read the
        // mount would stop. A few at once: they are one request per rank and epoch.
        let Some(permit) = ListReaders::take(&self.list_readers) else {
            return reply.error(errno(&Error::PrefetchFull));
        };
        let (fs, name) = (self.fs.clone(), name.to_owned());
        let spawned = std::thread::Builder::new()
            .name("prefetch-list".into())
            .spawn(move || {
                let _permit = permit;
                reply_xattr(fs.getxattr(ino.0, &name, caller), size, reply);
            });
        if let Err(e) = spawned {
            // (The reply went with the closure: fuser answers EIO for a reply never sent.)
            tracing::warn!(error = %e, "cannot start a thread to read a prefetch list");
        }
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }
}
