//! The inode table: which path an inode number names, the references the kernel holds (FUSE
//! `forget` drops a node at zero), and the shedder that keeps the table bounded.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use super::attr::Attr;
use super::paths::split;
use crate::core::Version;
use crate::core::names::LINKS_DIR;
use crate::core::sync::lock;

/// The mount's root directory.
pub const ROOT_INO: u64 = 1;

pub(super) struct Node {
    /// Its path under the mount (a rename moves it).
    pub(super) path: RwLock<String>,
    /// References the kernel holds (entries replied to lookups, creates and mkdirs); the
    /// node is dropped when `forget` brings them to zero, so the table follows the kernel's
    /// inode cache instead of every path ever seen.
    pub(super) lookups: AtomicU64,
    pub(super) attr: Mutex<(Attr, Instant)>,
    /// When the kernel last looked it up (a tick of [`Inodes::tick`]): the shedder's order.
    pub(super) last_use: AtomicU64,
    /// The version whose pages the kernel may hold for this inode, and whether its opens are
    /// served by the daemon with those pages kept (decided at its first open, see `open`).
    pub(super) kernel_version: Mutex<Option<(Version, bool)>>,
    /// A hard-linked file's other keys in `by_path` (its other names, and its record's id),
    /// dropped with it; empty for all other files.
    pub(super) aliases: Mutex<Vec<String>>,
}

#[derive(Default)]
pub(super) struct Inodes {
    pub(super) by_path: HashMap<String, u64>,
    pub(super) nodes: HashMap<u64, Arc<Node>>,
    pub(super) next: u64,
    pub(super) tick: AtomicU64,
}

impl Inodes {
    /// The number for a new node of a path whose [`listed_number`] is `listed`: that one (so a
    /// `d_ino` read before the lookup equals the `st_ino` after it), unless a live node holds
    /// it (a node renamed away from the path, or two paths of one hash): then the next of a
    /// counter, which stays far below the listed numbers.
    pub(super) fn number_for(&mut self, listed: u64) -> u64 {
        if !self.nodes.contains_key(&listed) {
            return listed;
        }
        self.next += 1;
        self.next - 1
    }

    /// The kernel took `refs` more references to `node` (0: it was only looked at): counted,
    /// and the node becomes the most recently used.
    pub(super) fn referenced(&self, node: &Node, refs: u64) {
        node.lookups.fetch_add(refs, Ordering::Relaxed);
        node.last_use
            .store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// The inode number a listing shows for `path` while no node has it: a hash of the path with
/// bit 62 set (counter numbers never get there), the same every time within this daemon.
pub(super) fn listed_number(path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    // DefaultHasher::new() has fixed keys (a map's RandomState does not).
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    (h.finish() >> 2) | (1 << 62)
}

/// Keeps the inode table near `max` entries however many files the kernel has looked up: the
/// kernel keeps an inode per file it ever saw while memory allows (a million files' worth on a
/// training node), so past `max` the least recently used entries are invalidated (the kernel
/// then drops them and sends `forget`, unless a file is open). Runs on its own thread: the
/// kernel must not be notified from inside a request.
pub struct InodeShedder {
    inodes: Arc<RwLock<Inodes>>,
    max: usize,
}

impl InodeShedder {
    /// A shedder of `inodes`, keeping at most `max` (at least 1).
    pub(super) fn new(inodes: Arc<RwLock<Inodes>>, max: usize) -> InodeShedder {
        InodeShedder {
            inodes,
            max: max.max(1),
        }
    }

    /// (parent inode, name) of the least recently used entries beyond 90% of `max`, if the
    /// table holds more than `max`.
    pub fn candidates(&self) -> Vec<(u64, OsString)> {
        let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
        if inodes.nodes.len() <= self.max {
            return Vec::new();
        }
        let excess = inodes.nodes.len() - self.max * 9 / 10;
        let mut by_age: Vec<(u64, u64)> = inodes
            .nodes
            .iter()
            .filter(|(ino, _)| **ino != ROOT_INO)
            .map(|(ino, n)| (n.last_use.load(Ordering::Relaxed), *ino))
            .collect();
        let excess = excess.min(by_age.len());
        if excess == 0 {
            return Vec::new();
        }
        by_age.select_nth_unstable(excess - 1);
        by_age[..excess]
            .iter()
            .filter_map(|(_, ino)| {
                let node = &inodes.nodes[ino];
                let path = node.path.read().unwrap_or_else(|e| e.into_inner());
                let (dir, name) = split(&path);
                let parent = *inodes.by_path.get(dir)?;
                Some((parent, OsString::from(name)))
            })
            .collect()
    }
}

impl Node {
    /// `path` no longer names this node: it is moved to `to`, or (`None`) gone. A hard-linked
    /// file's node keeps resolving through another of its names.
    pub(super) fn unalias(&self, path: &str, to: Option<&str>) {
        let mut aliases = lock(&self.aliases);
        aliases.retain(|a| a != path);
        let mut primary = self.path.write().unwrap_or_else(|e| e.into_inner());
        if let Some(to) = to {
            if *primary != path {
                aliases.push(to.to_string());
            } else {
                *primary = to.to_string();
            }
        } else if *primary == path {
            match aliases.iter().find(|a| !a.starts_with(LINKS_DIR)) {
                Some(other) => *primary = other.clone(),
                // Its last name: what is still open of it has no link.
                None => lock(&self.attr).0.nlink = 0,
            }
        }
    }
}

/// The key in `by_path` under which the names of the hard-linked file with record `inode`
/// find their one inode.
pub(super) fn link_id(inode: &str) -> String {
    format!("{LINKS_DIR}/{inode}")
}

/// A node of `path` with attributes read at `read`.
pub(super) fn new_node(path: &str, attr: Attr, read: Instant, lookups: u64) -> Node {
    Node {
        path: RwLock::new(path.to_string()),
        lookups: AtomicU64::new(lookups),
        last_use: AtomicU64::new(0),
        attr: Mutex::new((attr, read)),
        kernel_version: Mutex::new(None),
        aliases: Mutex::new(Vec::new()),
    }
}
