//! Operations that change the produced namespace: create, write, seal and publish, mkdir,
//! remove, rename, setattr and fsync. The backing tree is never modified.

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::attr::{Attr, Kind};
use super::handles::{Handle, Opened};
use super::write::Staged;
use super::{DyadFs, Error, Found, join, split};
use crate::core::Version;
use crate::core::names::Name;
use crate::core::source::Source;
use crate::core::sync::lock;

impl<S: Source> DyadFs<S> {
    /// Copies a produced file's current bytes into a new version being written.
    pub(super) fn copy_into(&self, n: &Name, staged: &Staged) -> Result<(), Error> {
        let version = Version {
            size: n.size,
            mtime_ns: n.mtime_ns,
        };
        let entry = self.reader.cache.entry(&n.object, version)?;
        entry.pin(&self.reader.cache);
        let r = (|| {
            let mut off = 0;
            while off < n.size {
                let data = self.reader.read(&entry, off, 1 << 20)?;
                staged.file.write_all_at(&data, off).map_err(Error::Write)?;
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
        let parent = self.node(parent)?;
        if self.fresh_attr(&parent)?.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let path = join(&Self::path_of(&parent), name);
        match self.resolve(&path, Duration::ZERO) {
            Ok(_) if exclusive => return Err(Error::Exists),
            Ok(found) => {
                let attr = self.upsert(path.clone(), &found, 1)?;
                let opened = self.open(attr.ino, true, truncate)?;
                return Ok((self.getattr(attr.ino)?, opened));
            }
            Err(Error::NotFound) => {}
            Err(e) => return Err(e),
        }
        let staged = self
            .producer
            .create(&path, mode, owner)
            .map_err(Error::Write)?;
        let attr = self.upsert(path, &Found::Staged(staged.clone()), 1)?;
        Ok((attr, self.staged_handle(staged, true)))
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, Error> {
        match &*self.handle(fh)? {
            Handle::Staged {
                staged,
                writable: true,
                ..
            } => {
                staged
                    .file
                    .write_all_at(data, offset)
                    .map_err(Error::Write)?;
                self.stats()
                    .bytes_written
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                Ok(data.len() as u32)
            }
            _ => Err(Error::BadHandle(fh)),
        }
    }

    /// Makes a staged file immutable and publishes it (unless it was unlinked meanwhile). It
    /// stays staged (visible here) until its name is published, so no reader on this node
    /// falls between the two and finds the previous version.
    pub(super) fn seal(&self, staged: &Arc<Staged>) -> Result<(), Error> {
        let r = self.publish(staged);
        self.producer.unstage(staged);
        r
    }

    pub(super) fn publish(&self, staged: &Arc<Staged>) -> Result<(), Error> {
        if staged.unlinked.load(Ordering::Relaxed) {
            return Ok(());
        }
        let path = lock(&staged.path).clone();
        let object = self.producer.new_object();
        let version = self.producer.seal(staged, &object).map_err(Error::Write)?;
        let name = Name {
            dir: false,
            object,
            size: version.size,
            mtime_ns: version.mtime_ns,
            mode: staged.mode.load(Ordering::Relaxed) as u32,
            holder: self.names.me(),
            uid: staged.owner.0,
            gid: staged.owner.1,
        };
        let (dir, file) = split(&path);
        let old = self
            .names
            .set(dir, file, Some(name.clone()))
            .map_err(Error::Names)?;
        if let Some(old) = old.filter(|o| !o.dir) {
            // The old version stays readable by whoever has it open, then may be evicted.
            self.release_object(&old, false);
        }
        self.stats().files_produced.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%path, object = %name.object, size = version.size, "published");
        self.upsert(path, &Found::Produced(name), 0)?;
        Ok(())
    }

    /// Tells an object's holder that no name points at it any more.
    pub(super) fn release_object(&self, n: &Name, drop: bool) {
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
        let parent = self.node(parent)?;
        if self.fresh_attr(&parent)?.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let path = join(&Self::path_of(&parent), name);
        match self.resolve(&path, Duration::ZERO) {
            Ok(_) => return Err(Error::Exists),
            Err(Error::NotFound) => {}
            Err(e) => return Err(e),
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as i64;
        let n = Name {
            dir: true,
            object: String::new(),
            size: 0,
            mtime_ns: now,
            mode: mode & 0o7777,
            holder: self.names.me(),
            uid: owner.0,
            gid: owner.1,
        };
        let (dir, file) = split(&path);
        self.names
            .set(dir, file, Some(n.clone()))
            .map_err(Error::Names)?;
        self.upsert(path, &Found::Produced(n), 1)
    }

    /// Whether a produced directory has entries (published or being written here).
    pub(super) fn dir_has_entries(&self, path: &str) -> Result<bool, Error> {
        Ok(self.producer.has_staged_under(path)
            || !self.names.list(path).map_err(Error::Names)?.is_empty())
    }

    /// Removes a file or (`dir`) an empty directory.
    pub fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Error> {
        let parent = self.node(parent)?;
        let path = join(&Self::path_of(&parent), name);
        let (d, file) = split(&path);
        match self.resolve(&path, Duration::ZERO)? {
            Found::Backing(_) => return Err(Error::ReadOnly),
            Found::Staged(s) => {
                if dir {
                    return Err(Error::NotDir);
                }
                s.unlinked.store(true, Ordering::Relaxed);
                self.producer.unstage(&s);
            }
            Found::Produced(n) => {
                if n.dir != dir {
                    return Err(if dir { Error::NotDir } else { Error::IsDir });
                }
                if dir && self.dir_has_entries(&path)? {
                    return Err(Error::NotEmpty);
                }
            }
        }
        // Also the published version of a file that was being rewritten.
        if let Some(old) = self.names.set(d, file, None).map_err(Error::Names)?
            && !old.dir
        {
            self.release_object(&old, true);
        }
        self.unmap(&path);
        Ok(())
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        no_replace: bool,
    ) -> Result<(), Error> {
        let from = join(&Self::path_of(&*self.node(parent)?), name);
        let to = join(&Self::path_of(&*self.node(new_parent)?), new_name);
        let src = self.resolve(&from, Duration::ZERO)?;
        // POSIX: renaming a name onto itself does nothing, once the name exists.
        if from == to {
            return Ok(());
        }
        let dst = match self.resolve(&to, Duration::ZERO) {
            Ok(f) => Some(f),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        if dst.is_some() && no_replace {
            return Err(Error::Exists);
        }
        match &dst {
            Some(Found::Backing(_)) => return Err(Error::ReadOnly),
            Some(Found::Produced(n)) if n.dir && self.dir_has_entries(&to)? => {
                return Err(Error::NotEmpty);
            }
            _ => {}
        }
        let (fd, fname) = split(&from);
        let (td, tname) = split(&to);
        match src {
            Found::Backing(_) => return Err(Error::ReadOnly),
            Found::Staged(_) => {
                if let Some(Found::Staged(d)) = &dst {
                    d.unlinked.store(true, Ordering::Relaxed);
                }
                self.producer.rename_staged(&from, &to);
            }
            Found::Produced(n) => {
                // A directory's names are keyed by its path: only an empty one can move.
                if n.dir && self.dir_has_entries(&from)? {
                    return Err(Error::CrossDevice);
                }
                let old = self
                    .names
                    .set(td, tname, Some(n.clone()))
                    .map_err(Error::Names)?;
                if let Some(old) = old.filter(|o| !o.dir && o.object != n.object) {
                    self.release_object(&old, true);
                }
                self.names.set(fd, fname, None).map_err(Error::Names)?;
            }
        }
        let mut inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
        inodes.by_path.remove(&to);
        if let Some(ino) = inodes.by_path.remove(&from) {
            if let Some(node) = inodes.nodes.get(&ino) {
                *node.path.write().unwrap_or_else(|e| e.into_inner()) = to.clone();
            }
            inodes.by_path.insert(to, ino);
        }
        Ok(())
    }

    /// chmod/truncate/utimes. Only files being written change (mode, size); on anything else
    /// the call succeeds without effect unless it would change a size.
    pub fn setattr(&self, ino: u64, mode: Option<u32>, size: Option<u64>) -> Result<Attr, Error> {
        let node = self.node(ino)?;
        let path = Self::path_of(&node);
        match self.resolve(&path, Duration::ZERO)? {
            Found::Staged(s) => {
                if let Some(size) = size {
                    s.file.set_len(size).map_err(Error::Write)?;
                }
                if let Some(mode) = mode {
                    s.mode.store((mode & 0o7777) as usize, Ordering::Relaxed);
                }
                self.upsert(path, &Found::Staged(s), 0)
            }
            found => {
                let attr = self.upsert(path, &found, 0)?;
                match size {
                    Some(s) if s != attr.size => Err(Error::ReadOnly),
                    _ => Ok(attr),
                }
            }
        }
    }

    pub fn fsync(&self, fh: u64) -> Result<(), Error> {
        if let Handle::Staged { staged, .. } = &*self.handle(fh)? {
            staged.file.sync_data().map_err(Error::Write)?;
        }
        Ok(())
    }
}
