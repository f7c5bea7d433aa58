//! The filesystem core: inodes, attributes, directory listings, open handles and reads, as
//! plain Rust calls returning plain structs. [`fuse`] is the one file that speaks fuser and
//! adapts these calls to the kernel protocol.

mod backing;
mod error;
pub mod fuse;
pub mod read;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use backing::{BackingStore, version_of};
pub use error::Error;
use read::{MAX_READAHEAD_CHUNKS, Reader, Source, WHOLE_FILE_MAX};

use crate::cache::{Cache, Entry, Version};
use crate::stats::{STATS_XATTR, Stats};

pub const ROOT_INO: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
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
}

impl Attr {
    fn from_meta(ino: u64, meta: &Metadata) -> Attr {
        let ft = meta.file_type();
        let kind = if ft.is_file() {
            Kind::File
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_symlink() {
            Kind::Symlink
        } else {
            Kind::Other
        };
        let time = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
        Attr {
            ino,
            kind,
            size: meta.len(),
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            // The view is read-only: drop write bits so tools do not try and fail.
            perm: (meta.mode() & 0o7555) as u16,
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            version: version_of(meta),
        }
    }
}

#[derive(Debug, Clone)]
pub struct FsConfig {
    /// How long attributes and names are trusted, by the kernel and by the daemon.
    pub metadata_ttl: Duration,
    /// Reply to opens of complete cached files with kernel passthrough when possible.
    pub passthrough: bool,
    /// Threads filling readahead chunks in the background.
    pub readahead_threads: usize,
}

struct Node {
    path: String,
    attr: Mutex<(Attr, Instant)>,
    /// The version whose pages the kernel may hold for this inode (see `open`).
    kernel_version: Mutex<Option<Version>>,
}

#[derive(Default)]
struct Inodes {
    by_path: HashMap<String, u64>,
    nodes: HashMap<u64, Arc<Node>>,
    next: u64,
}

struct Handle {
    entry: Arc<Entry>,
    /// Where the next sequential read would start, and the current readahead window.
    next_offset: AtomicU64,
    window: AtomicU64,
}

/// What an open returns to the adapter.
pub struct Opened {
    pub fh: u64,
    /// The complete cached copy the kernel may read directly (passthrough), if allowed.
    pub passthrough: Option<Arc<Entry>>,
    /// Whether the kernel may keep the pages it already holds for this inode.
    pub keep_cache: bool,
}

/// One directory entry of a listing, with its attributes (readdirplus).
pub struct DirEntry {
    pub name: OsString,
    pub attr: Attr,
}

type Job = Box<dyn FnOnce() + Send>;

pub struct DyadFs<S: Source> {
    backing: BackingStore,
    reader: Reader<S>,
    config: FsConfig,
    inodes: RwLock<Inodes>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_fh: AtomicU64,
    readahead: crossbeam_channel::Sender<Job>,
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
    pub fn new(
        backing: BackingStore,
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
            Arc::new(new_node("", Attr::from_meta(ROOT_INO, &root))),
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
            reader: Reader {
                cache,
                stats,
                source,
            },
            config,
            inodes: RwLock::new(inodes),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            readahead: tx,
        })
    }

    pub fn ttl(&self) -> Duration {
        self.config.metadata_ttl
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

    /// The inode for `path`, created on first sight; its attributes are refreshed from `meta`.
    fn upsert(&self, path: String, meta: &Metadata) -> Attr {
        let mut inodes = self.inodes.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&ino) = inodes.by_path.get(&path) {
            let attr = Attr::from_meta(ino, meta);
            *inodes.nodes[&ino]
                .attr
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = (attr, Instant::now());
            return attr;
        }
        let ino = inodes.next;
        inodes.next += 1;
        let attr = Attr::from_meta(ino, meta);
        inodes.by_path.insert(path.clone(), ino);
        inodes.nodes.insert(ino, Arc::new(new_node(&path, attr)));
        attr
    }

    /// A node's attributes, refreshed from the backing store once the TTL has passed.
    fn fresh_attr(&self, node: &Node) -> Result<Attr, Error> {
        let (attr, at) = *node.attr.lock().unwrap_or_else(|e| e.into_inner());
        if at.elapsed() < self.config.metadata_ttl {
            return Ok(attr);
        }
        let meta = self.backing.stat(&node.path).map_err(Error::Backing)?;
        Ok(self.upsert(node.path.clone(), &meta))
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr, Error> {
        let parent = self.node(parent)?;
        let path = join(&parent.path, name);
        let known = {
            let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
            inodes
                .by_path
                .get(&path)
                .and_then(|i| inodes.nodes.get(i).cloned())
        };
        match known {
            Some(node) => self.fresh_attr(&node),
            None => {
                let meta = self.backing.stat(&path).map_err(Error::Backing)?;
                Ok(self.upsert(path, &meta))
            }
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr, Error> {
        let node = self.node(ino)?;
        self.fresh_attr(&node)
    }

    pub fn readlink(&self, ino: u64) -> Result<PathBuf, Error> {
        let node = self.node(ino)?;
        self.backing.read_link(&node.path).map_err(Error::Backing)
    }

    /// Lists a directory once per open; readdir calls page through the listing.
    pub fn opendir(&self, ino: u64) -> Result<u64, Error> {
        let node = self.node(ino)?;
        if self.fresh_attr(&node)?.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let listing = self.backing.list(&node.path).map_err(Error::Backing)?;
        let mut entries = Vec::with_capacity(listing.len());
        for (name, meta) in listing {
            let attr = self.upsert(join(&node.path, &name), &meta);
            entries.push(DirEntry { name, attr });
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, Arc::new(entries));
        Ok(fh)
    }

    pub fn listing(&self, fh: u64) -> Result<Arc<Vec<DirEntry>>, Error> {
        let dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
        dirs.get(&fh).cloned().ok_or(Error::BadHandle(fh))
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh);
    }

    pub fn open(&self, ino: u64, write: bool) -> Result<Opened, Error> {
        if write {
            return Err(Error::ReadOnly);
        }
        let node = self.node(ino)?;
        let attr = self.fresh_attr(&node)?;
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
        let entry = cache.entry(&node.path, attr.version)?;
        entry.pin(cache);
        let keep_cache = {
            let mut kv = node
                .kernel_version
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let same = *kv == Some(attr.version);
            *kv = Some(attr.version);
            same
        };
        let complete = entry.is_complete();
        if complete {
            self.stats().local_hits.fetch_add(1, Ordering::Relaxed);
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
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                fh,
                Arc::new(Handle {
                    entry: entry.clone(),
                    next_offset: AtomicU64::new(0),
                    window: AtomicU64::new(0),
                }),
            );
        Ok(Opened {
            fh,
            passthrough: (verified && self.config.passthrough).then_some(entry),
            keep_cache,
        })
    }

    fn handle(&self, fh: u64) -> Result<Arc<Handle>, Error> {
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        handles.get(&fh).cloned().ok_or(Error::BadHandle(fh))
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Error> {
        let handle = self.handle(fh)?;
        let entry = &handle.entry;
        let data = self.reader.read(entry, offset, size)?;
        if entry.version.size > WHOLE_FILE_MAX {
            self.read_ahead(&handle, offset, data.len() as u64);
        }
        Ok(data)
    }

    /// On sequential reads of a large file, fills the next chunks in the background with a
    /// window that doubles per sequential read; a seek resets it.
    fn read_ahead(&self, handle: &Handle, offset: u64, len: u64) {
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
        let reader = self.reader.clone();
        let _ = self.readahead.send(Box::new(move || {
            if let Err(e) = reader.fill(&entry, start..end) {
                tracing::debug!(path = %entry.path, error = %e, "readahead failed");
            }
        }));
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

    pub fn release(&self, fh: u64) {
        let handle = self
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh);
        if let Some(h) = handle {
            h.entry.unpin();
        }
    }

    /// Extended attributes: only the root's stats attribute exists.
    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>, Error> {
        if ino != ROOT_INO || name != STATS_XATTR {
            return Err(Error::NoAttr);
        }
        let cache = &self.reader.cache;
        let snap =
            self.stats()
                .snapshot(cache.used_bytes(), cache.cached_files(), cache.capacity());
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

fn new_node(path: &str, attr: Attr) -> Node {
    Node {
        path: path.to_string(),
        attr: Mutex::new((attr, Instant::now())),
        kernel_version: Mutex::new(None),
    }
}
