//! The /dev/fuse transport, by fuser: its `Filesystem` methods hand each request to the
//! handlers of `ops.rs` with fuser's reply objects, which implement the reply traits here. The
//! kernel's INIT is answered here too, the ring asked for when it is wanted and offered.

use std::ffi::OsStr;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use super::convert::{file_attr, file_type, time_set};
use super::ops::{Caller, Ops};
use super::passthrough::Passthrough;
use super::reply::{
    AttrReply, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply, Fail,
    OpenReply, StatfsReply, WriteReply, XattrReply,
};
use crate::core::Kind;
use crate::core::source::Source;
use crate::fs::{Attr, Capabilities, Changes, DyadFs};

/// Which transport carries the FUSE requests (`mount --fuse-transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuseTransport {
    /// The ring where the kernel offers it (`enable_uring` set, kernel 6.14 or later),
    /// /dev/fuse otherwise.
    Auto,
    /// The ring, or a refusal to mount without it.
    Uring,
    /// /dev/fuse only.
    Dev,
}

/// Largest read/write request the kernel sends us: 1 MiB (256 pages) instead of 128 KiB (reads
/// no larger than the mount's readahead: 128 KiB unless `mount --kernel-readahead` raises it).
pub const MAX_REQUEST: u32 = 1 << 20;

pub struct FuseAdapter<S: Source> {
    ops: Arc<Ops<S>>,
    transport: FuseTransport,
}

impl<S: Source> FuseAdapter<S> {
    /// Wraps the file system mounted at `mountpoint` (see [`Ops::new`]); `transport`: whether
    /// to ask the kernel for the ring at INIT.
    pub fn new(
        fs: DyadFs<S>,
        mountpoint: &std::path::Path,
        transport: FuseTransport,
    ) -> io::Result<Self> {
        Ok(FuseAdapter {
            ops: Arc::new(Ops::new(fs, mountpoint)?),
            transport,
        })
    }

    /// The handlers, shared with the ring's threads.
    pub fn ops(&self) -> Arc<Ops<S>> {
        self.ops.clone()
    }

    /// `reply`, counted among the requests running until it is made.
    fn counted<R>(&self, reply: R) -> super::running::Counted<R> {
        super::running::Counted::new(reply, self.ops.running())
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

impl<S: Source> fuser::Filesystem for FuseAdapter<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let fs = &self.ops.fs;
        let _ = config.set_max_readahead(MAX_REQUEST);
        let _ = config.set_max_write(MAX_REQUEST);
        // ATOMIC_O_TRUNC: an open with O_TRUNC arrives as one open, so rewriting a produced
        // file does not first copy the bytes it is about to discard.
        // READDIRPLUS in AUTO mode: attributes come with a listing only where the caller
        // stats what it lists (see `Ops::readdirplus`).
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO;
        let _ = config.add_capabilities(wanted & config.capabilities());
        let mut unasked = false;
        if fs.opens_unasked() {
            // AUTO_INVAL_DATA: without opens to say a file changed, the kernel drops a file's
            // cached pages itself when a refresh of its attributes finds a new size or mtime.
            let offered = config.capabilities();
            unasked = offered.contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
            if unasked {
                let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA & offered);
            } else {
                tracing::warn!("kernel does not offer zero-message opens: --no-open ignored");
            }
        }
        let mut passthrough = false;
        if fs.passthrough_enabled() {
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
        let ring = match self.transport {
            FuseTransport::Dev => false,
            FuseTransport::Auto | FuseTransport::Uring => {
                let offered = config
                    .capabilities()
                    .contains(InitFlags::FUSE_OVER_IO_URING);
                offered
                    && config
                        .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                        .is_ok()
            }
        };
        self.ops.ring_taken.store(ring, Ordering::Relaxed);
        let direct_io_mmap = config
            .capabilities()
            .contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            && config
                .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
                .is_ok();
        fs.kernel_offers(Capabilities {
            passthrough,
            no_open: unasked,
            direct_io_mmap,
        });
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.ops
            .lookup(caller(req), parent.0, name, self.counted(reply));
    }

    // (batch_forget's default calls this for each inode.)
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.ops.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.ops.getattr(ino.0, self.counted(reply));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.ops.readlink(ino.0, self.counted(reply));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.ops
            .open(caller(req), ino.0, flags.0, self.counted(reply));
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
        self.ops
            .read(ino.0, fh.0, offset, size, self.counted(reply));
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
        self.ops.release(ino.0, fh.0, self.counted(reply));
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.ops
            .flush(caller(req), ino.0, fh.0, self.counted(reply));
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
        let c = caller(req);
        self.ops
            .create(c, parent.0, name, mode, umask, flags, self.counted(reply));
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
        self.ops.write(fh.0, offset, data, self.counted(reply));
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.ops.fsync(fh.0, self.counted(reply));
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
        let changes = Changes {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        self.ops.setattr(ino.0, &changes, self.counted(reply));
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
        self.ops.mkdir(
            caller(req),
            parent.0,
            name,
            mode,
            umask,
            self.counted(reply),
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
        self.ops.symlink(
            caller(req),
            parent.0,
            link_name,
            target,
            self.counted(reply),
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
        let c = caller(req);
        self.ops
            .mknod(c, parent.0, name, mode, umask, rdev, self.counted(reply));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.ops
            .link(ino.0, newparent.0, newname, self.counted(reply));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.ops.unlink(parent.0, name, self.counted(reply));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.ops.rmdir(parent.0, name, self.counted(reply));
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
        let flags = flags.bits();
        self.ops.rename(
            parent.0,
            name,
            newparent.0,
            newname,
            flags,
            self.counted(reply),
        );
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.ops.opendir(caller(req), ino.0, self.counted(reply));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.ops.readdir(ino.0, fh.0, offset, self.counted(reply));
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.ops
            .readdirplus(ino.0, fh.0, offset, self.counted(reply));
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.ops.releasedir(fh.0, self.counted(reply));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.ops.statfs(self.counted(reply));
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.ops
            .getxattr(caller(req), ino.0, name, size, self.counted(reply));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.ops.listxattr(size, self.counted(reply));
    }
}

// fuser's replies as the handlers' reply traits.

macro_rules! fails {
    ($($t:ty),*) => {$(
        impl Fail for $t {
            fn error(self, errno: i32) {
                <$t>::error(self, Errno::from_i32(errno))
            }
        }
    )*};
}

fails!(
    ReplyEntry,
    ReplyAttr,
    ReplyData,
    ReplyOpen,
    ReplyCreate,
    ReplyWrite,
    ReplyEmpty,
    ReplyStatfs,
    ReplyXattr,
    ReplyDirectory,
    ReplyDirectoryPlus
);

impl EntryReply for ReplyEntry {
    fn entry(self, attr: &Attr, ttl: Duration) {
        ReplyEntry::entry(self, &ttl, &file_attr(attr), Generation(0))
    }
}

impl AttrReply for ReplyAttr {
    fn attr(self, attr: &Attr, ttl: Duration) {
        ReplyAttr::attr(self, &ttl, &file_attr(attr))
    }
}

impl DataReply for ReplyData {
    fn data(self, bytes: &[u8]) {
        ReplyData::data(self, bytes)
    }
}

impl OpenReply for ReplyOpen {
    fn opened(self, fh: u64, flags: u32) {
        ReplyOpen::opened(self, FileHandle(fh), FopenFlags::from_bits_retain(flags))
    }

    fn opened_passthrough(self, fh: u64, flags: u32, file: &Passthrough) {
        // SAFETY: the id is open on this session's connection while `backing` lives, which
        // outlasts this call; the wrapper is given back unclosed (`into_raw`) right after.
        let id = unsafe { self.wrap_backing(file.id()) };
        let flags = FopenFlags::from_bits_retain(flags);
        ReplyOpen::opened_passthrough(self, FileHandle(fh), flags, &id);
        let _ = id.into_raw();
    }
}

impl CreateReply for ReplyCreate {
    fn created(self, attr: &Attr, ttl: Duration, fh: u64, flags: u32) {
        let flags = FopenFlags::from_bits_retain(flags);
        let attr = file_attr(attr);
        ReplyCreate::created(self, &ttl, &attr, Generation(0), FileHandle(fh), flags)
    }
}

impl WriteReply for ReplyWrite {
    fn written(self, n: u32) {
        ReplyWrite::written(self, n)
    }
}

impl EmptyReply for ReplyEmpty {
    fn ok(self) {
        ReplyEmpty::ok(self)
    }
}

impl StatfsReply for ReplyStatfs {
    fn statfs(self, s: &libc::statvfs) {
        ReplyStatfs::statfs(
            self,
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        )
    }
}

impl XattrReply for ReplyXattr {
    fn xattr_size(self, n: u32) {
        ReplyXattr::size(self, n)
    }

    fn xattr_data(self, bytes: &[u8]) {
        ReplyXattr::data(self, bytes)
    }
}

impl DirReply for ReplyDirectory {
    fn add(&mut self, ino: u64, next: u64, kind: Kind, name: &OsStr) -> bool {
        ReplyDirectory::add(self, INodeNo(ino), next, file_type(kind), name)
    }

    fn done(self) {
        ReplyDirectory::ok(self)
    }
}

impl DirPlusReply for ReplyDirectoryPlus {
    fn add_plus(&mut self, attr: &Attr, ttl: Duration, next: u64, name: &OsStr) -> bool {
        let a = file_attr(attr);
        ReplyDirectoryPlus::add(self, INodeNo(attr.ino), next, name, &ttl, &a, Generation(0))
    }

    fn done_plus(self) {
        ReplyDirectoryPlus::ok(self)
    }
}
