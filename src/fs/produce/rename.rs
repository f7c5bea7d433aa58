//! Removing and renaming names of the produced namespace (the rest of its changes:
//! [`super`]). The backing tree is never modified.

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Produce;
use crate::core::names::{Name, now_ns};
use crate::core::source::Source;
use crate::core::sync::lock;
use crate::fs::Error;
use crate::fs::found::Found;
use crate::fs::paths::{join, split};
use crate::fs::tree::Tree;

impl<S: Source> Produce<S> {
    /// Removes a file or (`dir`) an empty directory.
    pub fn remove(&self, parent_ino: u64, name: &OsStr, dir: bool) -> Result<(), Error> {
        let parent = self.tree.node(parent_ino)?;
        let path = join(&Tree::path_of(&parent), name);
        let (d, file) = split(&path);
        match self.settled(&path)? {
            Found::Backing(_) => return Err(Error::ReadOnly),
            Found::Staged(s) => {
                if dir {
                    return Err(Error::NotDir);
                }
                // Under the finishing lock, so its last close either saw it unlinked (and
                // publishes nothing) or has published it (then that name is removed).
                let finishing = lock(&s.finishing);
                if s.closed() {
                    drop(finishing);
                    return self.remove(parent_ino, name, dir);
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
        if let Some(old) = self.names.set(d, file, None).map_err(Error::Names)? {
            self.unname(&old, true)?;
        }
        self.tree.unmap(&path);
        self.touch_dir(&parent)
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        no_replace: bool,
    ) -> Result<(), Error> {
        let (from_dir, to_dir) = (self.tree.node(parent)?, self.tree.node(new_parent)?);
        let from = join(&Tree::path_of(&from_dir), name);
        let to = join(&Tree::path_of(&to_dir), new_name);
        let src = self.settled(&from)?;
        // POSIX: renaming a name onto itself does nothing, once the name exists.
        if from == to {
            return Ok(());
        }
        let dst = match self.tree.resolve(&to, Duration::ZERO) {
            Ok(f) => Some(f),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        if dst.is_some() && no_replace {
            return Err(Error::Exists);
        }
        let src_dir = matches!(&src, Found::Produced(n) if n.dir);
        let src_inode = match &src {
            Found::Produced(n) => n.meta.inode.clone(),
            _ => String::new(),
        };
        match &dst {
            Some(Found::Backing(_)) => return Err(Error::ReadOnly),
            Some(Found::Produced(n)) if n.dir && !src_dir => return Err(Error::IsDir),
            Some(Found::Produced(n)) if n.dir && self.dir_has_entries(&to)? => {
                return Err(Error::NotEmpty);
            }
            Some(Found::Produced(n)) if !n.dir && src_dir => return Err(Error::NotDir),
            Some(Found::Staged(_)) if src_dir => return Err(Error::NotDir),
            _ => {}
        }
        let (fd, fname) = split(&from);
        let (td, tname) = split(&to);
        let mut moved = None;
        match src {
            Found::Backing(_) => return Err(Error::ReadOnly),
            Found::Staged(s) => {
                // Under the finishing lock, so its last close publishes it at the new name.
                let finishing = lock(&s.finishing);
                if s.closed() {
                    drop(finishing);
                    return self.rename(parent, name, new_parent, new_name, no_replace);
                }
                if let Some(Found::Staged(d)) = &dst {
                    d.unlinked.store(true, Ordering::Relaxed);
                }
                self.producer.rename_staged(&from, &to);
            }
            Found::Produced(_)
                if matches!(&dst, Some(Found::Produced(d))
                    if !d.meta.inode.is_empty() && src_inode == d.meta.inode) =>
            {
                // Two names of one hard-linked file: POSIX says nothing happens.
                return Ok(());
            }
            Found::Produced(mut n) => {
                // A directory's names are keyed by its path: only an empty one can move.
                if n.dir && self.dir_has_entries(&from)? {
                    return Err(Error::CrossDevice);
                }
                if let Some(Found::Staged(d)) = &dst {
                    // The file being written there is replaced: it will never be published.
                    d.unlinked.store(true, Ordering::Relaxed);
                    self.producer.unstage(d);
                }
                n.meta.ctime_ns = Some(now_ns());
                let entry = if n.meta.inode.is_empty() {
                    n.clone()
                } else {
                    self.store(&from, &n)?;
                    Name::pointer(&n.meta.inode, self.names.me())
                };
                let old = self
                    .names
                    .set(td, tname, Some(entry))
                    .map_err(Error::Names)?;
                if let Some(old) = old.filter(|o| o.object.is_empty() || o.object != n.object) {
                    self.unname(&old, true)?;
                }
                self.names.set(fd, fname, None).map_err(Error::Names)?;
                moved = Some(n);
            }
        }
        {
            let mut inodes = self.tree.inodes.write().unwrap_or_else(|e| e.into_inner());
            inodes.by_path.remove(&to);
            if let Some(ino) = inodes.by_path.remove(&from) {
                if let Some(node) = inodes.nodes.get(&ino) {
                    node.unalias(&from, Some(&to));
                }
                inodes.by_path.insert(to.clone(), ino);
            }
        }
        if let Some(n) = moved {
            self.tree.upsert(to, &Found::Produced(n), 0)?;
        }
        self.touch_dir(&from_dir)?;
        if !Arc::ptr_eq(&from_dir, &to_dir) {
            self.touch_dir(&to_dir)?;
        }
        Ok(())
    }
}
