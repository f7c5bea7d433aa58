//! The file system's operations, as the kernel adapter calls them: each one a call to the
//! component that does it (lookups and waits for produced names: [`super::lookup`]), and the
//! mount root's control attributes, which `dyadfs stats`, `status` and `scrub` read and
//! `dyadfs prefetch` hands its lists over as (the only extended attributes dyadfs has).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::caller::Context;
use super::inodes::{InodeShedder, ROOT_INO};
use super::{Attr, Changes, DirEntry, DyadFs, Error, Opened, prefetch};
use crate::cache::ReadBytes;
use crate::core::source::Source;
use crate::stats::{MemberStatus, SCRUB_XATTR, STATS_XATTR, STATUS_XATTR, StatusReport};
use std::sync::Arc;

impl<S: Source> DyadFs<S> {
    /// How long the kernel may trust a node's name and attributes.
    pub fn ttl(&self, attr: &Attr) -> Duration {
        self.tree.ttl(attr)
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr, Error> {
        self.tree.getattr(ino)
    }

    pub fn readlink(&self, ino: u64) -> Result<PathBuf, Error> {
        self.tree.readlink(ino)
    }

    /// The backing file system's `statvfs`: the space the dataset lives in.
    pub fn statfs(&self) -> Result<libc::statvfs, Error> {
        self.tree.statfs()
    }

    /// The shedder of the inode table, for a thread of its own.
    pub fn shedder(&self) -> InodeShedder {
        self.tree.shedder()
    }

    /// The kernel forgets `n` lookups of inode `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        self.tree.forget(ino, n)
    }

    pub fn inode_count(&self) -> usize {
        self.tree.inode_count()
    }

    pub fn opendir(&self, ino: u64) -> Result<u64, Error> {
        self.tree.opendir(ino)
    }

    pub fn listing(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>, Error> {
        self.tree.listing(fh)
    }

    pub fn releasedir(&self, fh: u64) {
        self.tree.releasedir(fh)
    }

    /// A readdirplus from `offset`: the scan's next entries are stat'ed ahead of it.
    pub fn listing_with_attrs(&self, ino: u64, fh: u64, listing: &Arc<Vec<DirEntry>>, offset: u64) {
        self.tree.listing_with_attrs(ino, fh, listing, offset)
    }

    /// Opens a file. `write`: open for writing (a produced file gets a new version, started
    /// from the current bytes unless `truncate`); backing files are read-only.
    pub fn open(&self, ino: u64, write: bool, truncate: bool) -> Result<Opened, Error> {
        if write {
            self.produce.open_to_write(ino, truncate)
        } else {
            self.files.open(ino)
        }
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<ReadBytes, Error> {
        self.files.read(fh, offset, size)
    }

    /// A read of a file the kernel opened without asking (`--no-open`): opened for this read
    /// alone. Its cache entry is held for the read, not between reads, so eviction is free to
    /// take files the kernel has not closed.
    pub fn read_unopened(&self, ino: u64, offset: u64, size: u32) -> Result<ReadBytes, Error> {
        let opened = self.files.open(ino)?;
        let data = self.files.read(opened.fh, offset, size);
        self.release(opened.fh)?;
        data
    }

    /// Whether the kernel opens files without asking (`--no-open`).
    pub fn opens_unasked(&self) -> bool {
        self.files.opens_unasked()
    }

    /// The last close of an open file; the last writable handle of a file being written
    /// finishes it, unless a close (`flush`) did.
    pub fn release(&self, fh: u64) -> Result<(), Error> {
        self.produce.release(fh)
    }

    /// Creates and opens a new file owned by `owner` (uid, gid: the caller's), or opens an
    /// existing one, unless `exclusive` (`flags`: exclusive, truncate).
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: (bool, bool),
        owner: (u32, u32),
    ) -> Result<(Attr, Opened), Error> {
        self.produce.create(parent, name, mode, flags, owner)
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Error> {
        self.produce.write(fh, offset, data)
    }

    /// A `close()` by the process that opened handle `fh`: a file being written may be
    /// finished now (see `Produce::flush`).
    pub fn flush(&self, fh: u64) -> Result<(), Error> {
        self.produce.flush(fh)
    }

    pub fn fsync(&self, fh: u64) -> Result<(), Error> {
        self.produce.fsync(fh)
    }

    /// chmod, chown, truncate and utimes.
    pub fn setattr(&self, ino: u64, changes: &Changes) -> Result<Attr, Error> {
        self.produce.setattr(ino, changes)
    }

    pub fn link(&self, ino: u64, new_parent: u64, new_name: &OsStr) -> Result<Attr, Error> {
        self.produce.link(ino, new_parent, new_name)
    }

    pub fn mkdir(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        owner: (u32, u32),
    ) -> Result<Attr, Error> {
        self.produce.mkdir(parent, name, mode, owner)
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &Path,
        owner: (u32, u32),
    ) -> Result<Attr, Error> {
        self.produce.symlink(parent, name, target, owner)
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        owner: (u32, u32),
    ) -> Result<Attr, Error> {
        self.produce.mknod(parent, name, mode, rdev, owner)
    }

    /// unlink (`dir` false) and rmdir.
    pub fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Error> {
        self.produce.remove(parent, name, dir)
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        no_replace: bool,
    ) -> Result<(), Error> {
        self.produce
            .rename(parent, name, new_parent, new_name, no_replace)
    }

    /// Extended attributes: only the root's control attributes exist (stats, status, scrub,
    /// prefetch requests), asked by `caller`.
    pub fn getxattr(&self, ino: u64, name: &OsStr, caller: &dyn Context) -> Result<Vec<u8>, Error> {
        if ino != ROOT_INO {
            return Err(Error::NoAttr);
        }
        if let Some((stream, list)) = name.to_str().and_then(prefetch::request) {
            let who = caller.credentials();
            return self.prefetch.request(stream, list, who);
        }
        let cache = &self.files.reader.cache;
        // A scrub reads the whole cache, a status asks every member: work any local user could
        // otherwise start at will.
        if (name == SCRUB_XATTR || name == STATUS_XATTR) && !may_administer(caller.uid()) {
            return Err(Error::NotOwner);
        }
        if name == SCRUB_XATTR {
            return Ok(serde_json::to_vec(&cache.scrub()).expect("a report serializes"));
        }
        if name == STATUS_XATTR {
            let report = match self.status.get() {
                Some(f) => f(),
                None => StatusReport {
                    node: 0,
                    members: vec![MemberStatus {
                        id: 0,
                        addr: String::new(),
                        rack: String::new(),
                        state: "self".into(),
                        files: Some(cache.cached_files()),
                        bytes: Some(cache.used_bytes()),
                    }],
                },
            };
            return Ok(serde_json::to_vec(&report).expect("a report serializes"));
        }
        if name != STATS_XATTR {
            return Err(Error::NoAttr);
        }
        let snap = (self.snapshots())();
        Ok(serde_json::to_vec(&snap).expect("stats serialize"))
    }
}

/// Whether caller `uid` may ask for whole-cache or cluster-wide work: root or the mount's owner
/// (the daemon's user).
fn may_administer(uid: u32) -> bool {
    uid == 0 || uid == crate::sys::euid()
}
