//! Open files, one component of [`DyadFs`](super::DyadFs): opening a file to read (the
//! path's resolution decides: a handle on a file being written here, or the cache entry of a
//! file to read), how the kernel is to read it (passthrough, or served with its pages kept), and
//! its reads ([`read`], with the work done off the request's thread). Opens to write are the
//! producer side's ([`super::produce`]).

mod read;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::config::{Capabilities, FsConfig};
use super::found::Found;
use super::handles::{CachedHandle, Handle, Opened};
use super::inodes::Node;
use super::prefetch::Prefetcher;
use super::tree::Tree;
use super::workers::Job;
use super::{Attr, Error};
use crate::cache::{Entry, ReadBytes};
use crate::core::Kind;
use crate::core::names;
use crate::core::source::Source;
use crate::core::sync::lock;
use crate::fill::{Reader, WHOLE_FILE_MAX};

/// What a read open found: a handle made already (a file being written), or the cache key and
/// attributes of a file to read.
enum ToOpen {
    Handle(Opened),
    Cached(String, Attr),
}

pub struct Files<S: Source> {
    tree: Arc<Tree>,
    pub(super) reader: Reader<S>,
    /// Reply to opens of complete cached files with kernel passthrough when possible.
    passthrough: bool,
    /// Files smaller than this are served by the daemon (see `FsConfig::passthrough_min`).
    passthrough_min: u64,
    /// Large files not cached whole are opened for direct I/O (`FsConfig::direct_large`).
    direct_large: bool,
    /// The kernel opens files without asking (`--no-open`).
    no_open: bool,
    /// What the kernel agreed to (none until the session's INIT).
    kernel: OnceLock<Capabilities>,
    /// Readahead and verification, done by background threads.
    readahead: crossbeam_channel::Sender<Job>,
    /// Told of every read open (a prefetch list's reader moving on).
    prefetch: Arc<Prefetcher>,
}

impl<S: Source> Files<S> {
    pub(super) fn new(
        tree: Arc<Tree>,
        reader: Reader<S>,
        prefetch: Arc<Prefetcher>,
        config: &FsConfig,
    ) -> Result<Self, Error> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..config.readahead_threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("readahead-{i}"))
                .spawn(move || rx.iter().for_each(|job| job()))
                .map_err(|e| Error::Cache(e.into()))?;
        }
        Ok(Files {
            tree,
            reader,
            passthrough: config.passthrough,
            passthrough_min: config.passthrough_min,
            direct_large: config.direct_large,
            no_open: config.no_open,
            kernel: OnceLock::new(),
            readahead: tx,
            prefetch,
        })
    }

    /// What the kernel agreed to at INIT (once; `false` if told already).
    pub(super) fn set_kernel(&self, caps: Capabilities) -> bool {
        self.kernel.set(caps).is_ok()
    }

    /// What the kernel agreed to (nothing before INIT).
    pub(super) fn kernel(&self) -> Capabilities {
        self.kernel.get().copied().unwrap_or_default()
    }

    /// Whether the kernel's INIT came.
    pub(super) fn initialised(&self) -> bool {
        self.kernel.get().is_some()
    }

    /// Whether a large file not cached whole is opened for direct I/O ([`Opened::direct`]):
    /// unless `--page-cache-large-files`, where the kernel lets such files be mapped (known once
    /// INIT is done).
    fn opens_large_files_directly(&self) -> bool {
        self.direct_large && self.kernel().direct_io_mmap
    }

    /// Whether large files not cached whole are opened for direct I/O while complete files
    /// pass through (known once INIT is done).
    pub(super) fn reads_large_files_directly(&self) -> bool {
        let k = self.kernel();
        self.opens_large_files_directly() && self.passthrough && k.passthrough && !k.no_open
    }

    pub(super) fn passthrough_enabled(&self) -> bool {
        self.passthrough
    }

    pub(super) fn opens_unasked(&self) -> bool {
        self.no_open
    }

    /// Opens a file to read.
    pub(super) fn open(&self, ino: u64) -> Result<Opened, Error> {
        let node = self.tree.node(ino)?;
        let (key, attr) = match self.to_open(&node)? {
            ToOpen::Handle(opened) => return Ok(opened),
            ToOpen::Cached(key, attr) => (key, attr),
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
        // An entry outside the cache if the cache's file system cannot take the file: its
        // reads are served uncached.
        let entry = cache.entry_or_uncached(&key, attr.version);
        entry.pin();
        // How this inode's earlier opens of the same version went (nothing for a new version).
        let before = lock(&node.kernel_version)
            .filter(|(v, _)| *v == attr.version)
            .map(|(_, keep_pages)| keep_pages);
        let keep_cache = before.is_some();
        let may_pass = self.passthrough && self.kernel().passthrough;
        let was_complete = entry.is_complete();
        if was_complete {
            self.tree.stats.local_hits.fetch_add(1, Ordering::Relaxed);
        }
        let complete = was_complete || self.fetched_at_open(&entry, keep_cache, may_pass);
        let packed = entry.packed();
        let keep_pages =
            before.unwrap_or_else(|| self.first_open_keeps_pages(&entry, may_pass, was_complete));
        *lock(&node.kernel_version) = Some((attr.version, keep_pages));
        // Every open of a complete file asks whether it is still as verified, whoever serves
        // it: asking notices a data file changed behind the daemon (see `verified_for_kernel`).
        // An open that completed the file itself just now has the print its fill took.
        let unchanged = complete
            && !entry.is_evicted()
            && if was_complete {
                entry.is_verified()
            } else {
                entry.is_verified_as_filled()
            };
        let verified = may_pass
            && !packed
            && complete
            && (unchanged || self.verified_for_kernel(&entry, keep_pages));
        // A packed file the kernel holds no pages of is handed to its page cache whole with
        // this open (fetched now if it is not cached): the reads of a program that seeks
        // about in it (np.load: six READs for a 256 KiB .npz) then never reach the daemon.
        // Not when the kernel may hold pages of this version already (an earlier open of the
        // inode): they would be copied again; its reads the page cache misses still come.
        let store = (packed && before.is_none())
            .then(|| self.whole_for_the_kernel(&entry))
            .flatten();
        let fh = self.tree.handles.add(Handle::Cached(CachedHandle {
            entry: entry.clone(),
            next_offset: AtomicU64::new(0),
            run_start: AtomicU64::new(0),
            window: AtomicU64::new(0),
            map: Default::default(),
        }));
        let direct =
            !complete && entry.version.size > WHOLE_FILE_MAX && self.opens_large_files_directly();
        Ok(Opened {
            fh,
            passthrough: verified.then_some(entry),
            keep_cache: keep_cache || store.is_some(),
            direct,
            keep_pages,
            finishes: false,
            store,
        })
    }

    /// What inode `node` opens to read: its path resolved, or a fresh backing file's without
    /// asking.
    fn to_open(&self, node: &Node) -> Result<ToOpen, Error> {
        if let Some((path, attr)) = self.fresh_backing_file(node) {
            self.prefetch.opened(&path);
            return Ok(ToOpen::Cached(path, attr));
        }
        let (path, found) = self.tree.resolve_node(node)?;
        self.prefetch.opened(&path);
        self.open_found(path, found)
    }

    /// Fetches a small file whole at its open, where that lets the open be a passthrough one
    /// (or lets the kernel keep a packed file's pages); whether the file is complete then.
    ///
    /// The first read fetches a small file whole anyway. Fetching it now lets this very open
    /// be a passthrough open, so the reader's many small reads (np.load parses a zip
    /// directory, then headers) never come to the daemon. A failed fetch is left to the first
    /// read, which retries it and reports the error. Not for produced files: the kernel binds
    /// one passthrough file per inode, so a reader holding one version open in passthrough
    /// would keep the next version from being opened (EBUSY). A packed file is never passed
    /// through: its first read fetches it and is served from the fetch's own bytes, unless the
    /// kernel keeps its pages from an earlier open (no read may come then, and the region its
    /// entry took in a segment would stay unwritten and uncounted by the capacity): then it is
    /// fetched now.
    fn fetched_at_open(&self, entry: &Arc<Entry>, keep_cache: bool, may_pass: bool) -> bool {
        let worth_it = if entry.packed() {
            keep_cache
        } else {
            may_pass && !names::is_object(&entry.path)
        };
        if entry.version.size > WHOLE_FILE_MAX || !worth_it {
            return false;
        }
        if let Err(e) = self.reader.fill(entry, 0..entry.chunk_count()) {
            tracing::debug!(path = %entry.path, error = %e, "fetch at open failed");
        }
        entry.is_complete()
    }

    /// Whether the kernel keeps the pages of the inode's opens of this version (the daemon
    /// serves them), decided by its first open.
    ///
    /// Below --passthrough-min the daemon serves the file with its pages kept by the kernel,
    /// so that an open of it while the kernel still holds them reads nothing (a passthrough
    /// open reads the cache file again and, on a writable mount, makes the next stat a
    /// GETATTR) -- unless its bytes are in memory when the inode's first open of this version
    /// comes: fetched or pulled by that open, or filled just before (prefetch), a daemon-served
    /// read would copy them once more, so it passes through. The first open decides for the
    /// inode's later ones: after a passthrough open the kernel holds no pages, and the next
    /// daemon-served open would read every byte again. (Asked before the verification, which
    /// reads the file.) A packed file (in a segment of the cache, see `cache::segments`) cannot
    /// be handed to the kernel: the daemon serves it, the kernel keeping its pages.
    fn first_open_keeps_pages(&self, entry: &Entry, may_pass: bool, was_complete: bool) -> bool {
        entry.packed()
            || may_pass
                && entry.version.size < self.passthrough_min
                && was_complete
                && entry.pages_cached() == Some(false)
    }

    /// Whether a complete cached file that is not verified as it is now may be handed to the
    /// kernel (passthrough): verified now.
    ///
    /// The kernel reads a passthrough file without us, so it must be verified first. A small
    /// file is verified now (unless the daemon serves it anyway, `keep_pages`); a large one
    /// (after a restart) is served by the daemon, which verifies each chunk it serves, while
    /// the rest is verified in the background for later opens. (A file that cannot be read
    /// back now is served by the daemon, whose reads fall back to the source.) Every open of a
    /// complete file asks, whoever serves it: one whose data file changed behind the daemon
    /// since it was verified (its ctime moved) has its chunks checked again before they are
    /// served, by the daemon as by the kernel.
    fn verified_for_kernel(&self, entry: &Arc<Entry>, keep_pages: bool) -> bool {
        if keep_pages || entry.is_evicted() {
            false
        } else if entry.version.size <= WHOLE_FILE_MAX {
            let cache = &self.reader.cache;
            entry.verify(cache, 0..entry.chunk_count()).unwrap_or(false)
        } else {
            self.verify_in_background(entry.clone());
            false
        }
    }

    /// A small packed file's bytes, fetched if need be, for the kernel's page cache.
    fn whole_for_the_kernel(&self, entry: &Arc<Entry>) -> Option<ReadBytes> {
        let size = entry.version.size;
        if !(1..=WHOLE_FILE_MAX).contains(&size) {
            return None;
        }
        match self.reader.read(entry, 0, size as u32) {
            Ok(bytes) if bytes.len() as u64 == size => Some(bytes),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(path = %entry.path, error = %e, "fetch at open failed");
                None
            }
        }
    }

    /// A backing file's path and attributes while they are fresh (the kernel trusts them as
    /// long): an open then costs no stat of the shared file system, which on Lustre or GPFS is
    /// a metadata server round trip per open of a cached file. A changed file is noticed once
    /// the TTL has passed, as its attributes are.
    fn fresh_backing_file(&self, node: &Node) -> Option<(String, Attr)> {
        let (attr, at) = *lock(&node.attr);
        (attr.kind == Kind::File && !attr.produced && at.elapsed() < self.tree.ttl(&attr))
            .then(|| (Tree::path_of(node), attr))
    }

    /// What a read open does with what its path resolved to: a file being written gets its
    /// handle at once; a file to read gives its cache key and attributes.
    fn open_found(&self, path: String, found: Found) -> Result<ToOpen, Error> {
        let (key, attr) = match found {
            Found::Staged(s) => return Ok(ToOpen::Handle(self.tree.handles.staged(s, false))),
            Found::Backing(meta) => {
                let attr = self.tree.upsert(path.clone(), &Found::Backing(meta), 0)?;
                (path, attr)
            }
            Found::Produced(n) => {
                super::found::openable(&n)?;
                let attr = self.tree.upsert(path, &Found::Produced(n.clone()), 0)?;
                (n.object, attr)
            }
        };
        Ok(ToOpen::Cached(key, attr))
    }
}
