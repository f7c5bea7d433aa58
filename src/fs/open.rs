//! Opening a file to read or write, reading it, and the last close of an open: the path's
//! resolution decides (a handle on a file being written, or the cache entry of a file to read),
//! then how the kernel is to read it (passthrough, or served with its pages kept).

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::found::Found;
use super::handles::{CachedHandle, Handle, Opened};
use super::inodes::Node;
use super::{Attr, DyadFs, Error, Kind, close};
use crate::cache::{Entry, ReadBytes};
use crate::core::names::{self, FILE_SIZE_MAX};
use crate::core::source::Source;
use crate::core::sync::lock;
use crate::fill::WHOLE_FILE_MAX;

/// What an open found: a handle made already (a file being written), or the cache key and
/// attributes of a file to read.
pub(super) enum ToOpen {
    Handle(Opened),
    Cached(String, Attr),
    /// The file being written that the path named was finished (published, or unlinked) after
    /// it was resolved: resolve again.
    Finished,
}

/// How many times an open resolves its path again when the file it found being written was
/// finished meanwhile; each time another writer opened, wrote and finished it in between.
const OPEN_RETRIES: usize = 8;

impl<S: Source> DyadFs<S> {
    /// Opens a file. `write`: open for writing (a produced file gets a new version, started
    /// from the current bytes unless `truncate`); backing files are read-only.
    pub fn open(&self, ino: u64, write: bool, truncate: bool) -> Result<Opened, Error> {
        let node = self.node(ino)?;
        let (key, attr) = match self.to_open(&node, write, truncate)? {
            ToOpen::Handle(opened) => return Ok(opened),
            ToOpen::Cached(key, attr) => (key, attr),
            ToOpen::Finished => return Err(Error::Contended),
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
        let may_pass = self.config.passthrough && self.kernel().passthrough;
        let was_complete = entry.is_complete();
        if was_complete {
            self.stats().local_hits.fetch_add(1, Ordering::Relaxed);
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
        let fh = self.handles.add(Handle::Cached(CachedHandle {
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

    /// What inode `node` opens: its path resolved (again while the file being written that it
    /// named was finished meanwhile, a few times), or a fresh backing file's without asking.
    fn to_open(&self, node: &Node, write: bool, truncate: bool) -> Result<ToOpen, Error> {
        if !write && let Some((path, attr)) = self.fresh_backing_file(node) {
            self.prefetch.opened(&path);
            return Ok(ToOpen::Cached(path, attr));
        }
        let mut tries = 0;
        loop {
            let (path, found) = self.resolve_node(node)?;
            if !write {
                self.prefetch.opened(&path);
            }
            match self.open_found(path, found, write, truncate)? {
                ToOpen::Finished if tries < OPEN_RETRIES => tries += 1,
                other => return Ok(other),
            }
        }
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
                && entry.version.size < self.config.passthrough_min
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
        (attr.kind == Kind::File && !attr.produced && at.elapsed() < self.ttl(&attr))
            .then(|| (Self::path_of(node), attr))
    }

    /// What an open does with what its path resolved to: a file being written (or a new
    /// version of a produced one) gets its handle at once; a file to read gives its cache key
    /// and attributes.
    pub(super) fn open_found(
        &self,
        path: String,
        found: Found,
        write: bool,
        truncate: bool,
    ) -> Result<ToOpen, Error> {
        let (key, attr) = match found {
            Found::Staged(s) if !write => return Ok(ToOpen::Handle(self.handles.staged(s, false))),
            Found::Staged(s) => {
                // Under the finishing lock, which the close that finishes a file holds
                // throughout: either that close has not begun (this handle is one writer more,
                // and the last release finishes the file), or it is over and the file was
                // unstaged, its bytes sealed; a handle on it would write into the sealed
                // object and finish it again.
                let held = s.clone();
                let _finishing = lock(&held.finishing);
                if *lock(&s.ended) {
                    return Ok(ToOpen::Finished);
                }
                if truncate {
                    s.set_len(0)?;
                    s.dirty.store(true, Ordering::Relaxed);
                }
                return Ok(ToOpen::Handle(self.handles.staged(s, true)));
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
                if !n.is_file() {
                    return Err(Error::Invalid);
                }
                if n.size > FILE_SIZE_MAX {
                    // A forged name (none is produced so large): refused before its chunk
                    // table is allocated.
                    return Err(Error::TooLarge {
                        size: n.size,
                        max: FILE_SIZE_MAX,
                    });
                }
                if write {
                    let staged = self.new_version(&path, &n, !truncate)?;
                    self.upsert(path, &Found::Staged(staged.clone()), 0)?;
                    return Ok(ToOpen::Handle(self.handles.staged(staged, true)));
                }
                let attr = self.upsert(path, &Found::Produced(n.clone()), 0)?;
                (n.object, attr)
            }
        };
        Ok(ToOpen::Cached(key, attr))
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<ReadBytes, Error> {
        let handle = self.handles.get(fh)?;
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

    /// A read of a file the kernel opened without asking (`--no-open`): opened for this read
    /// alone. Its cache entry is held for the read, not between reads, so eviction is free to
    /// take files the kernel has not closed.
    pub fn read_unopened(&self, ino: u64, offset: u64, size: u32) -> Result<ReadBytes, Error> {
        let opened = self.open(ino, false, false)?;
        let data = self.read(opened.fh, offset, size);
        self.release(opened.fh)?;
        data
    }

    /// Whether the kernel opens files without asking (`--no-open`).
    pub fn opens_unasked(&self) -> bool {
        self.config.no_open
    }

    /// The last close of an open file (the kernel sends it once every descriptor of the open
    /// is closed, including dups and forked copies, shortly after the last close returns). The
    /// last writable handle of a file being written finishes it, unless a close (`flush`) did.
    pub fn release(&self, fh: u64) -> Result<(), Error> {
        let handle = self.handles.remove(fh);
        match handle.as_deref() {
            Some(Handle::Cached(h)) => h.entry.unpin(),
            Some(Handle::Staged {
                staged,
                writable: true,
            }) => return self.writer_closed(staged, close::Close::Release),
            _ => {}
        }
        Ok(())
    }
}
