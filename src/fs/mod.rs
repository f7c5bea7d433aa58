//! The filesystem core: inodes, attributes, directory listings, open handles, reads and
//! writes, as plain Rust calls returning plain structs. [`fuse`] is the one file that speaks
//! fuser and adapts these calls to the kernel protocol.
//!
//! A path resolves, in order, to a file being written on this node ([`write`]), an entry of the
//! backing tree (read-only: dyadfs never modifies it), or a produced name published by any node
//! (`locator::names`). New files and directories may be created anywhere a name is free.

mod backing;
mod caller;
mod error;
pub mod fuse;
pub mod read;
pub mod write;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::Metadata;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::core::source::Source;
pub use backing::BackingStore;
pub use error::Error;
use read::{MAX_READAHEAD_CHUNKS, Reader, WHOLE_FILE_MAX};

use crate::cache::{Cache, Entry, ReadBytes};
use crate::core::Version;
use crate::core::names::{self, Name, Namespace};
use crate::core::sync::lock;
use crate::stats::{STATS_XATTR, Stats};
use write::{Producer, Staged};

pub const ROOT_INO: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    fn of(ft: std::fs::FileType) -> Kind {
        if ft.is_file() {
            Kind::File
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_symlink() {
            Kind::Symlink
        } else {
            Kind::Other
        }
    }
}

/// Attributes of a node, as the kernel will see them.
#[derive(Debug, Clone, Copy)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub version: Version,
    /// Written under the mount (not in the backing tree): other nodes may change it.
    pub produced: bool,
}

impl Attr {
    fn from_meta(ino: u64, meta: &Metadata) -> Attr {
        let kind = Kind::of(meta.file_type());
        let time = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
        Attr {
            ino,
            kind,
            size: meta.len(),
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            // Backing files are read-only: drop their write bits so tools do not try and fail.
            // Directories take new (produced) files.
            perm: if kind == Kind::Dir {
                (meta.mode() & 0o7777) as u16
            } else {
                (meta.mode() & 0o7555) as u16
            },
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            version: crate::core::version_of(meta),
            produced: false,
        }
    }

    fn from_staged(ino: u64, s: &Staged) -> Result<Attr, Error> {
        let meta = s.file.metadata().map_err(Error::Write)?;
        let mut a = Attr::from_meta(ino, &meta);
        a.perm = s.mode.load(Ordering::Relaxed) as u16;
        (a.uid, a.gid) = s.owner;
        a.produced = true;
        Ok(a)
    }

    fn from_name(ino: u64, n: &Name) -> Attr {
        let t = UNIX_EPOCH + Duration::from_nanos(n.mtime_ns.max(0) as u64);
        Attr {
            ino,
            kind: if n.dir { Kind::Dir } else { Kind::File },
            size: n.size,
            blocks: n.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            perm: (n.mode & 0o7777) as u16,
            nlink: if n.dir { 2 } else { 1 },
            uid: n.uid,
            gid: n.gid,
            version: Version {
                size: n.size,
                mtime_ns: n.mtime_ns,
            },
            produced: true,
        }
    }
}

/// What a path resolves to.
enum Found {
    Staged(Arc<Staged>),
    Backing(Metadata),
    Produced(Name),
}

/// How long a produced name's attributes are trusted: another node may rename or replace it.
const PRODUCED_TTL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct FsConfig {
    /// How long attributes and names are trusted, by the kernel and by the daemon.
    pub metadata_ttl: Duration,
    /// Reply to opens of complete cached files with kernel passthrough when possible.
    pub passthrough: bool,
    /// Threads filling readahead chunks in the background.
    pub readahead_threads: usize,
    /// How long a lookup of a name nobody has published yet waits for a producer.
    pub wait: Duration,
    /// Inodes the daemon keeps for the kernel before asking it to forget the least recently
    /// used (see [`InodeShedder`]).
    pub max_inodes: usize,
}

struct Node {
    /// Its path under the mount (a rename moves it).
    path: RwLock<String>,
    /// References the kernel holds (entries replied to lookups, creates and mkdirs); the
    /// node is dropped when `forget` brings them to zero, so the table follows the kernel's
    /// inode cache instead of every path ever seen.
    lookups: AtomicU64,
    attr: Mutex<(Attr, Instant)>,
    /// When the kernel last looked it up (a tick of [`Inodes::tick`]): the shedder's order.
    last_use: AtomicU64,
    /// The version whose pages the kernel may hold for this inode (see `open`).
    kernel_version: Mutex<Option<Version>>,
}

#[derive(Default)]
struct Inodes {
    by_path: HashMap<String, u64>,
    nodes: HashMap<u64, Arc<Node>>,
    next: u64,
    tick: AtomicU64,
}

impl Inodes {
    /// The kernel took `refs` more references to `node` (0: it was only looked at): counted,
    /// and the node becomes the most recently used.
    fn referenced(&self, node: &Node, refs: u64) {
        node.lookups.fetch_add(refs, Ordering::Relaxed);
        node.last_use
            .store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }
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

struct CachedHandle {
    entry: Arc<Entry>,
    /// Where the next sequential read would start, and the current readahead window.
    next_offset: AtomicU64,
    window: AtomicU64,
    /// The entry's data file mapped for this handle's reads (large files read through the
    /// daemon): made on the first read, unmapped on release, so mappings never outnumber open
    /// handles.
    map: std::sync::OnceLock<Option<Arc<crate::cache::Mapping>>>,
}

enum Handle {
    /// A backing file or a sealed produced file: read through the cache.
    Cached(CachedHandle),
    /// A file being written on this node. A writable handle seals it on its last close.
    Staged { staged: Arc<Staged>, writable: bool },
}

/// What an open returns to the adapter.
pub struct Opened {
    pub fh: u64,
    /// The complete cached copy the kernel may read directly (passthrough), if allowed.
    pub passthrough: Option<Arc<Entry>>,
    /// Whether the kernel may keep the pages it already holds for this inode.
    pub keep_cache: bool,
}

/// One directory entry of a listing: a name and a type, no attributes (the kernel looks up
/// the entries it needs attributes of; `find` over a million files stats none of them).
pub struct DirEntry {
    pub name: OsString,
    pub ino: u64,
    pub kind: Kind,
}

type Job = Box<dyn FnOnce() + Send>;

pub struct DyadFs<S: Source> {
    backing: BackingStore,
    names: Arc<dyn Namespace>,
    producer: Arc<Producer>,
    reader: Reader<S>,
    config: FsConfig,
    inodes: Arc<RwLock<Inodes>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_fh: AtomicU64,
    readahead: crossbeam_channel::Sender<Job>,
}

/// (directory, name) of a path; the root's entries are in directory "".
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn join(parent: &str, name: &OsStr) -> String {
    let name = name.to_string_lossy();
    if parent.is_empty() {
        name.into_owned()
    } else {
        format!("{parent}/{name}")
    }
}

impl<S: Source> DyadFs<S> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backing: BackingStore,
        names: Arc<dyn Namespace>,
        producer: Arc<Producer>,
        source: Arc<S>,
        cache: Arc<Cache>,
        stats: Arc<Stats>,
        config: FsConfig,
    ) -> Result<Self, Error> {
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
            Arc::new(new_node("", Attr::from_meta(ROOT_INO, &root), 1)),
        );
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..config.readahead_threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("readahead-{i}"))
                .spawn(move || rx.iter().for_each(|job| job()))
                .map_err(|e| Error::Cache(e.into()))?;
        }
        Ok(DyadFs {
            backing,
            names,
            producer,
            reader: Reader {
                cache,
                stats,
                source,
            },
            config,
            inodes: Arc::new(RwLock::new(inodes)),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            readahead: tx,
        })
    }

    /// How long the kernel may trust a node's name and attributes.
    pub fn ttl(&self, attr: &Attr) -> Duration {
        if attr.produced {
            self.config.metadata_ttl.min(PRODUCED_TTL)
        } else {
            self.config.metadata_ttl
        }
    }

    /// The shedder of this file system's inode table, for a thread of its own.
    pub fn shedder(&self) -> InodeShedder {
        InodeShedder {
            inodes: self.inodes.clone(),
            max: self.config.max_inodes.max(1),
        }
    }

    pub fn passthrough_enabled(&self) -> bool {
        self.config.passthrough
    }

    pub fn stats(&self) -> &Stats {
        &self.reader.stats
    }

    fn node(&self, ino: u64) -> Result<Arc<Node>, Error> {
        let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
        inodes.nodes.get(&ino).cloned().ok_or(Error::NotFound)
    }

    fn path_of(node: &Node) -> String {
        node.path.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What `path` is now: being written here, in the backing tree, or a published name
    /// (waited for up to `wait`).
    fn resolve(&self, path: &str, wait: Duration) -> Result<Found, Error> {
        if let Some(s) = self.producer.staged(path) {
            return Ok(Found::Staged(s));
        }
        match self.backing.stat(path) {
            Ok(meta) => return Ok(Found::Backing(meta)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {}
            Err(e) => return Err(Error::Backing(e)),
        }
        if path.is_empty() {
            return Err(Error::NotFound);
        }
        let (dir, name) = split(path);
        if !wait.is_zero() {
            self.stats().name_waits.fetch_add(1, Ordering::Relaxed);
        }
        match self.names.get(dir, name, wait) {
            Ok(Some(n)) => Ok(Found::Produced(n)),
            Ok(None) => Err(Error::NotFound),
            Err(e) => {
                tracing::warn!(%path, error = %e, "name lookup failed");
                Err(Error::NotFound)
            }
        }
    }

    /// The inode for `path`, created on first sight; its attributes are refreshed. `refs`: the
    /// kernel references the reply gives (1 for an entry reply, 0 otherwise), counted under
    /// the same lock so a concurrent `forget` cannot drop the node in between.
    fn upsert(&self, path: String, found: &Found, refs: u64) -> Result<Attr, Error> {
        let attr_of = |ino| match found {
            Found::Staged(s) => Attr::from_staged(ino, s),
            Found::Backing(meta) => Ok(Attr::from_meta(ino, meta)),
            Found::Produced(n) => Ok(Attr::from_name(ino, n)),
        };
        let mut inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&ino) = inodes.by_path.get(&path) {
            let attr = attr_of(ino)?;
            let node = &inodes.nodes[&ino];
            *lock(&node.attr) = (attr, Instant::now());
            inodes.referenced(node, refs);
            return Ok(attr);
        }
        let ino = inodes.next;
        inodes.next += 1;
        let attr = attr_of(ino)?;
        inodes.by_path.insert(path.clone(), ino);
        inodes
            .nodes
            .insert(ino, Arc::new(new_node(&path, attr, refs)));
        inodes.referenced(&inodes.nodes[&ino], 0);
        Ok(attr)
    }

    /// The kernel takes a reference to a known inode; `false` if it was forgotten.
    fn take_ref(&self, ino: u64) -> bool {
        let inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
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
        if inodes.by_path.get(&path) == Some(&ino) {
            inodes.by_path.remove(&path);
        }
    }

    /// Inodes the daemon knows (the kernel's references, plus the root).
    pub fn inode_count(&self) -> usize {
        let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
        inodes.nodes.len()
    }

    /// Forgets the inode mapping of a path that went away (its number stays valid for the
    /// kernel, which forgets it on its own).
    fn unmap(&self, path: &str) {
        let mut inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
        inodes.by_path.remove(path);
    }

    /// A node's attributes, refreshed once their TTL has passed (at once while being written).
    fn fresh_attr(&self, node: &Node) -> Result<Attr, Error> {
        let (attr, at) = *lock(&node.attr);
        let path = Self::path_of(node);
        if at.elapsed() < self.ttl(&attr) && self.producer.staged(&path).is_none() {
            return Ok(attr);
        }
        let found = self.resolve(&path, Duration::ZERO)?;
        self.upsert(path, &found, 0)
    }

    /// Looks a name up for thread `caller`; a name not published yet is waited for (`--wait`)
    /// unless the caller is creating it.
    pub fn lookup(&self, parent: u64, name: &OsStr, caller: u32) -> Result<Attr, Error> {
        let parent = self.node(parent)?;
        let path = join(&Self::path_of(&parent), name);
        let known = {
            let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
            inodes
                .by_path
                .get(&path)
                .and_then(|i| inodes.nodes.get(i).cloned())
        };
        if let Some(node) = known {
            match self.fresh_attr(&node) {
                Err(Error::NotFound) => {}
                Err(e) => return Err(e),
                // Unless forgotten meanwhile (then it is made anew below).
                Ok(attr) if self.take_ref(attr.ino) => return Ok(attr),
                Ok(_) => {}
            }
        }
        let found = match self.resolve(&path, Duration::ZERO) {
            Err(Error::NotFound) if !self.config.wait.is_zero() && !caller::is_creating(caller) => {
                self.resolve(&path, self.config.wait)?
            }
            r => r?,
        };
        self.upsert(path, &found, 1)
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr, Error> {
        let node = self.node(ino)?;
        self.fresh_attr(&node)
    }

    pub fn readlink(&self, ino: u64) -> Result<PathBuf, Error> {
        let node = self.node(ino)?;
        self.backing
            .read_link(&Self::path_of(&node))
            .map_err(Error::Backing)
    }

    /// Lists a directory once per open; readdir calls page through the listing. A listing is
    /// the backing directory's entries, then produced names, then files being written here.
    pub fn opendir(&self, ino: u64) -> Result<u64, Error> {
        let node = self.node(ino)?;
        if self.fresh_attr(&node)?.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let dir = Self::path_of(&node);
        let mut found: Vec<(OsString, Kind)> = Vec::new();
        match self.backing.list(&dir) {
            Ok(listing) => found.extend(listing),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Backing(e)),
        }
        let mut seen: std::collections::HashSet<OsString> =
            found.iter().map(|(n, _)| n.clone()).collect();
        let staged = self.producer.staged_in(&dir);
        let staged_names: std::collections::HashSet<&str> =
            staged.iter().map(|(n, _)| n.as_str()).collect();
        match self.names.list(&dir) {
            Ok(names) => {
                for (n, name) in names {
                    if !staged_names.contains(n.as_str()) && seen.insert(n.clone().into()) {
                        let kind = if name.dir { Kind::Dir } else { Kind::File };
                        found.push((n.into(), kind));
                    }
                }
            }
            Err(e) => tracing::warn!(%dir, error = %e, "listing produced names failed"),
        }
        for (n, _) in staged {
            if seen.insert(n.clone().into()) {
                found.push((n.into(), Kind::File));
            }
        }
        // Listed entries get inode numbers (known ones keep theirs) but no node: the kernel
        // makes one with a lookup if it needs the entry.
        let mut entries = Vec::with_capacity(found.len());
        {
            let mut inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
            for (name, kind) in found {
                let ino = match inodes.by_path.get(&join(&dir, &name)) {
                    Some(&ino) => ino,
                    None => {
                        inodes.next += 1;
                        inodes.next - 1
                    }
                };
                entries.push(DirEntry { name, ino, kind });
            }
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.dirs).insert(fh, Arc::new(entries));
        Ok(fh)
    }

    pub fn listing(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>, Error> {
        let dirs = lock(&self.dirs);
        dirs.get(&fh).cloned().ok_or(Error::BadHandle(fh))
    }

    pub fn releasedir(&self, fh: u64) {
        lock(&self.dirs).remove(&fh);
    }

    fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, Arc::new(h));
        fh
    }

    fn staged_handle(&self, staged: Arc<Staged>, writable: bool) -> Opened {
        if writable {
            staged.writers.fetch_add(1, Ordering::Relaxed);
        }
        let fh = self.add_handle(Handle::Staged { staged, writable });
        Opened {
            fh,
            passthrough: None,
            keep_cache: false,
        }
    }

    /// Opens a file. `write`: open for writing (a produced file gets a new version, started
    /// from the current bytes unless `truncate`); backing files are read-only.
    pub fn open(&self, ino: u64, write: bool, truncate: bool) -> Result<Opened, Error> {
        let node = self.node(ino)?;
        let path = Self::path_of(&node);
        let found = self.resolve(&path, Duration::ZERO)?;
        let (key, attr) = match found {
            Found::Staged(s) => {
                if truncate {
                    s.file.set_len(0).map_err(Error::Write)?;
                }
                return Ok(self.staged_handle(s, write));
            }
            Found::Backing(meta) => {
                if write {
                    return Err(Error::ReadOnly);
                }
                let attr = self.upsert(path.clone(), &Found::Backing(meta), 0)?;
                (path, attr)
            }
            Found::Produced(n) => {
                if n.dir {
                    return Err(Error::IsDir);
                }
                if write {
                    // A new version keeps the file's owner.
                    let staged = self
                        .producer
                        .create(&path, n.mode, (n.uid, n.gid))
                        .map_err(Error::Write)?;
                    if !truncate {
                        self.copy_into(&n, &staged)?;
                    }
                    self.upsert(path, &Found::Staged(staged.clone()), 0)?;
                    return Ok(self.staged_handle(staged, true));
                }
                let attr = self.upsert(path, &Found::Produced(n.clone()), 0)?;
                (n.object, attr)
            }
        };
        match attr.kind {
            Kind::Dir => return Err(Error::IsDir),
            Kind::File => {}
            _ => {
                return Err(Error::Backing(std::io::Error::from_raw_os_error(
                    libc::EINVAL,
                )));
            }
        }
        let cache = &self.reader.cache;
        let entry = cache.entry(&key, attr.version)?;
        entry.pin(cache);
        let keep_cache = {
            let mut kv = lock(&node.kernel_version);
            let same = *kv == Some(attr.version);
            *kv = Some(attr.version);
            same
        };
        let mut complete = entry.is_complete();
        if complete {
            self.stats().local_hits.fetch_add(1, Ordering::Relaxed);
        } else if entry.version.size <= WHOLE_FILE_MAX
            && self.stats().passthrough.load(Ordering::Relaxed)
            && !names::is_object(&key)
        {
            // The first read fetches a small file whole anyway. Fetching it now lets this very
            // open be a passthrough open, so the reader's many small reads (np.load parses a
            // zip directory, then headers) never come to the daemon. A failed fetch is left to
            // the first read, which retries it and reports the error. Not for produced files:
            // the kernel binds one passthrough file per inode, so a reader holding one version
            // open in passthrough would keep the next version from being opened (EBUSY).
            if let Err(e) = self.reader.fill(&entry, 0..entry.chunk_count()) {
                tracing::debug!(path = %entry.path, error = %e, "fetch at open failed");
            }
            complete = entry.is_complete();
        }
        // The kernel reads a passthrough file without us, so it must be verified first. A
        // small file is verified now; a large one (after a restart) is served by the daemon,
        // which verifies each chunk it serves, while the rest is verified in the background
        // for later opens.
        let verified = complete
            && (entry.is_verified()
                || if entry.version.size <= WHOLE_FILE_MAX {
                    entry.verify(cache, 0..entry.chunk_count())?
                } else {
                    self.verify_in_background(entry.clone());
                    false
                });
        let fh = self.add_handle(Handle::Cached(CachedHandle {
            entry: entry.clone(),
            next_offset: AtomicU64::new(0),
            window: AtomicU64::new(0),
            map: Default::default(),
        }));
        Ok(Opened {
            fh,
            passthrough: (verified && self.config.passthrough).then_some(entry),
            keep_cache,
        })
    }

    /// Copies a produced file's current bytes into a new version being written.
    fn copy_into(&self, n: &Name, staged: &Staged) -> Result<(), Error> {
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
    fn seal(&self, staged: &Arc<Staged>) -> Result<(), Error> {
        let r = self.publish(staged);
        self.producer.unstage(staged);
        r
    }

    fn publish(&self, staged: &Arc<Staged>) -> Result<(), Error> {
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
    fn release_object(&self, n: &Name, drop: bool) {
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
    fn dir_has_entries(&self, path: &str) -> Result<bool, Error> {
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
        if from == to {
            return Ok(());
        }
        let src = self.resolve(&from, Duration::ZERO)?;
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

    fn handle(&self, fh: u64) -> Result<Arc<Handle>, Error> {
        let handles = lock(&self.handles);
        handles.get(&fh).cloned().ok_or(Error::BadHandle(fh))
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<ReadBytes, Error> {
        let handle = self.handle(fh)?;
        let handle = match &*handle {
            Handle::Cached(h) => h,
            Handle::Staged { staged, .. } => {
                let len = staged.file.metadata().map_err(Error::Write)?.len();
                let n = (u64::from(size)).min(len.saturating_sub(offset)) as usize;
                let mut buf = vec![0; n];
                staged
                    .file
                    .read_exact_at(&mut buf, offset)
                    .map_err(Error::Write)?;
                return Ok(ReadBytes::Owned(buf));
            }
        };
        let entry = &handle.entry;
        let large = entry.version.size > WHOLE_FILE_MAX;
        let map = large
            .then(|| handle.map.get_or_init(|| entry.map()).as_ref())
            .flatten();
        let data = self.reader.read_mapped(entry, offset, size, map)?;
        if large {
            self.read_ahead(handle, offset, data.len() as u64);
        }
        Ok(data)
    }

    /// On sequential reads of a large file, fills the next chunks in the background with a
    /// window that doubles per sequential read; a seek resets it.
    fn read_ahead(&self, handle: &CachedHandle, offset: u64, len: u64) {
        let sequential = handle.next_offset.swap(offset + len, Ordering::Relaxed) == offset;
        let window = if sequential {
            (handle.window.load(Ordering::Relaxed) * 2).clamp(1, MAX_READAHEAD_CHUNKS)
        } else {
            0
        };
        handle.window.store(window, Ordering::Relaxed);
        let entry = handle.entry.clone();
        let start = entry.chunks_for(offset, len.max(1)).end;
        let end = (start + window).min(entry.chunk_count());
        if start >= end || entry.all_present(start..end) {
            return;
        }
        // One job per chunk: the readahead threads pull the window in parallel, so one
        // chunk's transfer overlaps another's disk write.
        for idx in start..end {
            let (reader, entry) = (self.reader.clone(), entry.clone());
            let _ = self.readahead.send(Box::new(move || {
                if let Err(e) = reader.fill_ahead(&entry, idx..idx + 1) {
                    tracing::debug!(path = %entry.path, error = %e, "readahead failed");
                }
            }));
        }
    }

    fn verify_in_background(&self, entry: Arc<Entry>) {
        let cache = self.reader.cache.clone();
        let _ = self.readahead.send(Box::new(move || {
            // A failed chunk is dropped by verify and refetched on its next read.
            if let Err(e) = entry.verify(&cache, 0..entry.chunk_count()) {
                tracing::warn!(path = %entry.path, error = %e, "background verification failed");
            }
        }));
    }

    /// The last close of an open file (the kernel sends it once every descriptor of the open
    /// is closed, including dups and forked copies, shortly after the last close returns). The
    /// last writable handle of a file seals and publishes it. Sealing on a close (flush)
    /// instead would publish too early: `cmd > f` closes a dup before `cmd` writes.
    pub fn release(&self, fh: u64) -> Result<(), Error> {
        let handle = lock(&self.handles).remove(&fh);
        match handle.as_deref() {
            Some(Handle::Cached(h)) => h.entry.unpin(),
            Some(Handle::Staged {
                staged,
                writable: true,
            }) => {
                let last = staged.writers.fetch_sub(1, Ordering::Relaxed) == 1;
                if last {
                    return self.seal(staged);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Extended attributes: only the root's stats attribute exists.
    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>, Error> {
        if ino != ROOT_INO || name != STATS_XATTR {
            return Err(Error::NoAttr);
        }
        let cache = &self.reader.cache;
        let snap = self.stats().snapshot(crate::stats::Gauges {
            cached_bytes: cache.used_bytes(),
            cached_files: cache.cached_files(),
            capacity_bytes: cache.capacity(),
            inodes: self.inode_count() as u64,
            open_files: cache.open_files(),
        });
        Ok(serde_json::to_vec(&snap).expect("stats serialize"))
    }

    /// (blocks, free blocks, available blocks, files, free files, block size, name length)
    /// of the backing file system: the space the dataset lives in.
    pub fn statfs(&self) -> Result<libc::statvfs, Error> {
        let path =
            std::ffi::CString::new(self.backing.path("").into_os_string().into_encoded_bytes())
                .map_err(|_| Error::NotFound)?;
        // SAFETY: statvfs is plain data, fully written by the call on success.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid NUL-terminated path and a valid out pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
            return Err(Error::Backing(std::io::Error::last_os_error()));
        }
        Ok(s)
    }
}

fn new_node(path: &str, attr: Attr, lookups: u64) -> Node {
    Node {
        path: RwLock::new(path.to_string()),
        lookups: AtomicU64::new(lookups),
        last_use: AtomicU64::new(0),
        attr: Mutex::new((attr, Instant::now())),
        kernel_version: Mutex::new(None),
    }
}
