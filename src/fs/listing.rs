//! Directory listings: the backing directory's entries and the produced names in it, snapshot
//! at `opendir` and served by offset.

use std::collections::HashSet;
use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::inodes::listed_number;
use super::{DyadFs, Error};
use crate::core::Kind;
use crate::core::source::Source;
use crate::core::sync::lock;

/// One directory entry of a listing: a name and a type, no attributes (the kernel looks up
/// the entries it needs attributes of; `find` over a million files stats none of them).
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub ino: u64,
    pub kind: Kind,
}

/// The entries of a listing from `offset` on, each with the offset of the one after it (what
/// readdir replies carry): "." and ".." (of directory `ino`; the kernel fixes ".." itself) at
/// offsets 0 and 1, then entry i of the listing at i + 2.
pub fn page<'a>(
    ino: u64,
    listing: &'a [DirEntry],
    offset: u64,
) -> impl Iterator<Item = (u64, std::borrow::Cow<'a, DirEntry>)> + 'a {
    let dots = [".", ".."].map(|name| DirEntry {
        name: name.into(),
        ino,
        kind: Kind::Dir,
    });
    let dots = dots.into_iter().map(std::borrow::Cow::Owned);
    let rest = listing.iter().map(std::borrow::Cow::Borrowed);
    dots.chain(rest)
        .enumerate()
        .skip(offset as usize)
        .map(|(i, e)| (i as u64 + 1, e))
}

impl<S: Source> DyadFs<S> {
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
                let stats = self.stats();
                stats.dirs_read_ahead.fetch_add(1, Ordering::Relaxed);
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
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, ino: u64) -> DirEntry {
        DirEntry {
            name: name.into(),
            ino,
            kind: Kind::File,
        }
    }

    #[test]
    fn offsets_resume_where_the_last_reply_stopped() {
        let listing = [entry("a", 10), entry("b", 11)];
        let all: Vec<(u64, String, u64)> = page(7, &listing, 0)
            .map(|(next, e)| (next, e.name.to_string_lossy().into_owned(), e.ino))
            .collect();
        assert_eq!(
            all,
            [
                (1, ".".into(), 7),
                (2, "..".into(), 7),
                (3, "a".into(), 10),
                (4, "b".into(), 11)
            ]
        );
        // A reply that took two entries resumes at the offset of the second one.
        let rest: Vec<u64> = page(7, &listing, 2).map(|(_, e)| e.ino).collect();
        assert_eq!(rest, [10, 11]);
        assert_eq!(page(7, &listing, 4).count(), 0);
        assert_eq!(page(7, &listing, 99).count(), 0);
    }
}
