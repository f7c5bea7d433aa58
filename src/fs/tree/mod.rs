//! The namespace tree as the kernel sees it, one component of [`DyadFs`](super::DyadFs): what a
//! path resolves to (a file being written here, the backing tree, a published name), the inode
//! table ([`nodes`]), open handles, and open directories' listings with the walks and scans
//! read ahead of them ([`dirs`]). The other components (open files, the producer side,
//! prefetching) work through it; it knows none of them.

mod dirs;
mod nodes;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::attr::Attr;
use super::dir_ahead::DirAhead;
use super::error::Error;
use super::found::Found;
use super::handles::{Handle, Handles};
use super::inodes::{Inodes, Node, ROOT_INO, new_node};
use super::listing::DirEntry;
use super::paths::split;
use super::remembered::RememberedStats;
use super::stat_ahead::StatAhead;
use super::write::{self, Producer};
use crate::backing::{BackingStat, SharedFs};
use crate::core::names::{self, Name, Namespace, links_dir};
use crate::core::sync::lock;
use crate::stats::Stats;

/// How long a produced name's attributes are trusted: another node may rename or replace it.
const PRODUCED_TTL: Duration = Duration::from_secs(1);

/// What a lookup found: a name's attributes, or a path nobody has published yet that the
/// caller answers with a pending entry (`--wait`).
pub(in crate::fs) enum Looked {
    Found(Attr),
    Pending(String),
}

pub struct Tree {
    pub(super) backing: Arc<dyn SharedFs>,
    remembered: Option<RememberedStats>,
    pub(super) names: Arc<dyn Namespace>,
    pub(super) producer: Arc<Producer>,
    pub(in crate::fs) inodes: Arc<RwLock<Inodes>>,
    /// Open files and directories (one numbering).
    pub(super) handles: Handles,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    dir_ahead: Arc<DirAhead>,
    stat_ahead: Arc<StatAhead>,
    pub(super) stats: Arc<Stats>,
    /// How long attributes and names are trusted (`FsConfig::metadata_ttl`).
    metadata_ttl: Duration,
    /// Inodes kept for the kernel before the shedder asks it to forget some.
    max_inodes: usize,
    /// How long a lookup of a name nobody has published yet may wait (`--wait`).
    pub(super) wait: Duration,
}

/// What the tree is made of besides its own tables: where names resolve, and its limits.
pub struct Parts {
    pub backing: Arc<dyn SharedFs>,
    pub names: Arc<dyn Namespace>,
    pub producer: Arc<Producer>,
    pub stats: Arc<Stats>,
}

impl Tree {
    pub fn new(parts: Parts, config: &super::config::FsConfig) -> Result<Tree, Error> {
        let Parts {
            backing,
            names,
            producer,
            stats,
        } = parts;
        let root = backing.stat("").map_err(Error::Backing)?;
        if !root.is_dir() {
            return Err(Error::NotDir);
        }
        let mut inodes = Inodes {
            next: ROOT_INO + 1,
            ..Default::default()
        };
        inodes.by_path.insert(String::new(), ROOT_INO);
        inodes.nodes.insert(
            ROOT_INO,
            Arc::new(new_node(
                "",
                Attr::from_backing(ROOT_INO, &root),
                root.read,
                1,
            )),
        );
        Ok(Tree {
            remembered: RememberedStats::new(config.metadata_ttl, config.backing_stat_cache),
            backing,
            names,
            producer,
            inodes: Arc::new(RwLock::new(inodes)),
            handles: Handles::new(),
            dirs: Mutex::new(HashMap::new()),
            dir_ahead: Arc::default(),
            stat_ahead: Arc::default(),
            stats,
            metadata_ttl: config.metadata_ttl,
            max_inodes: config.max_inodes,
            wait: config.wait,
        })
    }

    /// How long the kernel may trust a node's name and attributes.
    pub fn ttl(&self, attr: &Attr) -> Duration {
        if attr.pending {
            // Asked again every time: it is a file once its name is produced.
            Duration::ZERO
        } else if attr.produced {
            self.metadata_ttl.min(PRODUCED_TTL)
        } else {
            self.metadata_ttl
        }
    }

    /// What `path` is now: being written here, in the backing tree, or a published name
    /// (waited for up to `wait`).
    pub(in crate::fs) fn resolve(&self, path: &str, wait: Duration) -> Result<Found, Error> {
        if let Some(found) = self.resolve_here(path)? {
            return Ok(found);
        }
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        let (dir, name) = split(path);
        if !wait.is_zero() {
            self.stats.name_waits.fetch_add(1, Ordering::Relaxed);
        }
        self.found_name(path, self.names.get(dir, name, wait))
    }

    /// What `path` is on this node: being written here, or in the backing tree (`None`: it is
    /// neither, so a published name if anything).
    pub(in crate::fs) fn resolve_here(&self, path: &str) -> Result<Option<Found>, Error> {
        if let Some(s) = tracing::debug_span!("staged").in_scope(|| self.producer.staged(path)) {
            return Ok(Some(Found::Staged(s)));
        }
        match tracing::debug_span!("backing_stat").in_scope(|| self.backing_stat(path)) {
            Ok(meta) => Ok(Some(Found::Backing(meta))),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => Ok(None),
            Err(e) => Err(Error::Backing(e)),
        }
    }

    /// What the namespace said of `path` (`got`), as what it resolves to.
    pub(in crate::fs) fn found_name(
        &self,
        path: &str,
        got: std::io::Result<Option<Name>>,
    ) -> Result<Found, Error> {
        match got {
            // A hard link: the record holds what the file's names share.
            Ok(Some(n)) if n.is_pointer() => match self.record(&n.meta.inode) {
                Ok(Some(r)) => Ok(Found::Produced(r)),
                Ok(None) => Err(Error::NotFound),
                Err(e) => {
                    tracing::warn!(%path, error = %e, "link record lookup failed");
                    Err(Error::NotFound)
                }
            },
            Ok(Some(n)) => Ok(Found::Produced(n)),
            Ok(None) => Err(Error::NotFound),
            Err(e) => {
                tracing::warn!(%path, error = %e, "name lookup failed");
                Err(Error::NotFound)
            }
        }
    }

    /// The shared file system's attributes of `path`: remembered ones while their TTL lasts,
    /// else read (and remembered).
    pub(in crate::fs) fn backing_stat(&self, path: &str) -> std::io::Result<BackingStat> {
        if self.backing.surely_absent(path) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        }
        let stats = &self.stats;
        let remembered = tracing::debug_span!("remembered")
            .in_scope(|| self.remembered.as_ref().and_then(|r| r.get(path)));
        if let Some(stat) = remembered {
            stats
                .backing_stats_remembered
                .fetch_add(1, Ordering::Relaxed);
            return Ok(stat);
        }
        // Counted whatever it answers: a name's absence costs the shared FS a stat too.
        stats.backing_stats.fetch_add(1, Ordering::Relaxed);
        let stat = tracing::debug_span!("shared_stat").in_scope(|| self.backing.stat(path))?;
        if let Some(r) = &self.remembered {
            r.keep(path, &stat);
        }
        Ok(stat)
    }

    /// A node's attributes, refreshed once their TTL has passed (at once while being written).
    pub(in crate::fs) fn fresh_attr(&self, node: &Node) -> Result<Attr, Error> {
        self.refreshed(node, false)
    }

    /// As [`Self::fresh_attr`]; `exact`: through the node's own path only (a lookup of that
    /// name), never through another name of a hard-linked file.
    pub(in crate::fs) fn refreshed(&self, node: &Node, exact: bool) -> Result<Attr, Error> {
        let (attr, at) = *lock(&node.attr);
        let path = Self::path_of(node);
        match self.producer.staged(&path) {
            None if at.elapsed() < self.ttl(&attr) => return Ok(attr),
            // Closed by its writer, finished by the release on its way: attributes of the
            // file as published, not of its staging copy a moment before.
            Some(s) => {
                s.await_release(write::RELEASE_WAIT);
            }
            None => {}
        }
        let (path, found) = if exact {
            let found = self.resolve(&path, Duration::ZERO)?;
            (path, found)
        } else {
            self.resolve_node(node)?
        };
        self.upsert(path, &found, 0)
    }

    /// Another name of a hard-linked file that still resolves, which becomes the node's path.
    fn another_name(&self, node: &Node, gone: &str) -> Result<(String, Found), Error> {
        let others: Vec<String> = lock(&node.aliases)
            .iter()
            .filter(|a| !a.starts_with(names::LINKS_DIR) && *a != gone)
            .cloned()
            .collect();
        for other in others {
            if let Ok(found) = self.resolve(&other, Duration::ZERO) {
                *node.path.write().unwrap_or_else(|e| e.into_inner()) = other.clone();
                return Ok((other, found));
            }
        }
        Err(Error::NotFound)
    }

    /// What an inode's path is now (through another name of a hard-linked file whose name
    /// went away), and that path.
    pub(in crate::fs) fn resolve_node(&self, node: &Node) -> Result<(String, Found), Error> {
        let path = Self::path_of(node);
        match self.resolve(&path, Duration::ZERO) {
            Err(Error::NotFound) if !lock(&node.aliases).is_empty() => {
                self.another_name(node, &path)
            }
            r => Ok((path, r?)),
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr, Error> {
        let node = self.node(ino)?;
        // A pending name (`--wait`) is what it was until its open finds it produced (which
        // gives the node the file's attributes): the kernel asks for them before letting that
        // open through, and asking its home each time would cost a round trip per wait.
        let cached = lock(&node.attr).0;
        if cached.pending {
            return Ok(cached);
        }
        match self.fresh_attr(&node) {
            Err(Error::NotFound) => self.unlinked_attr(ino, &node),
            r => r,
        }
    }

    /// `fstat` of a file being written that was unlinked while open: it has attributes still,
    /// and no link.
    pub(in crate::fs) fn unlinked_attr(&self, ino: u64, node: &Node) -> Result<Attr, Error> {
        let path = Self::path_of(node);
        let staged = self.handles.find_map(|h| match &**h {
            Handle::Staged { staged, .. }
                if staged.unlinked.load(Ordering::Relaxed) && *lock(&staged.path) == path =>
            {
                Some(staged.clone())
            }
            _ => None,
        });
        let staged = staged.ok_or(Error::NotFound)?;
        let mut a = Attr::from_staged(ino, &staged)?;
        a.nlink = 0;
        Ok(a)
    }

    pub fn readlink(&self, ino: u64) -> Result<PathBuf, Error> {
        let path = Self::path_of(&*self.node(ino)?);
        match self.backing.read_link(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.produced_target(&path),
            r => r.map_err(Error::Backing),
        }
    }

    /// (blocks, free blocks, available blocks, files, free files, block size, name length)
    /// of the backing file system: the space the dataset lives in.
    pub fn statfs(&self) -> Result<libc::statvfs, Error> {
        self.backing.statvfs().map_err(Error::Backing)
    }

    /// A produced symlink's target.
    fn produced_target(&self, path: &str) -> Result<PathBuf, Error> {
        match self.resolve(path, Duration::ZERO)? {
            Found::Produced(n) if n.meta.special == libc::S_IFLNK => Ok(n.meta.target.into()),
            _ => Err(Error::Invalid),
        }
    }

    /// A hard-linked file's record.
    pub(in crate::fs) fn record(&self, key: &str) -> Result<Option<Name>, Error> {
        self.names
            .get(&links_dir(key), key, Duration::ZERO)
            .map_err(Error::Names)
    }
}
