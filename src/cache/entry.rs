//! One cached file: its chunks (see [`super::chunks`]), verified once per daemon lifetime
//! against their crc32c before they are served, its data file and its header. An entry owns no
//! descriptor: its data file is opened through the cache's bounded
//! [`DataFiles`](super::files::DataFiles) when used.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::chunks::{
    Chunk, ChunkStates, Chunks, Claim, FILL_WAIT, PAGES, PageClaim, PageMask, State,
};
use super::error::CacheError;
use super::files::Mode;
use super::format::{ChunkRecord, Header, PartialRecord};
use super::journal::Record;
use super::segments::Place;
use super::shared::Shared;
use crate::core::{Version, path_hash};

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
    /// Open handles holding it (the low bits) and its marks ([`FETCHED`], [`PULLED`],
    /// [`KEEP`], [`SHARED`], [`LOGGED`]).
    pins_marks: AtomicU32,
    /// The cache's tick when it was last used, in 32 bits: ages are taken modulo 2^32
    /// ([`Entry::age`]), so the counter's wrap changes no order.
    last_use: AtomicU32,
}

/// Some of this entry's bytes were fetched from the backing store (stats).
const FETCHED: u32 = 1 << 31;
/// Some of this entry's bytes were pulled from a peer (stats).
const PULLED: u32 = 1 << 30;
/// A produced file's current object on its producer: the only copy, never evicted.
const KEEP: u32 = 1 << 29;
/// Its pages were told to the publisher while it was partly cached ([`Entry::mark_shared`]).
const SHARED: u32 = 1 << 28;
/// A whole header of it is in the log: a page fill may append its chunk's pages alone.
const LOGGED: u32 = 1 << 27;
const PINS: u32 = LOGGED - 1;

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
            .map(|(i, _)| chunk_len(version.size, shared.chunk_size, i as u64))
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
            pins_marks: AtomicU32::new(0),
            last_use: AtomicU32::new(tick as u32),
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
}

/// A logged header as loading replays it: the path as the entry will hold it and the chunks in
/// the entry's form (inline when one), so that a million reloaded entries leave no freed chunk
/// list between them on the heap (RSS kept those, about 40 bytes an entry).
pub(super) struct Reloaded {
    pub(super) path: Box<str>,
    /// Where it lives, if packed.
    pub(super) place: Option<Place>,
    version: Version,
    chunk_size: u32,
    /// Present as logged but unverified, or absent.
    chunks: Chunks,
}

impl From<Header> for Reloaded {
    fn from(h: Header) -> Reloaded {
        let chunks: Vec<Chunk> = h
            .chunks
            .iter()
            .map(|c| match c {
                Some(crc) => Chunk::Present {
                    crc: *crc,
                    verified: false,
                },
                None => Chunk::Absent,
            })
            .collect();
        Reloaded {
            path: h.path.into_boxed_str(),
            place: None,
            version: h.version,
            chunk_size: h.chunk_size,
            chunks: Chunks::with_partial(chunks.into(), &h.partial),
        }
    }
}

impl Reloaded {
    /// Sets the pages of partial chunk `part.chunk` as a later record logged them, unless the
    /// header says the chunk is present whole (or has no such chunk).
    pub(super) fn set_pages(&mut self, part: PartialRecord) {
        let idx = part.chunk as usize;
        if idx >= self.chunks.len() || matches!(self.chunks[idx], Chunk::Present { .. }) {
            return;
        }
        let chunks = std::mem::replace(&mut self.chunks, Chunks::One([Chunk::Absent]));
        self.chunks = Chunks::with_partial(chunks, &[part]);
    }

    /// Marks chunks present whole as a later record logged them (`(chunk, crc)`), their pages
    /// if any forgotten; chunks the file does not have are ignored.
    pub(super) fn set_chunks(&mut self, chunks: &[(u32, u32)]) {
        for &(idx, crc) in chunks {
            let i = idx as usize;
            if i < self.chunks.len() {
                self.chunks.drop_pages(u64::from(idx));
                self.chunks[i] = Chunk::Present {
                    crc,
                    verified: false,
                };
            }
        }
    }

    /// A packed object's logged header.
    pub(super) fn packed(place: Place, h: Header) -> Reloaded {
        Reloaded {
            place: Some(place),
            ..Reloaded::from(h)
        }
    }

    pub(super) fn size(&self) -> u64 {
        self.version.size
    }

    pub(super) fn version(&self) -> Version {
        self.version
    }

    /// Whether it fits a cache of `chunk_size` chunks.
    pub(super) fn check(&self, chunk_size: u64) -> Result<(), CacheError> {
        if u64::from(self.chunk_size) != chunk_size {
            return Err(CacheError::Corrupt(format!(
                "chunk size {} differs from the configured {chunk_size}",
                self.chunk_size
            )));
        }
        if self.chunks.len() as u64 != self.version.size.div_ceil(chunk_size) {
            return Err(CacheError::Corrupt(
                "chunk count does not match size".into(),
            ));
        }
        if self.place.is_some() && self.chunks.len() != 1 {
            return Err(CacheError::Corrupt("a packed object is one chunk".into()));
        }
        // Pages only where the chunk has them (its last chunk may have fewer).
        let page = chunk_size / PAGES;
        for (&idx, p) in self.chunks.pages().into_iter().flatten() {
            let len = chunk_len(self.version.size, chunk_size, u64::from(idx));
            if u64::from(PageMask::BITS - p.present().leading_zeros()) > len.div_ceil(page) {
                return Err(CacheError::Corrupt("a page past its chunk".into()));
            }
        }
        Ok(())
    }

    /// The record it was read from (the log is rewritten from these).
    pub(super) fn record(&self) -> Record {
        let header = Header {
            chunk_size: self.chunk_size,
            version: self.version,
            path: self.path.to_string(),
            chunks: self
                .chunks
                .iter()
                .map(|c| match c {
                    Chunk::Present { crc, .. } => Some(*crc),
                    _ => None,
                })
                .collect(),
            partial: self.chunks.partial_records(),
        };
        match self.place {
            Some(place) => Record::Packed(place, header),
            None => Record::Put(header),
        }
    }

    /// The entry, its data file unchecked until first opened (a packed object's segment was
    /// checked at load); `id` is used unless it is packed (its place is its id).
    pub(super) fn into_entry(self, id: u64, shared: Arc<Shared>) -> Entry {
        let id = self.place.map_or(id, Place::id);
        let packed = self.place.is_some();
        let entry = Entry::new(self.path, self.version, id, shared, self.chunks, 0);
        entry.state.lock().unchecked = !packed;
        // The log is rewritten from the headers loaded: this one's is in it.
        entry.mark(LOGGED);
        entry
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

fn chunk_len(size: u64, chunk_size: u64, idx: u64) -> u64 {
    chunk_size.min(size - idx * chunk_size)
}

impl Entry {
    pub fn chunk_count(&self) -> u64 {
        self.version.size.div_ceil(self.shared.chunk_size)
    }

    pub fn chunk_len(&self, idx: u64) -> u64 {
        chunk_len(self.version.size, self.shared.chunk_size, idx)
    }

    pub fn chunk_size(&self) -> u64 {
        self.shared.chunk_size
    }

    /// Chunks covering bytes `[offset, offset + len)`, clipped to the file.
    pub fn chunks_for(&self, offset: u64, len: u64) -> Range<u64> {
        let end = (offset + len).min(self.version.size);
        if offset >= end {
            return 0..0;
        }
        offset / self.shared.chunk_size..end.div_ceil(self.shared.chunk_size)
    }

    /// The hash of its path: its slot in the index and the name of its data file.
    pub(super) fn slot(&self) -> u64 {
        path_hash(&self.path)
    }

    pub(super) fn touch(&self, tick: u64) {
        self.last_use.store(tick as u32, Ordering::Relaxed);
    }

    /// Ticks since it was last used, as of tick `now`. A use after `now` (another thread
    /// touched it meanwhile) is age 0, not a wrapped-around "oldest".
    pub(super) fn age(&self, now: u64) -> u32 {
        let age = (now as u32).wrapping_sub(self.last_use.load(Ordering::Relaxed));
        if age > u32::MAX / 2 { 0 } else { age }
    }

    /// An open handle holds the entry: it is not evicted until `unpin`.
    pub fn pin(&self) {
        self.pins_marks.fetch_add(1, Ordering::Relaxed);
        self.touch(self.shared.next_tick());
    }

    pub fn unpin(&self) {
        self.pins_marks.fetch_sub(1, Ordering::Relaxed);
    }

    pub(super) fn pinned(&self) -> bool {
        self.pins_marks.load(Ordering::Relaxed) & PINS != 0
    }

    /// Sets `mark`; whether it was not set before.
    fn mark(&self, mark: u32) -> bool {
        self.pins_marks.fetch_or(mark, Ordering::Relaxed) & mark == 0
    }

    /// Records that bytes of it came from the backing store: `true` the first time.
    pub fn mark_fetched(&self) -> bool {
        self.mark(FETCHED)
    }

    /// Records that bytes of it came from a peer: `true` the first time.
    pub fn mark_pulled(&self) -> bool {
        self.mark(PULLED)
    }

    /// Records that its partial copy was told to the publisher: `true` the first time.
    pub fn mark_shared(&self) -> bool {
        self.mark(SHARED)
    }

    fn is_shared(&self) -> bool {
        self.pins_marks.load(Ordering::Relaxed) & SHARED != 0
    }

    /// Whether its partial copy is yet to be told to the publisher: it holds pages of a random
    /// reader's (a copy of whole chunks only is told once complete, as a small file is).
    pub fn share_pages(&self) -> bool {
        !self.is_shared() && self.has_pages() && self.mark_shared()
    }

    /// Whether some chunk is partly present (pages a random reader filled).
    pub fn has_pages(&self) -> bool {
        let st = self.state.lock();
        st.chunks
            .pages()
            .is_some_and(|p| p.values().any(|p| p.present() != 0))
    }

    /// Which pages are present, a word per 32 pages (every page of a present chunk), for words
    /// `from..` (at most `max`): what a peer asks before pulling pages of a copy that may be
    /// partial.
    pub fn held_pages(&self, from: u64, max: usize) -> Vec<u32> {
        const WORDS: u64 = PAGES / 32;
        let end = (self.chunk_count() * WORDS).min(from.saturating_add(max as u64));
        let st = self.state.lock();
        (from.min(end)..end)
            .map(|w| {
                let i = w / WORDS;
                let mask = match st.chunks[i as usize] {
                    Chunk::Present { .. } => self.all_pages(i),
                    Chunk::Partial => st.chunks.page_set(i).map_or(0, |p| p.present()),
                    _ => 0,
                };
                (mask >> (w % WORDS * 32)) as u32
            })
            .collect()
    }

    /// Whether it is a produced file's current object (never evicted).
    pub fn kept(&self) -> bool {
        self.pins_marks.load(Ordering::Relaxed) & KEEP != 0
    }

    pub fn set_kept(&self, keep: bool) {
        if keep {
            self.pins_marks.fetch_or(KEEP, Ordering::Relaxed);
        } else {
            self.pins_marks.fetch_and(!KEEP, Ordering::Relaxed);
        }
    }

    pub fn is_evicted(&self) -> bool {
        self.state.lock().evicted
    }

    /// Claims every absent chunk of `range` for the caller to fill (partial ones are listed, to
    /// be completed page by page).
    pub fn claim(&self, range: Range<u64>) -> Claim {
        self.state.claim(range)
    }

    /// The length of a page (a chunk's last page may be shorter): a 128th of a chunk.
    pub fn page_size(&self) -> u64 {
        self.shared.chunk_size / PAGES
    }

    fn page_len(&self, idx: u64, page: u32) -> u64 {
        let start = u64::from(page) * self.page_size();
        self.page_size()
            .min(self.chunk_len(idx).saturating_sub(start))
    }

    /// The pages chunk `idx` has (a bit each).
    pub fn all_pages(&self, idx: u64) -> PageMask {
        let n = self.chunk_len(idx).div_ceil(self.page_size());
        if n >= PAGES {
            PageMask::MAX
        } else {
            (1 << n) - 1
        }
    }

    /// The pages of chunk `idx` that bytes `[offset, end)` touch.
    pub fn pages_for(&self, idx: u64, offset: u64, end: u64) -> PageMask {
        let start = idx * self.shared.chunk_size;
        let (from, to) = (offset.max(start), end.min(start + self.chunk_len(idx)));
        if from >= to {
            return 0;
        }
        let (first, last) = (
            (from - start) / self.page_size(),
            (to - 1 - start) / self.page_size(),
        );
        (first..=last).fold(0, |m, p| m | (1 << p))
    }

    /// The bytes of pages `pages` of chunk `idx`.
    pub fn page_bytes(&self, idx: u64, pages: PageMask) -> u64 {
        (0..PAGES as u32)
            .filter(|p| pages & (1 << p) != 0)
            .map(|p| self.page_len(idx, p))
            .sum()
    }

    /// Claims the absent pages of `want` in chunk `idx` for the caller to fill.
    pub fn claim_pages(&self, idx: u64, want: PageMask) -> PageClaim {
        self.state.claim_pages(idx, want)
    }

    /// Marks claimed pages present with the checksums of the bytes just written (`crcs[p]` for
    /// page p); `false` if the entry left the cache meanwhile (the caller's reservation is void).
    pub fn complete_pages(&self, idx: u64, mine: PageMask, crcs: &[u32; PAGES as usize]) -> bool {
        let bytes = self.page_bytes(idx, mine);
        let kept = self
            .state
            .complete_pages(idx, mine, crcs, bytes, self.all_pages(idx), |p| {
                self.page_len(idx, p)
            });
        if kept {
            self.note_verified(None);
        }
        kept
    }

    /// Gives back claimed pages that could not be filled.
    pub fn abandon_pages(&self, idx: u64, mine: PageMask) {
        self.state.abandon_pages(idx, mine)
    }

    /// Waits (bounded) until no page of `want` in chunk `idx` is being filled by someone else.
    pub fn wait_pages(&self, idx: u64, want: PageMask) -> Result<(), CacheError> {
        if self.state.wait_pages(idx, want, FILL_WAIT) {
            Ok(())
        } else {
            Err(CacheError::FillTimeout(self.path.to_string()))
        }
    }

    /// Whether every byte of `[offset, end)` is present: its chunks whole or the pages it touches.
    pub fn bytes_present(&self, offset: u64, end: u64) -> bool {
        self.chunks_for(offset, end.saturating_sub(offset))
            .all(|idx| {
                self.state
                    .pages_present(idx, self.pages_for(idx, offset, end))
            })
    }

    /// Marks a claimed chunk present with the checksum of the bytes just written.
    /// Returns false if the entry left the cache meanwhile (the caller's reservation is void).
    /// The fill that completes the file remembers its data file as the writes left it (see
    /// [`Entry::is_verified`]).
    pub fn complete(&self, idx: u64, crc: u32) -> bool {
        let kept = self.state.complete(idx, crc, self.chunk_len(idx));
        if kept {
            self.note_verified(None);
        }
        kept
    }

    /// Gives back a claimed chunk that could not be filled; waiters retry it themselves.
    pub fn abandon(&self, idx: u64) {
        self.state.abandon(idx)
    }

    /// Waits (bounded) until no chunk of `range` is being filled by someone else.
    pub fn wait_fills(&self, range: Range<u64>) -> Result<(), CacheError> {
        if self.state.wait_fills(range, FILL_WAIT) {
            Ok(())
        } else {
            Err(CacheError::FillTimeout(self.path.to_string()))
        }
    }

    pub fn all_present(&self, range: Range<u64>) -> bool {
        self.state.all_present(range)
    }

    pub fn is_complete(&self) -> bool {
        self.all_present(0..self.chunk_count())
    }

    /// Whether every chunk is present and verified in this daemon's lifetime, and the data file
    /// has not changed since (its ctime: any write, truncate or chmod by another process moves
    /// it). A changed file's chunks are marked unverified again, to be checked before use.
    /// A packed file's segment changes with every append to it too: its chunk is checked again
    /// once after one.
    pub fn is_verified(&self) -> bool {
        let seen = {
            let st = self.state.lock();
            if !all_verified(&st) {
                return false;
            }
            st.verified_ctime
        };
        // The print was taken when the last chunk was verified or written (`note_verified`):
        // another ctime now means someone changed the file behind the daemon, checked again
        // before it is served. None taken (its file could not be looked at then) is no
        // promise either: the file as it is now may be changed already.
        if seen != 0 && self.ctime_print() == Some(seen) {
            return true;
        }
        if seen != 0 && !self.packed() {
            tracing::warn!(path = %self.path, "cache data file changed behind the daemon: rechecking");
        }
        let mut st = self.state.lock();
        st.chunks.unverify();
        st.verified_ctime = 0;
        false
    }

    /// Whether every chunk is verified with the data file's print taken, without looking at the
    /// file again: for the open whose own fill just wrote and verified every chunk (the print
    /// was taken after that write, a moment ago; asking the file again would only tell the same
    /// at the cost of a `statx`). Any later open asks [`Entry::is_verified`].
    pub fn is_verified_as_filled(&self) -> bool {
        let st = self.state.lock();
        st.verified_ctime != 0 && all_verified(&st)
    }

    /// A fingerprint of the data file's ctime (never 0), if the file can be opened.
    pub(super) fn ctime_print(&self) -> Option<u32> {
        ctime_print(&*self.file(Mode::ReadWrite).ok()?)
    }

    /// Remembers the data file's ctime (`before`: taken before the bytes just verified were
    /// read; else now, after the fill that wrote them) once every chunk is verified and none is
    /// remembered: an open that finds another one checks the file again ([`Entry::is_verified`]).
    /// Every way a chunk becomes verified ends here, so that the print is never first taken at
    /// an open, after a change it would then hide.
    pub(super) fn note_verified(&self, before: Option<u32>) {
        {
            let st = self.state.lock();
            if st.verified_ctime != 0 || st.present_bytes != self.version.size || !all_verified(&st)
            {
                return;
            }
        }
        let print = before.or_else(|| self.ctime_print());
        let mut st = self.state.lock();
        if st.verified_ctime == 0 && all_verified(&st) {
            st.verified_ctime = print.unwrap_or(0);
        }
    }

    /// Writes chunk bytes at their offset in the data file (in its region of a segment, if
    /// packed: never past it).
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        if self.packed() && offset + bytes.len() as u64 > self.version.size {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let file = self.file(Mode::ReadWrite)?;
        // A partly cached file under guard: this write moves its ctime, not someone else.
        let before = self.guarded().then(|| ctime_print(&file)).flatten();
        file.write_all_at(bytes, self.base() + offset)?;
        if let Some(before) = before {
            self.wrote_own(before, ctime_print(&file));
        }
        Ok(())
    }
}

impl Entry {
    /// The data file, for the kernel to read directly (passthrough): the kernel keeps its own
    /// reference, so the descriptor may close once the open is answered.
    pub fn data_file(&self) -> io::Result<Arc<File>> {
        if self.packed() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.file(Mode::ReadWrite)
    }

    /// The record of this entry's present chunks (and place); `None` once it left the cache.
    pub(super) fn record(&self) -> Option<Record> {
        let st = self.state.lock();
        if st.evicted {
            return None;
        }
        let header = Header {
            chunk_size: self.shared.chunk_size as u32,
            version: self.version,
            path: self.path.to_string(),
            chunks: st
                .chunks
                .iter()
                .map(|c| match c {
                    Chunk::Present { crc, .. } => Some(*crc),
                    _ => None,
                })
                .collect::<Vec<ChunkRecord>>(),
            partial: st.chunks.partial_records(),
        };
        Some(match self.place() {
            Some(place) => Record::Packed(place, header),
            None => Record::Put(header),
        })
    }

    /// Records the present chunks in the cache's log, unless the entry left the cache.
    pub fn persist(&self) -> Result<(), CacheError> {
        self.shared.journal.put(|| self.record())?;
        self.mark(LOGGED);
        Ok(())
    }

    /// Records the pages of chunk `idx` a fill just completed: the chunk's pages alone while it
    /// is partial and the log holds a whole header of the entry (a page fill of a large file
    /// appends tens of bytes, not the header, which grows with the file and its partial
    /// chunks), else the whole header.
    pub fn persist_pages(&self, idx: u64) -> Result<(), CacheError> {
        if self.pins_marks.load(Ordering::Relaxed) & LOGGED == 0 {
            return self.persist();
        }
        let mut whole = false;
        self.shared.journal.put(|| {
            let st = self.state.lock();
            if st.evicted {
                return None;
            }
            let part = match (st.chunks[idx as usize], st.chunks.page_set(idx)) {
                (Chunk::Partial, Some(p)) if p.present() != 0 => PartialRecord {
                    chunk: idx as u32,
                    pages: p.present(),
                    crcs: p.crcs().to_vec(),
                },
                // Present whole now (or dropped): the header says so.
                _ => {
                    whole = true;
                    return None;
                }
            };
            Some(Record::Pages {
                path: self.path.to_string(),
                version: self.version,
                part,
            })
        })?;
        if whole {
            return self.persist_chunks(&[idx]);
        }
        Ok(())
    }

    /// Records chunks a fill just made present whole: those chunks alone once the log holds a
    /// whole header of the entry (a header grows with the file: rewriting it for each fill of
    /// a file of thousands of chunks made the log grow with the square of its size), else the
    /// whole header.
    pub fn persist_chunks(&self, chunks: &[u64]) -> Result<(), CacheError> {
        if self.pins_marks.load(Ordering::Relaxed) & LOGGED == 0 {
            return self.persist();
        }
        self.shared.journal.put(|| {
            let st = self.state.lock();
            if st.evicted {
                return None;
            }
            let present: Vec<(u32, u32)> = chunks
                .iter()
                .filter_map(|&i| match st.chunks[i as usize] {
                    Chunk::Present { crc, .. } => Some((i as u32, crc)),
                    _ => None,
                })
                .collect();
            (!present.is_empty()).then(|| Record::Chunks {
                path: self.path.to_string(),
                version: self.version,
                chunks: present,
            })
        })?;
        Ok(())
    }
}
