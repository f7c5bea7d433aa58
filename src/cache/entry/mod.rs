//! One cached file: its chunks (see [`super::chunks`]), verified once per daemon lifetime
//! against their crc32c before they are served, its data file and its header. An entry owns no
//! descriptor: its data file is opened through the cache's bounded
//! [`DataFiles`](super::files::DataFiles) when used.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::chunks::{Chunk, ChunkStates, Chunks, PAGES, PageMask, State};
use super::error::CacheError;
use super::files::Mode;
use super::format::{Header, PartialRecord};
use super::journal::Record;
use super::segments::Place;
use super::shared::Shared;
use crate::core::Version;

mod fills;
mod marks;
mod persist;

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
