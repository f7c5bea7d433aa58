//! The producer side, one component of [`DyadFs`](super::DyadFs): the operations that change
//! the produced namespace: opens to write, create, write, mkdir, symlink, mknod, link, setattr
//! and fsync (the close that finishes a written file: [`close`]; remove and rename:
//! [`rename`]). The backing tree is never modified.
//!
//! Times follow POSIX: a name's ctime changes with its attributes, a directory's mtime and
//! ctime with its entries (a produced directory's; the backing tree's stay as they are).

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

mod close;
mod rename;

use super::Error;
use super::attr::{Attr, Changes, TimeSet};
use super::found::Found;
use super::handles::{Handle, Opened};
use super::inodes::{Node, link_id};
use super::paths::{join, split};
use super::tree::Tree;
use super::write::{Producer, Staged};
use crate::core::Kind;
use crate::core::Version;
use crate::core::names::Namespace;
use crate::core::names::{Name, NameMeta, TARGET_MAX, links_dir, now_ns};
use crate::core::source::Source;
use crate::core::sync::lock;
use crate::fill::Reader;

/// How many times an open to write resolves its path again when the file it found being
/// written was finished meanwhile; each time another writer opened, wrote and finished it in
/// between.
const OPEN_RETRIES: usize = 8;

pub struct Produce<S: Source> {
    tree: Arc<Tree>,
    pub(super) producer: Arc<Producer>,
    names: Arc<dyn Namespace>,
    /// The bytes of a produced file that a new version starts from.
    reader: Reader<S>,
}

impl<S: Source> Produce<S> {
    pub(super) fn new(tree: Arc<Tree>, reader: Reader<S>) -> Self {
        Produce {
            producer: tree.producer.clone(),
            names: tree.names.clone(),
            tree,
            reader,
        }
    }

    /// Opens inode `ino` to write: a file being written gets one writer more, a produced file
    /// a new version (started from its current bytes unless `truncate`); backing files are
    /// read-only. Its path is resolved again while the file being written that it named was
    /// finished meanwhile, a few times.
    pub(in crate::fs) fn open_to_write(&self, ino: u64, truncate: bool) -> Result<Opened, Error> {
        let node = self.tree.node(ino)?;
        for _ in 0..=OPEN_RETRIES {
            let (path, found) = self.tree.resolve_node(&node)?;
            if let Some(opened) = self.open_found(path, found, truncate)? {
                return Ok(opened);
            }
        }
        Err(Error::Contended)
    }

    /// What an open to write does with what its path resolved to (`None`: the file being
    /// written that it found was finished, published or unlinked, after it was resolved).
    pub(in crate::fs) fn open_found(
        &self,
        path: String,
        found: Found,
        truncate: bool,
    ) -> Result<Option<Opened>, Error> {
        match found {
            Found::Staged(s) => {
                // Under the finishing lock, which the close that finishes a file holds
                // throughout: either that close has not begun (this handle is one writer more,
                // and the last release finishes the file), or it is over and the file was
                // unstaged, its bytes sealed; a handle on it would write into the sealed
                // object and finish it again.
                let held = s.clone();
                let _finishing = lock(&held.finishing);
                if *lock(&s.ended) {
                    return Ok(None);
                }
                if truncate {
                    s.set_len(0)?;
                    s.dirty.store(true, Ordering::Relaxed);
                }
                Ok(Some(self.tree.handles.staged(s, true)))
            }
            Found::Backing(_) => Err(Error::ReadOnly),
            Found::Produced(n) => {
                super::found::openable(&n)?;
                let staged = self.new_version(&path, &n, !truncate)?;
                self.tree.upsert(path, &Found::Staged(staged.clone()), 0)?;
                Ok(Some(self.tree.handles.staged(staged, true)))
            }
        }
    }

    /// Starts a new version of the produced file `n` at `path` (its owner kept, and its hard
    /// link record if it has one), from its current bytes if `copy`.
    pub(in crate::fs) fn new_version(
        &self,
        path: &str,
        n: &Name,
        copy: bool,
    ) -> Result<Arc<Staged>, Error> {
        let staged = self
            .producer
            .create(path, n.mode, (n.uid, n.gid))
            .map_err(Error::Write)?;
        if !n.meta.inode.is_empty() {
            let _ = staged.inode.set(n.meta.inode.clone());
        }
        if copy && let Err(e) = self.copy_into(n, &staged) {
            // Not left staged under the name with part of the bytes (and holding the disk).
            self.producer.unstage(&staged);
            return Err(e);
        }
        Ok(staged)
    }

    /// Copies a produced file's current bytes into a new version being written.
    pub(in crate::fs) fn copy_into(&self, n: &Name, staged: &Staged) -> Result<(), Error> {
        let version = Version {
            size: n.size,
            mtime_ns: n.mtime_ns,
        };
        let entry = self.reader.cache.entry_or_uncached(&n.object, version);
        entry.pin();
        let r = (|| {
            let mut off = 0;
            while off < n.size {
                let data = self.reader.read(&entry, off, 1 << 20)?;
                self.stage(staged, &data, off)?;
                off += data.len() as u64;
            }
            Ok(())
        })();
        entry.unpin();
        r
    }

    /// Creates and opens a new file owned by `owner` (uid, gid: the caller's), or opens an
    /// existing one, unless `exclusive`.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: (bool, bool),
        owner: (u32, u32),
    ) -> Result<(Attr, Opened), Error> {
        let (exclusive, truncate) = flags;
        let parent = self.tree.node(parent)?;
        if self.tree.fresh_attr(&parent)?.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let path = join(&Tree::path_of(&parent), name);
        match self.tree.resolve(&path, Duration::ZERO) {
            Ok(_) if exclusive => return Err(Error::Exists),
            Ok(found) => {
                let attr = self.tree.upsert(path.clone(), &found, 1)?;
                let opened = self.open_to_write(attr.ino, truncate)?;
                return Ok((self.tree.getattr(attr.ino)?, opened));
            }
            Err(Error::NotFound) => {}
            Err(e) => return Err(e),
        }
        let staged = self
            .producer
            .create(&path, mode, owner)
            .map_err(Error::Write)?;
        self.touch_dir(&parent)?;
        let attr = self.tree.upsert(path, &Found::Staged(staged.clone()), 1)?;
        Ok((attr, self.tree.handles.staged(staged, true)))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Error> {
        match &*self.tree.handles.get(fh)? {
            Handle::Staged {
                staged,
                writable: true,
                ..
            } if !staged.finished_at_flush.load(Ordering::Relaxed) => {
                self.stage(staged, data, offset)?;
                staged.dirty.store(true, Ordering::Relaxed);
                // A write is a modification: a time set before it no longer holds.
                let mut set = lock(&staged.set);
                if set.mtime_ns.is_some() || set.ctime_ns.is_some() {
                    (set.mtime_ns, set.ctime_ns) = (None, None);
                }
                drop(set);
                self.tree
                    .stats
                    .bytes_written
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                Ok(data.len() as u32)
            }
            _ => Err(Error::BadHandle(fh)),
        }
    }

    /// Writes `data` at `offset` of a file being written. A cache file system out of room
    /// evicts cached files (the capacity does not count files being written) and the write is
    /// tried again; a write that still fails, fails with its errno (ENOSPC, not EIO, and at the
    /// write, not at close), and the file is never published.
    fn stage(&self, staged: &Staged, data: &[u8], offset: u64) -> Result<(), Error> {
        // Refused (past the file size limit, the capacity, or its owner's share: EFBIG, ENOSPC,
        // EDQUOT) is failed too: the file no longer holds what its producer wrote, so it is
        // never published (a consumer would read its first part as the whole file).
        let end = offset.saturating_add(data.len() as u64);
        if let Err(e) = self
            .producer
            .room_for(end)
            .and_then(|()| staged.charge.resize(end, true))
        {
            staged.failed(std::io::Error::from_raw_os_error(e.errno()));
            return Err(e);
        }
        let mut r = staged.file.write_all_at(data, offset);
        if let Err(e) = &r
            && matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            && self.reader.cache.make_room(data.len() as u64)
        {
            r = staged.file.write_all_at(data, offset);
        }
        r.map_err(|e| self.staging_failed(staged, e))
    }

    /// A write (or sync) of a file being written failed with `e`: counted with the cache's
    /// write errors (it is the same disk), and the file is never published.
    fn staging_failed(&self, staged: &Staged, e: std::io::Error) -> Error {
        self.reader.cache.write_failed(&lock(&staged.path), &e);
        Error::Write(staged.failed(e))
    }

    /// A name went away (`drop`: unlinked) or was replaced by a new version: a hard link's
    /// record loses a name (and its bytes with the last one); a file's holder is told that no
    /// name points at its object any more.
    pub(in crate::fs) fn unname(&self, old: &Name, drop: bool) -> Result<(), Error> {
        if old.is_pointer() {
            let key = &old.meta.inode;
            let Some(mut r) = self.tree.record(key)? else {
                return Ok(());
            };
            r.meta.nlink = r.meta.nlink.saturating_sub(1);
            if r.meta.nlink == 0 {
                self.set_record(key, None)?;
                self.release_object(&r, drop);
            } else {
                r.meta.ctime_ns = Some(now_ns());
                self.set_record(key, Some(r.clone()))?;
                self.refresh_link(&r);
            }
        } else if !old.object.is_empty() {
            self.release_object(old, drop);
        }
        Ok(())
    }

    /// The inode of a hard-linked file, if the kernel knows it, takes the record's new
    /// attributes (its other names' link count and ctime changed).
    fn refresh_link(&self, r: &Name) {
        let inodes = self.tree.inodes.read().unwrap_or_else(|e| e.into_inner());
        if let Some(&ino) = inodes.by_path.get(&link_id(&r.meta.inode))
            && let Some(node) = inodes.nodes.get(&ino)
        {
            *lock(&node.attr) = (Attr::from_name(ino, r), std::time::Instant::now());
        }
    }

    /// Publishes (or removes) a hard-linked file's record.
    pub(in crate::fs) fn set_record(&self, key: &str, r: Option<Name>) -> Result<(), Error> {
        self.names
            .set(&links_dir(key), key, r)
            .map_err(Error::Names)?;
        Ok(())
    }

    /// Publishes changed attributes of a name at `path` (or of its hard link record).
    pub(in crate::fs) fn store(&self, path: &str, n: &Name) -> Result<(), Error> {
        match n.meta.inode.as_str() {
            "" => {
                let (dir, file) = split(path);
                self.names
                    .set(dir, file, Some(n.clone()))
                    .map_err(Error::Names)?;
                Ok(())
            }
            key => self.set_record(key, Some(n.clone())),
        }
    }

    /// What `path` is, once a file whose last writer just closed is finished (or whose
    /// release, sent after its opener's `close()`, finished it: see
    /// [`super::write::Staged::release_expected`]).
    pub(in crate::fs) fn settled(&self, path: &str) -> Result<Found, Error> {
        match self.tree.resolve(path, Duration::ZERO)? {
            Found::Staged(s) if s.closed() => {
                drop(lock(&s.finishing));
                self.tree.resolve(path, Duration::ZERO)
            }
            Found::Staged(s) if s.await_release(super::write::RELEASE_WAIT) => {
                self.tree.resolve(path, Duration::ZERO)
            }
            found => Ok(found),
        }
    }

    /// Makes `new_name` in `new_parent` a hard link to the produced file `ino`: the file's
    /// attributes move to a record (in [`links_dir`]) that all its names point at.
    pub fn link(&self, ino: u64, new_parent: u64, new_name: &OsStr) -> Result<Attr, Error> {
        let (from, _) = self.tree.resolve_node(&*self.tree.node(ino)?)?;
        let parent = self.tree.node(new_parent)?;
        let to = self.free_path(&parent, new_name)?;
        let mut r = match self.settled(&from)? {
            Found::Backing(_) => return Err(Error::ReadOnly),
            // Still open for writing: its bytes have no object to share yet.
            Found::Staged(_) => return Err(Error::NoLinks),
            Found::Produced(n) if n.dir => return Err(Error::NoLinks),
            Found::Produced(n) => n,
        };
        let me = self.names.me();
        r.meta.ctime_ns = Some(now_ns());
        if r.meta.inode.is_empty() {
            r.meta.inode = self.producer.new_link_key();
            r.meta.nlink = 2;
            self.store(&from, &r)?;
            let (fd, ff) = split(&from);
            self.names
                .set(fd, ff, Some(Name::pointer(&r.meta.inode, me)))
                .map_err(Error::Names)?;
        } else {
            r.meta.nlink += 1;
            self.store(&from, &r)?;
        }
        let (td, tf) = split(&to);
        self.names
            .set(td, tf, Some(Name::pointer(&r.meta.inode, me)))
            .map_err(Error::Names)?;
        self.touch_dir(&parent)?;
        self.tree.upsert(from, &Found::Produced(r.clone()), 0)?;
        self.tree.upsert(to, &Found::Produced(r), 1)
    }

    /// Tells an object's holder that no name points at it any more.
    pub(in crate::fs) fn release_object(&self, n: &Name, drop: bool) {
        if n.holder == self.names.me() {
            let v = Version {
                size: n.size,
                mtime_ns: n.mtime_ns,
            };
            self.producer.released(&n.object, v, drop);
        } else {
            self.names
                .release(n.holder, &n.object, n.size, n.mtime_ns, drop);
        }
    }

    /// Makes a directory owned by `owner` (uid, gid: the caller's).
    pub fn mkdir(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        owner: (u32, u32),
    ) -> Result<Attr, Error> {
        let n = self.new_name(true, mode, owner, NameMeta::default());
        self.make(parent, name, n)
    }

    /// Makes a symlink to `target` owned by `owner`.
    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &std::path::Path,
        owner: (u32, u32),
    ) -> Result<Attr, Error> {
        let target = target.as_os_str().as_encoded_bytes();
        if target.len() >= TARGET_MAX {
            return Err(Error::NameTooLong);
        }
        let meta = NameMeta {
            special: libc::S_IFLNK,
            target: String::from_utf8(target.to_vec()).map_err(|_| Error::Invalid)?,
            ..NameMeta::default()
        };
        let n = self.new_name(false, 0o777, owner, meta);
        self.make(parent, name, n)
    }

    /// Makes a FIFO, socket or device node (a name without bytes: the kernel serves FIFOs and
    /// sockets itself, and the mount is `nodev`) or an empty regular file.
    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        owner: (u32, u32),
    ) -> Result<Attr, Error> {
        if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 {
            let (attr, opened) = self.create(parent, name, mode & 0o7777, (true, false), owner)?;
            self.release(opened.fh)?;
            return self.tree.getattr(attr.ino);
        }
        let special = Kind::special_bits(mode).ok_or(Error::Invalid)?;
        let meta = NameMeta {
            special,
            rdev: rdev.into(),
            ..NameMeta::default()
        };
        let n = self.new_name(false, mode, owner, meta);
        self.make(parent, name, n)
    }

    /// A name without bytes made now by this node.
    fn new_name(&self, dir: bool, mode: u32, owner: (u32, u32), meta: NameMeta) -> Name {
        Name {
            dir,
            object: String::new(),
            size: 0,
            mtime_ns: now_ns(),
            mode: mode & 0o7777,
            holder: self.names.me(),
            uid: owner.0,
            gid: owner.1,
            meta,
        }
    }

    /// Publishes a new name without bytes (a directory, symlink or special file) in `parent`.
    fn make(&self, parent: u64, name: &OsStr, n: Name) -> Result<Attr, Error> {
        let parent = self.tree.node(parent)?;
        let path = self.free_path(&parent, name)?;
        let (dir, file) = split(&path);
        self.names
            .set(dir, file, Some(n.clone()))
            .map_err(Error::Names)?;
        self.touch_dir(&parent)?;
        self.tree.upsert(path, &Found::Produced(n), 1)
    }

    /// The path of a new `name` in the directory `parent`, which must not exist yet.
    fn free_path(&self, parent: &Node, name: &OsStr) -> Result<String, Error> {
        if self.tree.fresh_attr(parent)?.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let path = join(&Tree::path_of(parent), name);
        match self.tree.resolve(&path, Duration::ZERO) {
            Ok(_) => Err(Error::Exists),
            Err(Error::NotFound) => Ok(path),
            Err(e) => Err(e),
        }
    }

    /// A produced directory's entries changed now: its mtime and ctime move (a backing
    /// directory's stay: the backing tree is never modified). Whether `dir` is produced comes
    /// from its (cached) attributes, not from a stat of the shared file system per entry.
    pub(in crate::fs) fn touch_dir(&self, dir: &Node) -> Result<(), Error> {
        if !self.tree.fresh_attr(dir).is_ok_and(|a| a.produced) {
            return Ok(());
        }
        let path = Tree::path_of(dir);
        let (parent, file) = split(&path);
        let Some(mut n) = self
            .names
            .get(parent, file, Duration::ZERO)
            .map_err(Error::Names)?
        else {
            return Ok(());
        };
        let now = now_ns();
        (n.meta.mtime_ns, n.meta.ctime_ns) = (Some(now), Some(now));
        self.names
            .set(parent, file, Some(n.clone()))
            .map_err(Error::Names)?;
        self.tree.upsert(path, &Found::Produced(n), 0)?;
        Ok(())
    }

    /// Whether a produced directory has entries (published or being written here).
    pub(in crate::fs) fn dir_has_entries(&self, path: &str) -> Result<bool, Error> {
        Ok(self.producer.has_staged_under(path) || self.names.any(path).map_err(Error::Names)?)
    }

    /// chmod, chown, truncate and utimes. A file being written changes in place; a published
    /// name is published again with its new attributes (a new size is a new version of the
    /// bytes); the backing tree is read-only.
    pub fn setattr(&self, ino: u64, changes: &Changes) -> Result<Attr, Error> {
        let node = self.tree.node(ino)?;
        let (path, _) = self.tree.resolve_node(&node)?;
        let now = now_ns();
        let time = |t: Option<TimeSet>| t.map(|t| t.at(now));
        match self.settled(&path)? {
            Found::Staged(s) => {
                if let Some(size) = changes.size {
                    self.producer.room_for(size)?;
                    s.set_len(size)?;
                    s.dirty.store(true, Ordering::Relaxed);
                }
                if !changes.is_empty() {
                    self.setattr_staged(&s, changes, now);
                }
                self.tree.upsert(path, &Found::Staged(s), 0)
            }
            Found::Backing(meta) => {
                let attr = self.tree.upsert(path, &Found::Backing(meta), 0)?;
                if changes.is_empty() {
                    Ok(attr)
                } else {
                    Err(Error::ReadOnly)
                }
            }
            Found::Produced(n) if changes.size.is_some_and(|s| s != n.size) => {
                if !n.is_file() {
                    return Err(Error::Invalid);
                }
                self.producer.room_for(changes.size.unwrap_or(0))?;
                // A new version of the bytes, written and published at once.
                let staged = self.new_version(&path, &n, true)?;
                if let Err(e) = staged.set_len(changes.size.unwrap_or(0)) {
                    // Not left staged under the name, as when its copy fails.
                    self.producer.unstage(&staged);
                    return Err(e);
                }
                self.setattr_staged(&staged, changes, now);
                self.finish_write(&staged)?;
                self.tree.getattr(ino)
            }
            Found::Produced(mut n) => {
                if changes.is_empty() {
                    return self.tree.upsert(path, &Found::Produced(n), 0);
                }
                if let Some(mode) = changes.mode {
                    n.mode = mode & 0o7777;
                }
                n.uid = changes.uid.unwrap_or(n.uid);
                n.gid = changes.gid.unwrap_or(n.gid);
                n.meta.atime_ns = time(changes.atime).or(n.meta.atime_ns);
                n.meta.mtime_ns = time(changes.mtime).or(n.meta.mtime_ns);
                n.meta.ctime_ns = Some(now);
                self.store(&path, &n)?;
                self.tree.upsert(path, &Found::Produced(n), 0)
            }
        }
    }

    /// Applies attribute changes to a file being written (its size already set).
    fn setattr_staged(&self, s: &Staged, changes: &Changes, now: i64) {
        let mut set = lock(&s.set);
        if let Some(mode) = changes.mode {
            set.mode = mode & 0o7777;
        }
        set.owner.0 = changes.uid.unwrap_or(set.owner.0);
        set.owner.1 = changes.gid.unwrap_or(set.owner.1);
        set.atime_ns = changes.atime.map(|t| t.at(now)).or(set.atime_ns);
        set.mtime_ns = match (changes.mtime, changes.size) {
            (Some(t), _) => Some(t.at(now)),
            // A truncate is a modification: the file's own mtime again.
            (None, Some(_)) => None,
            (None, None) => set.mtime_ns,
        };
        set.ctime_ns = Some(now);
    }

    pub fn fsync(&self, fh: u64) -> Result<(), Error> {
        if let Handle::Staged { staged, .. } = &*self.tree.handles.get(fh)? {
            // Bytes that did not reach the disk: as a failed write.
            staged
                .file
                .sync_data()
                .map_err(|e| self.staging_failed(staged, e))?;
        }
        Ok(())
    }
}
