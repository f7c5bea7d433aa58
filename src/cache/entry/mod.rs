//! One cached file: its chunks (see [`super::chunks`]), verified once per daemon lifetime
//! against their crc32c before they are served, its data file and its header. An entry owns no
//! descriptor: its data file is opened through the cache's bounded
//! [`DataFiles`](super::files::DataFiles) when used.
//!
//! `Entry` is a facade over its parts: its chunks' states ([`super::chunks`]), its geometry
//! (`geometry.rs`), its pins and marks (`marks.rs`). Its own methods are here (the data file:
//! opened, checked at first open, read), in `fills.rs` (fills, their waits and writes, and
//! the records they leave in the log) and in `super::verify` (checks against the checksums).

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::chunks::{Chunk, ChunkStates, Chunks, PageMask, State};
use super::files::Mode;
use super::mapping::{Aligned, Mapping, Pooled, ReadBytes};
use super::segments::Place;
use super::shared::Shared;
use crate::core::{Version, path_hash};
use geometry::Geometry;
use marks::{COPYING, FETCHED, KEEP, Marks, PULLED, SHARED};

mod fills;
mod geometry;
mod marks;
pub(super) mod reloaded;

/// One cached file. Held by open handles (`pin`) and by the index. It owns no descriptor: its
/// data file is opened through the cache's bounded [`DataFiles`] when used. A million of them
/// are held at once, so it is kept at 104 bytes: with its reference counts, 128 bytes of heap,
/// one malloc size class below where eight more bytes would put it (144).
pub struct Entry {
    pub path: Box<str>,
    pub version: Version,
    /// Unique for the cache's lifetime: the key of its open data files.
    pub(super) id: u64,
    pub(super) shared: Arc<Shared>,
    pub(super) state: ChunkStates,
    /// Open handles holding it, its marks, its last use.
    marks: Marks,
}

impl Entry {
    /// An entry holding `chunks` (its present bytes follow from them), last used at `tick`.
    pub(super) fn new(
        path: Box<str>,
        version: Version,
        id: u64,
        shared: Arc<Shared>,
        chunks: Chunks,
        tick: u64,
    ) -> Entry {
        let whole: u64 = chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c, Chunk::Present { .. }))
            .map(|(i, _)| Geometry::new(version.size, shared.chunk_size).chunk_len(i as u64))
            .sum();
        let chunks = chunks.counted_in(&shared.page_tables);
        let entry = Entry {
            path,
            version,
            id,
            shared,
            state: ChunkStates::new(State {
                chunks,
                present_bytes: whole,
                evicted: false,
                unchecked: false,
                verified_ctime: 0,
                waiting: 0,
            }),
            marks: Marks::new(tick),
        };
        // The pages of partial chunks count too.
        let mut st = entry.state.lock();
        let pages: u64 = st
            .chunks
            .pages()
            .into_iter()
            .flatten()
            .map(|(&idx, p)| entry.page_bytes(u64::from(idx), p.present()))
            .sum();
        st.present_bytes += pages;
        drop(st);
        entry
    }

    /// Its chunks and pages.
    pub(in crate::cache) fn geometry(&self) -> Geometry {
        Geometry::new(self.version.size, self.shared.chunk_size)
    }

    pub fn chunk_count(&self) -> u64 {
        self.geometry().chunk_count()
    }

    pub fn chunk_len(&self, idx: u64) -> u64 {
        self.geometry().chunk_len(idx)
    }

    pub fn chunk_size(&self) -> u64 {
        self.shared.chunk_size
    }

    /// Chunks covering bytes `[offset, offset + len)`, clipped to the file.
    pub fn chunks_for(&self, offset: u64, len: u64) -> Range<u64> {
        self.geometry().chunks_for(offset, len)
    }

    /// The length of a page (a chunk's last page may be shorter): a 128th of a chunk.
    pub fn page_size(&self) -> u64 {
        self.geometry().page_size()
    }

    /// The pages chunk `idx` has (a bit each).
    pub fn all_pages(&self, idx: u64) -> PageMask {
        self.geometry().all_pages(idx)
    }

    /// The pages of chunk `idx` that bytes `[offset, end)` touch.
    pub fn pages_for(&self, idx: u64, offset: u64, end: u64) -> PageMask {
        self.geometry().pages_for(idx, offset, end)
    }

    /// The bytes of pages `pages` of chunk `idx`.
    pub fn page_bytes(&self, idx: u64, pages: PageMask) -> u64 {
        self.geometry().page_bytes(idx, pages)
    }

    /// The hash of its path: its slot in the index and the name of its data file.
    pub(in crate::cache) fn slot(&self) -> u64 {
        path_hash(&self.path)
    }

    pub(in crate::cache) fn touch(&self, tick: u64) {
        self.marks.touch(tick)
    }

    /// Ticks since it was last used, as of tick `now` (see [`Marks::age`]).
    pub(in crate::cache) fn age(&self, now: u64) -> u32 {
        self.marks.age(now)
    }

    /// An open handle holds the entry: it is not evicted until `unpin`.
    pub fn pin(&self) {
        self.marks.pin(self.shared.next_tick())
    }

    pub fn unpin(&self) {
        self.marks.unpin()
    }

    pub(in crate::cache) fn pinned(&self) -> bool {
        self.marks.pinned()
    }

    /// Records that bytes of it came from the backing store: `true` the first time.
    pub fn mark_fetched(&self) -> bool {
        self.marks.mark(FETCHED)
    }

    /// Records that bytes of it came from a peer: `true` the first time.
    pub fn mark_pulled(&self) -> bool {
        self.marks.mark(PULLED)
    }

    /// Records that its partial copy was told to the publisher: `true` the first time.
    pub fn mark_shared(&self) -> bool {
        self.marks.mark(SHARED)
    }

    /// Whether its partial copy is yet to be told to the publisher: it holds pages of a random
    /// reader's (a copy of whole chunks only is told once complete, as a small file is).
    pub fn share_pages(&self) -> bool {
        !self.marks.has(SHARED) && self.has_pages() && self.mark_shared()
    }

    /// Whether it is a produced file's current object (never evicted).
    pub fn kept(&self) -> bool {
        self.marks.has(KEEP)
    }

    pub fn set_kept(&self, keep: bool) {
        self.marks.set(KEEP, keep)
    }

    /// Marks it as being copied in the background (replication), or no longer: a reader that
    /// finds chunks of it claimed waits a moment only, then reads around them, as the copy may
    /// wait out a frozen holder's timeout its reader would not meet.
    pub fn set_copying(&self, copying: bool) {
        self.marks.set(COPYING, copying)
    }

    /// Whether a background copy of it is under way (see [`Entry::set_copying`]).
    pub fn is_copying(&self) -> bool {
        self.marks.has(COPYING)
    }

    pub(super) fn data_path(&self) -> PathBuf {
        self.shared.data_path(self.slot())
    }

    /// Where its bytes live in a segment, if packed (see [`super::segments`]).
    pub(super) fn place(&self) -> Option<Place> {
        Place::of(self.id)
    }

    /// Whether its bytes live in a segment: the kernel cannot be handed them (passthrough maps
    /// a backing file whole, from offset 0), the daemon serves them.
    pub fn packed(&self) -> bool {
        self.place().is_some()
    }

    /// Where byte 0 of the file is in its data file (its segment's, if packed).
    pub(super) fn base(&self) -> u64 {
        self.place().map_or(0, Place::offset)
    }

    /// The entry's data file opened as `mode`, from the cache's LRU or opened now. An entry
    /// that left the cache never reopens its path (another entry's file may be there now): the
    /// open happens under the entry's lock, and leaving the cache sets `evicted` under it before
    /// the path is unlinked. A reloaded entry's file is checked on first open: a missing or
    /// resized file (changed behind the cache's back) empties the entry, whose chunks are then
    /// fetched again.
    pub(super) fn file(&self, mode: Mode) -> io::Result<Arc<File>> {
        self.file_kept(mode, true).map(|(f, _)| f)
    }

    /// As [`Entry::file`], but a file the LRU does not hold is opened for the caller alone and
    /// closed when it lets go: a one-shot read (a peer's pull of a whole small file is the only
    /// read of it for an epoch) then costs the LRU no insert, and no other file its place.
    pub(super) fn file_once(&self, mode: Mode) -> io::Result<Arc<File>> {
        self.file_kept(mode, false).map(|(f, _)| f)
    }

    /// As [`Entry::file_once`], with the file's ctime print if `print` (taken before its bytes
    /// are read). A reloaded entry's first open prints from the stat that checks the file: a
    /// peer's first pull after a restart then makes one `statx`, not two.
    pub(super) fn file_once_printed(
        &self,
        mode: Mode,
        print: bool,
    ) -> io::Result<(Arc<File>, Option<u32>)> {
        let (file, checked) = self.file_kept(mode, false)?;
        let print = match checked {
            _ if !print => None,
            Some(m) => Some(print_of(&m)),
            None => ctime_print(&file),
        };
        Ok((file, print))
    }

    /// The data file, for the kernel to read directly (passthrough): the kernel keeps its own
    /// reference, so the descriptor may close once the open is answered.
    pub fn data_file(&self) -> io::Result<Arc<File>> {
        if self.packed() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.file(Mode::ReadWrite)
    }

    /// The data file as `mode`, kept in the LRU if `keep`; with the metadata that checked it
    /// where this open was a reloaded entry's first (taken on the descriptor returned).
    fn file_kept(&self, mode: Mode, keep: bool) -> io::Result<(Arc<File>, Option<Metadata>)> {
        let files = &self.shared.files;
        if let Some(place) = self.place() {
            // A segment's name is never reused, so the file is this entry's segment whenever
            // it opens; one that is gone (its objects all left) fails the read, which falls
            // back to the source.
            return Ok((self.shared.segments.file(files, place, mode)?, None));
        }
        // A file in the LRU was opened while the entry was live: it is this entry's.
        if let Some(f) = files.cached(self.id, mode) {
            return Ok((f, None));
        }
        let mut st = self.state.lock();
        if st.evicted {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        let path = self.data_path();
        let mut emptied = false;
        let mut checked = None;
        if st.unchecked {
            // The descriptor the caller wants is opened first: a file as the cache left it
            // (its size) is checked by it alone (a peer's pull of a reloaded entry then opens
            // one file, not three). A missing or resized one is made again, read-write.
            if let Ok(f) = files.open_unkept(&path, mode)
                && let Ok(m) = f.metadata()
                && m.len() == self.version.size
            {
                checked = Some((f, m));
            } else {
                let data = files.open_retrying(|| {
                    OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .mode(0o600)
                        .open(&path)
                })?;
                if data.metadata()?.len() != self.version.size {
                    tracing::warn!(path = %self.path, "cache data file missing or resized: refetching");
                    data.set_len(0)?;
                    data.set_len(self.version.size)?;
                    self.shared
                        .used
                        .fetch_sub(st.present_bytes, Ordering::Relaxed);
                    st.chunks.clear();
                    st.present_bytes = 0;
                    emptied = true;
                }
            }
            st.unchecked = false;
        }
        let (file, meta) = match (checked, keep) {
            (Some((f, m)), true) => (files.insert(self.id, mode, f), Some(m)),
            (Some((f, m)), false) => (Arc::new(f), Some(m)),
            (None, true) => (files.open(self.id, &path, mode)?, None),
            (None, false) => (Arc::new(files.open_unkept(&path, mode)?), None),
        };
        drop(st);
        if emptied && let Err(e) = self.persist() {
            // Logged as present still: after a restart those chunks fail their checksums.
            tracing::warn!(path = %self.path, error = %e, "could not record an emptied entry");
        }
        Ok((file, meta))
    }

    /// The stored crc32c of the chunk that is exactly `[offset, offset + len)`, if present.
    pub fn chunk_crc(&self, offset: u64, len: u64) -> Option<u32> {
        let idx = offset / self.shared.chunk_size;
        if !offset.is_multiple_of(self.shared.chunk_size)
            || idx >= self.chunk_count()
            || self.chunk_len(idx) != len
        {
            return None;
        }
        match self.state.lock().chunks[idx as usize] {
            Chunk::Present { crc, .. } => Some(crc),
            _ => None,
        }
    }

    /// Reads `room[..len]` at `offset`, for a peer or for a daemon-served read of this mount.
    /// Bytes already in the page cache are copied from it; bytes that are not are read from
    /// the disk straight into `room` (O_DIRECT, where `room` is block-aligned and holds whole
    /// blocks), not through the page cache: on a node serving its cache to others, that copy
    /// costs as much CPU as the whole transfer (`perf` of `scripts/bench_cluster.sh`); a reader
    /// of this mount has the bytes kept in the mount's own page cache; and the pages would only
    /// push the node's working set out. `print`: also returns the data file's ctime print,
    /// taken before the read (see `Entry::note_verified`).
    pub(super) fn read_avoiding_page_cache(
        &self,
        offset: u64,
        room: &mut [u8],
        len: usize,
        print: bool,
    ) -> io::Result<Option<u32>> {
        // Where the bytes are in the data file (its region of a segment, if packed).
        let at = self.base() + offset;
        // A file of its own: its read-write descriptor if the LRU keeps it, looked up once (what
        // `Entry::file` would return first).
        let own = self.place().is_none();
        let kept = own
            .then(|| self.shared.files.cached(self.id, Mode::ReadWrite))
            .flatten();
        // A whole file of its own whose read-write descriptor is not kept (a reloaded entry's
        // first serve to a peer, or one the LRU let go): its O_DIRECT descriptor alone asks,
        // prints and reads, where the read-write one would be opened and kept for that (after
        // a restart a serve opened three files, `RESTART_A=1 scripts/bench_sample.sh`).
        if own
            && kept.is_none()
            && offset == 0
            && len as u64 == self.version.size
            && let Ok((direct, before)) = self.file_once_printed(Mode::Direct, print)
            && crate::sys::pages_cached(&direct, at, len) == Some(false)
            && super::direct::read_direct_with(&direct, at, room, len)
        {
            return Ok(before);
        }
        let data = match kept {
            Some(f) => f,
            None => self.file(Mode::ReadWrite)?,
        };
        let before = print.then(|| ctime_print(&data)).flatten();
        if crate::sys::pages_cached(&data, at, len) == Some(false)
            && self.read_direct(at, room, len)
        {
            return Ok(before);
        }
        data.read_exact_at(&mut room[..len], at)?;
        Ok(before)
    }

    /// Whether every byte of the data file is in the page cache (`None` where that cannot be
    /// told, see [`crate::sys::pages_cached`]).
    pub fn pages_cached(&self) -> Option<bool> {
        let data = self.file(Mode::ReadWrite).ok()?;
        crate::sys::pages_cached(&data, self.base(), self.version.size as usize)
    }

    /// Reads at least `room[..len]` at `offset` of the data file with O_DIRECT, rounded up to
    /// whole blocks; `false` where that is impossible (unaligned, refused) or failed: read
    /// another way.
    fn read_direct(&self, offset: u64, room: &mut [u8], len: usize) -> bool {
        if !super::direct::aligned_for_direct(offset, room, len) {
            return false;
        }
        // Opened on demand and kept in the LRU while idle, unless this read is the whole file
        // (a small file pulled by a peer: its only read for an epoch); a refusal means read
        // another way.
        let whole = offset == self.base() && len as u64 == self.version.size;
        let direct = if whole {
            self.file_once(Mode::Direct)
        } else {
            self.file(Mode::Direct)
        };
        direct.is_ok_and(|d| super::direct::read_direct_with(&d, offset, room, len))
    }

    /// Maps the whole data file for reading (`None` if the system refuses): readers that keep
    /// it (an open handle of a large file) are then served without copying.
    pub fn map(&self) -> Option<Arc<Mapping>> {
        if self.packed() {
            // A packed object is one chunk, read whole: nothing to keep mapped.
            return None;
        }
        let data = self.file(Mode::ReadWrite).ok()?;
        Mapping::new(&data, self.version.size as usize).map(Arc::new)
    }

    /// Bytes `[offset, offset + len)` of present chunks (the caller has ensured and verified
    /// them), from `map` if given.
    pub fn read_bytes(
        &self,
        offset: u64,
        len: usize,
        map: Option<&Arc<Mapping>>,
    ) -> io::Result<ReadBytes> {
        if let Some(m) = map.filter(|m| offset as usize + len <= m.size()) {
            return Ok(ReadBytes::Mapped(
                m.clone(),
                offset as usize..offset as usize + len,
            ));
        }
        if self.packed() {
            // A packed object: copied into the thread's kept buffer.
            let data = self.file(Mode::ReadWrite)?;
            let at = self.base() + offset;
            return Pooled::fill(len, |b| data.read_exact_at(b, at)).map(ReadBytes::Pooled);
        }
        let mut buf = Aligned::zeroed(len);
        self.read_avoiding_page_cache(offset, buf.room(), len, false)?;
        Ok(ReadBytes::Aligned(buf))
    }
}

/// Whether every chunk is present and verified in this daemon's lifetime.
pub(super) fn all_verified(st: &State) -> bool {
    st.chunks
        .iter()
        .all(|c| matches!(c, Chunk::Present { verified: true, .. }))
}

/// A fingerprint of `file`'s ctime (never 0: 0 is "none taken"), if it can be looked at.
pub(super) fn ctime_print(file: &File) -> Option<u32> {
    Some(print_of(&file.metadata().ok()?))
}

/// The ctime print of a data file's metadata (never 0, which stands for none).
fn print_of(m: &Metadata) -> u32 {
    use std::os::unix::fs::MetadataExt;
    let print = (m.ctime() as u32).wrapping_mul(2_654_435_761) ^ m.ctime_nsec() as u32;
    print.max(1)
}
