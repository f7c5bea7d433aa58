//! Open directories: each `opendir` takes a listing (the backing directory's entries, then the
//! produced names, then files being written here) that readdir calls page through.

use std::collections::HashSet;
use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Tree;
use crate::core::Kind;
use crate::core::sync::lock;
use crate::fs::error::Error;
use crate::fs::inodes::listed_number;
use crate::fs::listing::DirEntry;
use crate::fs::paths::join;
use crate::fs::stat_ahead::Range;
use crate::fs::workers::spawn_worker;

impl Tree {
    /// Lists a directory once per open; readdir calls page through the listing. A listing is
    /// the backing directory's entries, then produced names, then files being written here.
    pub fn opendir(&self, ino: u64) -> Result<u64, Error> {
        let node = self.node(ino)?;
        if self.fresh_attr(&node)?.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let dir = Self::path_of(&node);
        let listed = match self.dir_ahead.take(&dir) {
            Some(ahead) => {
                self.stats.dirs_read_ahead.fetch_add(1, Ordering::Relaxed);
                Ok(ahead)
            }
            None => self.backing.list(&dir),
        };
        let mut found: Vec<(OsString, Kind)> = match listed {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(Error::Backing(e)),
        };
        // A walk's next directories are read ahead while the walker works through this one.
        self.dir_ahead.opened(&dir, &found);
        let staged = self.producer.staged_in(&dir);
        let names = self.names.list(&dir).unwrap_or_else(|e| {
            tracing::warn!(%dir, error = %e, "listing produced names failed");
            Vec::new()
        });
        // Most directories of a dataset hold no produced names: then there is nothing to merge
        // (a set of a million backing names cost `find` a second).
        if !names.is_empty() || !staged.is_empty() {
            let mut seen: HashSet<OsString> = found.iter().map(|(n, _)| n.clone()).collect();
            let staged_names: HashSet<&str> = staged.iter().map(|(n, _)| n.as_str()).collect();
            for (n, name) in names {
                if !staged_names.contains(n.as_str()) && seen.insert(n.clone().into()) {
                    let kind = Kind::of_name(&name);
                    found.push((n.into(), kind));
                }
            }
            for (n, _) in staged {
                if seen.insert(n.clone().into()) {
                    found.push((n.into(), Kind::File));
                }
            }
        }
        // Listed entries get inode numbers (known ones keep theirs, others the number a node
        // made for them would get) but no node: the kernel makes one with a lookup if it needs
        // the entry. One path buffer serves every entry.
        let mut entries = Vec::with_capacity(found.len());
        {
            let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
            let mut path = String::with_capacity(dir.len() + 64);
            for (name, kind) in found {
                path.clear();
                if !dir.is_empty() {
                    path.push_str(&dir);
                    path.push('/');
                }
                path.push_str(&name.to_string_lossy());
                let ino = match inodes.by_path.get(path.as_str()) {
                    Some(&ino) => ino,
                    None => listed_number(&path),
                };
                entries.push(DirEntry { name, ino, kind });
            }
        }
        let fh = self.handles.number();
        let entries = Arc::new(entries);
        self.stat_ahead.opened(fh, &dir, &entries);
        lock(&self.dirs).insert(fh, entries);
        Ok(fh)
    }

    pub fn listing(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>, Error> {
        let dirs = lock(&self.dirs);
        dirs.get(&fh).cloned().ok_or(Error::BadHandle(fh))
    }

    pub fn releasedir(&self, fh: u64) {
        lock(&self.dirs).remove(&fh);
        self.stat_ahead.closed(fh);
    }

    /// The kernel asks open directory `fh` (inode `ino`, `listing`) for a page with attributes
    /// from `offset`: the entries a few pages further are stat'ed ahead (see `stat_ahead`).
    pub fn listing_with_attrs(&self, ino: u64, fh: u64, listing: &Arc<Vec<DirEntry>>, offset: u64) {
        let Ok(node) = self.node(ino) else {
            return;
        };
        // Offsets 0 and 1 are "." and "..".
        let at = (offset as usize).saturating_sub(2);
        self.stat_ahead
            .asked(fh, &Self::path_of(&node), listing, at);
    }

    /// Starts the thread that reads directories ahead of a walk; it ends with the tree.
    pub fn start_dir_ahead(tree: &Arc<Tree>) -> std::io::Result<()> {
        let (queue, ahead) = (tree.dir_ahead.clone(), tree.dir_ahead.clone());
        spawn_worker(
            tree,
            "dir-ahead".into(),
            move |wait| queue.next(wait),
            move |tree, dir| match tree.backing.list(&dir) {
                Ok(listing) => ahead.store(dir, listing),
                Err(e) => tracing::debug!(%dir, error = %e, "read-ahead listing failed"),
            },
        )
    }

    /// Starts the thread that stats listed entries ahead of a scan (it ends with the tree).
    /// One thread: two or three, reading more inodes at once, measured slower (they took CPU
    /// from the scan on two cores).
    pub fn start_stat_ahead(tree: &Arc<Tree>) -> std::io::Result<()> {
        let ahead = tree.stat_ahead.clone();
        spawn_worker(
            tree,
            "stat-ahead".into(),
            move |wait| ahead.next(wait),
            |tree, r: Range| {
                for e in &r.entries[r.from..r.to] {
                    // Remembered for the scan's lookups (and warming the shared file
                    // system's own caches); a name it does not have (produced, or gone) is
                    // looked up when its page is asked for.
                    let _ = tree.backing_stat(&join(&r.dir, &e.name));
                }
            },
        )
    }
}
