//! The file system's inodes: a path's node made or refreshed at a lookup, the kernel's
//! references taken and forgotten, a node's path, and the table's shedder.

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Looked, Tree};
use crate::core::sync::lock;
use crate::fs::attr::Attr;
use crate::fs::error::Error;
use crate::fs::found::Found;
use crate::fs::inodes::{InodeShedder, Node, ROOT_INO, link_id, listed_number, new_node};
use crate::fs::paths::join;

impl Tree {
    /// The shedder of this file system's inode table, for a thread of its own.
    pub fn shedder(&self) -> InodeShedder {
        InodeShedder::new(self.inodes.clone(), self.max_inodes)
    }

    pub(in crate::fs) fn node(&self, ino: u64) -> Result<Arc<Node>, Error> {
        let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
        inodes.nodes.get(&ino).cloned().ok_or(Error::NotFound)
    }

    pub(in crate::fs) fn path_of(node: &Node) -> String {
        node.path.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The inode for `path`, created on first sight; its attributes are refreshed. `refs`: the
    /// kernel references the reply gives (1 for an entry reply, 0 otherwise), counted under
    /// the same lock so a concurrent `forget` cannot drop the node in between.
    pub(in crate::fs) fn upsert(
        &self,
        path: String,
        found: &Found,
        refs: u64,
    ) -> Result<Attr, Error> {
        // The names of a hard-linked file share one inode, found by its record's id.
        let link_id = match found {
            Found::Produced(n) if !n.meta.inode.is_empty() => Some(link_id(&n.meta.inode)),
            _ => None,
        };
        // The attributes, and a new name's node, are made before the table's write lock, which
        // every lookup of a known name waits behind; the number is set under it.
        let listed = listed_number(&path);
        let read = found.read_at();
        let mut attr = found.attr(listed)?;
        let fresh = new_node(&path, attr, read, refs);
        let mut inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
        let known = |key: &String| {
            inodes
                .by_path
                .get(key)
                .filter(|ino| inodes.nodes.contains_key(ino))
                .copied()
        };
        if let Some(ino) = known(&path).or_else(|| link_id.as_ref().and_then(known)) {
            attr.ino = ino;
            let node = inodes.nodes[&ino].clone();
            for key in [Some(&path), link_id.as_ref()].into_iter().flatten() {
                if inodes.by_path.insert(key.clone(), ino) != Some(ino) {
                    lock(&node.aliases).push(key.clone());
                }
            }
            *lock(&node.attr) = (attr, read);
            inodes.referenced(&node, refs);
            return Ok(attr);
        }
        let ino = inodes.number_for(listed);
        if ino != listed {
            attr.ino = ino;
            lock(&fresh.attr).0.ino = ino;
        }
        inodes.by_path.insert(path, ino);
        if let Some(id) = link_id {
            inodes.by_path.insert(id.clone(), ino);
            lock(&fresh.aliases).push(id);
        }
        inodes.nodes.insert(ino, Arc::new(fresh));
        inodes.referenced(&inodes.nodes[&ino], 0);
        Ok(attr)
    }

    /// The kernel takes a reference to a known inode; `false` if it was forgotten.
    pub(in crate::fs) fn take_ref(&self, ino: u64) -> bool {
        // A read lock: the count is atomic, and `forget`, which drops a node at zero, takes
        // the write lock.
        let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
        inodes
            .nodes
            .get(&ino)
            .map(|n| inodes.referenced(n, 1))
            .is_some()
    }

    /// The kernel dropped `n` references to `ino`: at zero the inode is forgotten (the root
    /// never is). Its path maps to it no more; a later lookup makes a new inode.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
        let Some(node) = inodes.nodes.get(&ino) else {
            return;
        };
        let left = node.lookups.load(Ordering::Relaxed).saturating_sub(n);
        node.lookups.store(left, Ordering::Relaxed);
        if left > 0 {
            return;
        }
        let node = inodes.nodes.remove(&ino).expect("present");
        let path = Self::path_of(&node);
        for key in std::iter::once(path).chain(lock(&node.aliases).drain(..)) {
            if inodes.by_path.get(&key) == Some(&ino) {
                inodes.by_path.remove(&key);
            }
        }
    }

    /// Inodes the daemon knows (the kernel's references, plus the root).
    pub fn inode_count(&self) -> usize {
        let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
        inodes.nodes.len()
    }

    /// Forgets the inode mapping of a path that went away (its number stays valid for the
    /// kernel, which forgets it on its own).
    pub(in crate::fs) fn unmap(&self, path: &str) {
        let mut inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
        if let Some(ino) = inodes.by_path.remove(path)
            && let Some(node) = inodes.nodes.get(&ino)
        {
            node.unalias(path, None);
        }
    }

    /// A name looked up in `parent`: its node refreshed or made (`Found`), or, when nobody
    /// has published it yet and `wait` (told the path) says so, how long to wait for it (zero:
    /// the caller answers with a pending entry, `Pending`). `kernel`: the kernel asks (a scan's
    /// stats are read ahead of it), not a listing's entry.
    pub(in crate::fs) fn lookup_then_wait(
        &self,
        parent: u64,
        name: &OsStr,
        kernel: bool,
        wait: impl FnOnce(&str) -> Option<Duration>,
    ) -> Result<Looked, Error> {
        let parent = self.node(parent)?;
        let dir = Self::path_of(&parent);
        if kernel {
            self.stat_ahead.looked_up(&dir, name);
        }
        let path = join(&dir, name);
        let known = {
            let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
            inodes
                .by_path
                .get(&path)
                .and_then(|i| inodes.nodes.get(i).cloned())
        };
        // (A hard-linked file's node may be known by another of its names: then this one is
        // looked up itself.)
        if let Some(node) = known.filter(|n| Self::path_of(n) == path) {
            match self.refreshed(&node, true) {
                Err(Error::NotFound) => {}
                Err(e) => return Err(e),
                // Unless forgotten meanwhile (then it is made anew below).
                Ok(attr) if self.take_ref(attr.ino) => return Ok(Looked::Found(attr)),
                Ok(_) => {}
            }
        }
        let resolved =
            tracing::debug_span!("resolve").in_scope(|| self.resolve(&path, Duration::ZERO));
        let found = match resolved {
            Err(Error::NotFound) if !self.wait.is_zero() => match wait(&path) {
                Some(d) if d.is_zero() => return Ok(Looked::Pending(path)),
                Some(d) => self.resolve(&path, d)?,
                None => return Err(Error::NotFound),
            },
            r => r?,
        };
        self.upsert(path, &found, 1).map(Looked::Found)
    }
}
