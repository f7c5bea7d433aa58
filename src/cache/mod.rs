//! The node-local NVMe cache: one sparse `.dat` file per cached source file (same size, same
//! offsets, so the kernel can read it directly in passthrough mode) plus a checksummed header
//! saying which chunks are present (see [`format`]), recorded in one log for the whole cache
//! (see [`journal`]).
//!
//! Chunks move Absent -> Filling (claimed by one filler: single flight) -> Present. A present
//! chunk is *verified* once per daemon lifetime against its crc32c before it is served; chunks
//! reloaded after a restart start unverified. Capacity is accounted in bytes of present (or
//! reserved) chunks; least recently used entries that nobody holds open are evicted whole.

pub mod format;
pub mod journal;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use format::{ChunkRecord, Header};
use journal::{Journal, Record};

use crate::stats::Stats;

/// A source file's version: a cached copy of another version is never served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version {
    pub size: u64,
    pub mtime_ns: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("corrupt cache entry: {0}")]
    Corrupt(String),
    #[error("cache directory {0} is in use by another dyadfs daemon")]
    Locked(PathBuf),
    #[error("timed out waiting for another reader's fill of {0}")]
    FillTimeout(String),
}

#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dir: PathBuf,
    pub chunk_size: u32,
    /// Bytes the cache may hold; `None` leaves 10% of the cache filesystem free.
    pub capacity: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Absent,
    Filling,
    Present { crc: u32, verified: bool },
}

struct State {
    chunks: Vec<Chunk>,
    present_bytes: u64,
    /// Set when the entry leaves the index (evicted or replaced): nothing is persisted again.
    evicted: bool,
}

/// One cached file. Held by open handles (`pin`) and by the index.
pub struct Entry {
    pub path: String,
    pub version: Version,
    chunk_size: u64,
    data: File,
    data_path: PathBuf,
    /// `data` opened for direct I/O (peers' reads of cold chunks), opened on first use.
    direct: std::sync::OnceLock<Option<File>>,
    journal: Arc<Journal>,
    state: Mutex<State>,
    filled: Condvar,
    pins: AtomicU32,
    last_use: AtomicU64,
    /// Whether any of this entry's bytes were fetched from the backing store (stats).
    pub fetched: AtomicBool,
    /// Whether any of this entry's bytes were pulled from a peer (stats).
    pub pulled: AtomicBool,
    /// A produced file's current object on its producer: the only copy, never evicted.
    pub keep: AtomicBool,
}

#[derive(Default)]
struct Index {
    entries: HashMap<String, Arc<Entry>>,
    /// The path whose data file is in each slot (named by the path's hash): a hash collision is
    /// found without scanning every entry.
    slots: HashMap<u64, String>,
}

impl Index {
    fn insert(&mut self, entry: Arc<Entry>) {
        self.slots
            .insert(format::path_hash(&entry.path), entry.path.clone());
        self.entries.insert(entry.path.clone(), entry);
    }

    fn remove(&mut self, path: &str) -> Option<Arc<Entry>> {
        let entry = self.entries.remove(path)?;
        let hash = format::path_hash(path);
        if self.slots.get(&hash).is_some_and(|p| p == path) {
            self.slots.remove(&hash);
        }
        Some(entry)
    }

    fn in_slot(&self, hash: u64) -> Option<Arc<Entry>> {
        self.entries.get(self.slots.get(&hash)?).cloned()
    }
}

pub struct Cache {
    dir: PathBuf,
    chunk_size: u64,
    capacity: u64,
    index: Mutex<Index>,
    /// Bytes of present chunks plus reservations of fills in flight.
    used: AtomicU64,
    tick: AtomicU64,
    stats: Arc<Stats>,
    /// Told when a file becomes complete or leaves the cache (the locator publishes these).
    events: std::sync::OnceLock<crossbeam_channel::Sender<CacheEvent>>,
    journal: Arc<Journal>,
    _lock: File,
}

/// What the rest of the node learns from the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Every chunk of this version is present: this node can serve it to peers.
    Complete { path: String, version: Version },
    /// The copy is gone (evicted or replaced by another version).
    Dropped { path: String, version: Version },
}

/// How long a reader waits for another reader's fill of the same chunk before giving up.
const FILL_WAIT: Duration = Duration::from_secs(120);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a cache lock leaves consistent-enough state (chunks are only marked
    // present after their bytes are written); keep serving rather than poisoning every reader.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cache {
    /// Opens (or creates) the cache directory, takes its lock and reloads every intact entry.
    /// Leftovers of a crash (temp files, data without a live header, headers that do not check
    /// out) are deleted, and the log is rewritten with the live headers only.
    pub fn open(config: &CacheConfig, stats: Arc<Stats>) -> Result<Cache, CacheError> {
        let data_dir = config.dir.join("data");
        // Every data subdirectory exists from the start: no mkdir per new entry.
        for sub in 0..=0xffu64 {
            fs::create_dir_all(data_dir.join(format!("{sub:02x}")))?;
        }
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(config.dir.join("lock"))?;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock_file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(CacheError::Locked(config.dir.clone()));
        }
        let chunk_size = u64::from(config.chunk_size);
        let log_path = config.dir.join("index.log");
        // The live header of each data file: the last record for a path wins, and of two live
        // paths sharing a data file (a hash collision) the later one.
        let mut last: HashMap<String, (usize, Option<Header>)> = HashMap::new();
        for (at, record) in journal::read(&log_path)?.into_iter().enumerate() {
            match record {
                Record::Put(h) => last.insert(h.path.clone(), (at, Some(h))),
                Record::Drop(path) => last.insert(path, (at, None)),
            };
        }
        let mut by_slot: HashMap<u64, (usize, Header)> = HashMap::new();
        for (at, h) in last.into_values().filter_map(|(at, h)| Some((at, h?))) {
            let hash = format::path_hash(&h.path);
            if by_slot.get(&hash).is_none_or(|(later, _)| *later < at) {
                by_slot.insert(hash, (at, h));
            }
        }
        let mut loaded = Vec::new();
        for sub in fs::read_dir(&data_dir)? {
            let sub = sub?.path();
            if !sub.is_dir() {
                continue;
            }
            for file in fs::read_dir(&sub)? {
                let file = file?.path();
                let name = file.file_name().unwrap_or_default().to_string_lossy();
                let header = name
                    .strip_suffix(".dat")
                    .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                    .and_then(|hash| by_slot.remove(&hash))
                    .map(|(_, h)| h);
                // Data without a live header (a fill cut short, a dropped entry), or anything
                // foreign, is deleted.
                let Some(header) = header else {
                    let _ = fs::remove_file(&file);
                    continue;
                };
                match check_entry(&header, &file, chunk_size) {
                    Ok(data) => loaded.push((header, data, file)),
                    Err(e) => {
                        tracing::warn!(path = %header.path, error = %e, "dropping cache entry");
                        let _ = fs::remove_file(&file);
                    }
                }
            }
        }
        let journal = Arc::new(Journal::create(
            &log_path,
            loaded.iter().map(|(h, _, _)| h.clone()),
        )?);
        let mut index = Index::default();
        let mut used = 0;
        for (header, data, data_path) in loaded {
            let entry = reloaded_entry(header, data, data_path, chunk_size, journal.clone());
            used += lock(&entry.state).present_bytes;
            index.insert(Arc::new(entry));
        }
        let capacity = match config.capacity {
            Some(c) => c,
            None => {
                let (total, avail) = fs_space(&config.dir)?;
                (avail + used).saturating_sub(total / 10)
            }
        };
        tracing::info!(
            entries = index.entries.len(),
            used,
            capacity,
            "cache loaded"
        );
        Ok(Cache {
            dir: config.dir.clone(),
            chunk_size,
            capacity,
            index: Mutex::new(index),
            used: AtomicU64::new(used),
            tick: AtomicU64::new(1),
            stats,
            events: std::sync::OnceLock::new(),
            journal,
            _lock: lock_file,
        })
    }

    /// Subscribes to [`CacheEvent`]s (once per cache).
    pub fn subscribe(&self, tx: crossbeam_channel::Sender<CacheEvent>) {
        let _ = self.events.set(tx);
    }

    pub fn emit(&self, event: CacheEvent) {
        if let Some(tx) = self.events.get() {
            let _ = tx.send(event);
        }
    }

    /// The entry for `path` if cached at `version`; never creates one.
    pub fn lookup(&self, path: &str, version: Version) -> Option<Arc<Entry>> {
        let index = lock(&self.index);
        index
            .entries
            .get(path)
            .filter(|e| e.version == version)
            .cloned()
    }

    /// Every complete entry (to publish after a restart).
    pub fn complete_entries(&self) -> Vec<(String, Version)> {
        let index = lock(&self.index);
        index
            .entries
            .values()
            .filter(|e| e.is_complete())
            .map(|e| (e.path.clone(), e.version))
            .collect()
    }

    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Number of entries holding at least one present chunk.
    pub fn cached_files(&self) -> u64 {
        let index = lock(&self.index);
        index
            .entries
            .values()
            .filter(|e| lock(&e.state).present_bytes > 0)
            .count() as u64
    }

    /// The entry for `path` at `version`, created empty if absent. A cached copy of another
    /// version is dropped (its open handles keep reading their own, now unlinked, copy).
    pub fn entry(&self, path: &str, version: Version) -> Result<Arc<Entry>, CacheError> {
        let mut index = lock(&self.index);
        if let Some(e) = index.entries.get(path) {
            if e.version == version {
                e.touch(self.next_tick());
                return Ok(e.clone());
            }
            let old = index.remove(path).expect("present");
            self.drop_entry(&old);
        }
        if self.journal.wants_rewrite() {
            self.rewrite_journal(&index);
        }
        let hash = format::path_hash(path);
        let data_path = self
            .dir
            .join("data")
            .join(format!("{:02x}", hash >> 56))
            .join(format!("{hash:016x}.dat"));
        // A different path with the same hash: the newcomer takes the slot.
        if let Some(other) = index.in_slot(hash) {
            index.remove(&other.path);
            self.drop_entry(&other);
        }
        // A new file, never one an old copy's open handles may still read: a leftover is
        // unlinked first. Usually there is none, so one name lookup, not two.
        let create = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&data_path)
        };
        let data = match create() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&data_path)?;
                create()?
            }
            r => r?,
        };
        data.set_len(version.size)?;
        let n = version.size.div_ceil(self.chunk_size) as usize;
        let entry = Arc::new(Entry::new(
            EntryFiles {
                path: path.to_string(),
                version,
                chunk_size: self.chunk_size,
                data,
                data_path,
                journal: self.journal.clone(),
            },
            vec![Chunk::Absent; n],
            self.next_tick(),
        ));
        index.insert(entry.clone());
        Ok(entry)
    }

    fn next_tick(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }

    /// Rewrites the log with the live headers only (it has grown well past them).
    fn rewrite_journal(&self, index: &Index) {
        let entries: Vec<Arc<Entry>> = index.entries.values().cloned().collect();
        let r = self
            .journal
            .rewrite(|| entries.iter().filter_map(|e| e.header()).collect());
        if let Err(e) = r {
            tracing::warn!(error = %e, "could not rewrite the cache log; appending on");
        }
    }

    /// Removes an entry's files and returns its bytes. The caller has taken it out of the index.
    fn drop_entry(&self, entry: &Entry) {
        let mut st = lock(&entry.state);
        st.evicted = true;
        if st.present_bytes > 0 {
            self.emit(CacheEvent::Dropped {
                path: entry.path.clone(),
                version: entry.version,
            });
        }
        self.used.fetch_sub(st.present_bytes, Ordering::Relaxed);
        st.present_bytes = 0;
        for c in st.chunks.iter_mut() {
            if matches!(c, Chunk::Present { .. }) {
                *c = Chunk::Absent;
            }
        }
        drop(st);
        // The tombstone goes first: a crash in between leaves data without a header (deleted
        // at start), never a header for deleted or replaced data.
        if let Err(e) = self.journal.drop_path(&entry.path) {
            tracing::warn!(path = %entry.path, error = %e, "could not record a dropped entry");
        }
        let _ = fs::remove_file(&entry.data_path);
    }

    /// Reserves room for `bytes` of new chunks of `for_entry`, evicting least recently used
    /// entries that are not open and not being filled. `false`: nothing more can be evicted, the
    /// caller serves the read uncached.
    pub fn reserve(&self, for_entry: &Entry, bytes: u64) -> bool {
        if bytes > self.capacity {
            return false;
        }
        let mut index = lock(&self.index);
        if self.used.load(Ordering::Relaxed) + bytes <= self.capacity {
            self.used.fetch_add(bytes, Ordering::Relaxed);
            return true;
        }
        let mut victims: Vec<Arc<Entry>> = index
            .entries
            .values()
            .filter(|e| {
                !std::ptr::eq(e.as_ref(), for_entry)
                    && e.pins.load(Ordering::Relaxed) == 0
                    && !e.keep.load(Ordering::Relaxed)
            })
            .filter(|e| {
                let st = lock(&e.state);
                st.present_bytes > 0 && !st.chunks.contains(&Chunk::Filling)
            })
            .cloned()
            .collect();
        victims.sort_by_key(|e| e.last_use.load(Ordering::Relaxed));
        for victim in victims {
            if self.used.load(Ordering::Relaxed) + bytes <= self.capacity {
                break;
            }
            tracing::debug!(path = %victim.path, "evicting");
            index.remove(&victim.path);
            self.drop_entry(&victim);
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        if self.used.load(Ordering::Relaxed) + bytes <= self.capacity {
            self.used.fetch_add(bytes, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Takes a finished file (on the cache's file system) in as the complete, kept entry `path`:
    /// a produced file becomes an object peers pull like any cached file. Its bytes count
    /// against capacity, evicting others, but are taken in even if nothing can be evicted.
    pub fn adopt(
        &self,
        path: &str,
        version: Version,
        file: &Path,
    ) -> Result<Arc<Entry>, CacheError> {
        let entry = self.entry(path, version)?;
        let mut crcs = Vec::with_capacity(entry.chunk_count() as usize);
        {
            let src = File::open(file)?;
            let mut buf = vec![0; self.chunk_size as usize];
            for i in 0..entry.chunk_count() {
                let b = &mut buf[..entry.chunk_len(i) as usize];
                src.read_exact_at(b, i * self.chunk_size)?;
                crcs.push(crc32c::crc32c(b));
            }
        }
        if !self.reserve(&entry, version.size) {
            self.used.fetch_add(version.size, Ordering::Relaxed);
        }
        // The file replaces the empty data file; the entry reopens it.
        fs::rename(file, &entry.data_path)?;
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&entry.data_path)?;
        let adopted = Arc::new(Entry::new(
            EntryFiles {
                path: entry.path.clone(),
                version,
                chunk_size: self.chunk_size,
                data,
                data_path: entry.data_path.clone(),
                journal: self.journal.clone(),
            },
            crcs.into_iter()
                .map(|crc| Chunk::Present {
                    crc,
                    verified: true,
                })
                .collect(),
            self.next_tick(),
        ));
        adopted.keep.store(true, Ordering::Relaxed);
        lock(&self.index).insert(adopted.clone());
        adopted.persist()?;
        self.emit(CacheEvent::Complete {
            path: path.to_string(),
            version,
        });
        Ok(adopted)
    }

    /// Deletes the entry `path` (at `version`) now, whoever holds it open.
    pub fn forget(&self, path: &str, version: Version) {
        let mut index = lock(&self.index);
        if index
            .entries
            .get(path)
            .is_some_and(|e| e.version == version)
        {
            let e = index.remove(path).expect("present");
            self.drop_entry(&e);
        }
    }

    /// Returns a reservation (or a present chunk's bytes) to the free pool.
    pub fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Opens the data file of a logged header, checking that the two belong together.
fn check_entry(header: &Header, data_path: &Path, chunk_size: u64) -> Result<File, CacheError> {
    if u64::from(header.chunk_size) != chunk_size {
        return Err(CacheError::Corrupt(format!(
            "chunk size {} differs from the configured {chunk_size}",
            header.chunk_size
        )));
    }
    if header.chunks.len() as u64 != header.version.size.div_ceil(chunk_size) {
        return Err(CacheError::Corrupt(
            "chunk count does not match size".into(),
        ));
    }
    let data = OpenOptions::new().read(true).write(true).open(data_path)?;
    if data.metadata()?.len() != header.version.size {
        return Err(CacheError::Corrupt("data file size does not match".into()));
    }
    Ok(data)
}

/// What an entry is a copy of, and where it lives.
struct EntryFiles {
    path: String,
    version: Version,
    chunk_size: u64,
    data: File,
    data_path: PathBuf,
    journal: Arc<Journal>,
}

impl Entry {
    /// An entry holding `chunks` (its present bytes follow from them), last used at `tick`.
    fn new(files: EntryFiles, chunks: Vec<Chunk>, tick: u64) -> Entry {
        let EntryFiles {
            path,
            version,
            chunk_size,
            data,
            data_path,
            journal,
        } = files;
        let present_bytes = chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c, Chunk::Present { .. }))
            .map(|(i, _)| chunk_len(version.size, chunk_size, i as u64))
            .sum();
        Entry {
            path,
            version,
            chunk_size,
            data,
            data_path,
            direct: Default::default(),
            journal,
            state: Mutex::new(State {
                chunks,
                present_bytes,
                evicted: false,
            }),
            filled: Condvar::new(),
            pins: AtomicU32::new(0),
            last_use: AtomicU64::new(tick),
            fetched: AtomicBool::new(false),
            pulled: AtomicBool::new(false),
            keep: AtomicBool::new(false),
        }
    }
}

/// An entry reloaded at start: its chunks are present as logged, but unverified.
fn reloaded_entry(
    header: Header,
    data: File,
    data_path: PathBuf,
    chunk_size: u64,
    journal: Arc<Journal>,
) -> Entry {
    let chunks = header
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
    let files = EntryFiles {
        path: header.path,
        version: header.version,
        chunk_size,
        data,
        data_path,
        journal,
    };
    Entry::new(files, chunks, 0)
}

fn chunk_len(size: u64, chunk_size: u64, idx: u64) -> u64 {
    chunk_size.min(size - idx * chunk_size)
}

/// (total, available to unprivileged users) bytes of the filesystem holding `dir`.
pub fn fs_space(dir: &Path) -> io::Result<(u64, u64)> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs is plain data, fully written by the call on success.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize))
}

/// Bytes read from the cache for a reader: a view of a mapping of the data file (the FUSE
/// reply is then written from the page cache, with no copy into a buffer of ours first), or a
/// buffer of their own.
pub enum ReadBytes {
    Owned(Vec<u8>),
    Mapped(Arc<Mapping>, Range<usize>),
}

impl std::ops::Deref for ReadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBytes::Owned(v) => v,
            ReadBytes::Mapped(m, r) => &m.bytes()[r.clone()],
        }
    }
}

impl std::fmt::Debug for ReadBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadBytes({} bytes)", self.len())
    }
}

impl PartialEq<[u8]> for ReadBytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for ReadBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

/// A read-only shared mapping of a whole data file. Data files are never truncated while an
/// entry uses them (a new version or a dropped entry gets a new file; the old one is only
/// unlinked), so reading any byte of the mapping is safe.
pub struct Mapping {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only memory owned by this value until Drop.
unsafe impl Send for Mapping {}
// SAFETY: as above: shared reads only.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize) -> Option<Mapping> {
        if len == 0 {
            return None;
        }
        // SAFETY: a read-only shared mapping of `len` bytes of a file we hold open; the result
        // is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then_some(Mapping {
            ptr: ptr as *const u8,
            len,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes until Drop (see the type's comment).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in new(), once; no slice of it outlives `self`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// The outcome of claiming a range of chunks.
pub struct Claim {
    /// Chunks this caller must fill (now `Filling`).
    pub mine: Vec<u64>,
    /// Whether other fillers hold chunks of the range.
    pub others: bool,
}

impl Entry {
    pub fn chunk_count(&self) -> u64 {
        self.version.size.div_ceil(self.chunk_size)
    }

    pub fn chunk_len(&self, idx: u64) -> u64 {
        chunk_len(self.version.size, self.chunk_size, idx)
    }

    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Chunks covering bytes `[offset, offset + len)`, clipped to the file.
    pub fn chunks_for(&self, offset: u64, len: u64) -> Range<u64> {
        let end = (offset + len).min(self.version.size);
        if offset >= end {
            return 0..0;
        }
        offset / self.chunk_size..end.div_ceil(self.chunk_size)
    }

    fn touch(&self, tick: u64) {
        self.last_use.store(tick, Ordering::Relaxed);
    }

    /// An open handle holds the entry: it is not evicted until `unpin`.
    pub fn pin(&self, cache: &Cache) {
        self.pins.fetch_add(1, Ordering::Relaxed);
        self.touch(cache.next_tick());
    }

    pub fn unpin(&self) {
        self.pins.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn is_evicted(&self) -> bool {
        lock(&self.state).evicted
    }

    /// Claims every absent chunk of `range` for the caller to fill.
    pub fn claim(&self, range: Range<u64>) -> Claim {
        let mut st = lock(&self.state);
        let mut claim = Claim {
            mine: Vec::new(),
            others: false,
        };
        for i in range {
            match st.chunks[i as usize] {
                Chunk::Absent => {
                    st.chunks[i as usize] = Chunk::Filling;
                    claim.mine.push(i);
                }
                Chunk::Filling => claim.others = true,
                Chunk::Present { .. } => {}
            }
        }
        claim
    }

    /// Marks a claimed chunk present with the checksum of the bytes just written.
    /// Returns false if the entry left the cache meanwhile (the caller's reservation is void).
    pub fn complete(&self, idx: u64, crc: u32) -> bool {
        let mut st = lock(&self.state);
        let kept = !st.evicted;
        st.chunks[idx as usize] = if kept {
            st.present_bytes += self.chunk_len(idx);
            Chunk::Present {
                crc,
                verified: true,
            }
        } else {
            Chunk::Absent
        };
        self.filled.notify_all();
        kept
    }

    /// Gives back a claimed chunk that could not be filled; waiters retry it themselves.
    pub fn abandon(&self, idx: u64) {
        let mut st = lock(&self.state);
        st.chunks[idx as usize] = Chunk::Absent;
        self.filled.notify_all();
    }

    /// Waits (bounded) until no chunk of `range` is being filled by someone else.
    pub fn wait_fills(&self, range: Range<u64>) -> Result<(), CacheError> {
        let deadline = Instant::now() + FILL_WAIT;
        let mut st = lock(&self.state);
        while st.chunks[range.start as usize..range.end as usize].contains(&Chunk::Filling) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CacheError::FillTimeout(self.path.clone()));
            }
            st = self
                .filled
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    pub fn all_present(&self, range: Range<u64>) -> bool {
        let st = lock(&self.state);
        st.chunks[range.start as usize..range.end as usize]
            .iter()
            .all(|c| matches!(c, Chunk::Present { .. }))
    }

    pub fn is_complete(&self) -> bool {
        self.all_present(0..self.chunk_count())
    }

    /// Whether every chunk is present and verified in this daemon's lifetime.
    pub fn is_verified(&self) -> bool {
        let st = lock(&self.state);
        st.chunks
            .iter()
            .all(|c| matches!(c, Chunk::Present { verified: true, .. }))
    }

    /// Writes chunk bytes at their offset in the data file.
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.data.write_all_at(bytes, offset)
    }

    /// Verifies every present chunk of `range` not yet verified in this daemon's lifetime.
    /// A chunk whose bytes do not match its checksum is dropped (its bytes released) so the
    /// caller refetches it. Returns whether the whole range is present and verified.
    pub fn verify(&self, cache: &Cache, range: Range<u64>) -> Result<bool, CacheError> {
        let mut all_good = true;
        let mut buf = Vec::new();
        for idx in range {
            let crc = match lock(&self.state).chunks[idx as usize] {
                Chunk::Present { verified: true, .. } => continue,
                Chunk::Present {
                    crc,
                    verified: false,
                } => crc,
                _ => {
                    all_good = false;
                    continue;
                }
            };
            let len = self.chunk_len(idx) as usize;
            buf.resize(len, 0);
            self.data.read_exact_at(&mut buf, idx * self.chunk_size)?;
            all_good &= self.judge(cache, idx, crc, &buf);
        }
        if !all_good {
            self.persist()?;
        }
        Ok(all_good)
    }

    /// Marks chunk `idx` verified if `bytes` (just read from the data file) match the checksum
    /// `crc` it had when read, or drops it (bytes released, refetched by its next reader).
    fn judge(&self, cache: &Cache, idx: u64, crc: u32, bytes: &[u8]) -> bool {
        let mut st = lock(&self.state);
        let unverified = Chunk::Present {
            crc,
            verified: false,
        };
        // Only act if nobody changed the chunk while we read it.
        if st.chunks[idx as usize] != unverified {
            return matches!(st.chunks[idx as usize], Chunk::Present { .. });
        }
        if crc32c::crc32c(bytes) == crc {
            st.chunks[idx as usize] = Chunk::Present {
                crc,
                verified: true,
            };
            return true;
        }
        tracing::warn!(path = %self.path, chunk = idx, "checksum mismatch, refetching");
        cache
            .stats
            .checksum_failures
            .fetch_add(1, Ordering::Relaxed);
        st.chunks[idx as usize] = Chunk::Absent;
        st.present_bytes -= bytes.len() as u64;
        cache.release(bytes.len() as u64);
        false
    }

    /// Reads whole present chunks at `offset` for a peer into `room[..len]`, verifying those
    /// not yet verified from the same bytes: one read instead of two after a restart.
    /// `Ok(false)`: a chunk is absent or failed its checksum (then dropped). `room` may be
    /// written past `len` (a direct read rounds up to whole disk blocks).
    pub fn read_verified(
        &self,
        cache: &Cache,
        offset: u64,
        room: &mut [u8],
        len: usize,
    ) -> Result<bool, CacheError> {
        let range = self.chunks_for(offset, len as u64);
        let whole = offset.is_multiple_of(self.chunk_size)
            && range.clone().map(|i| self.chunk_len(i)).sum::<u64>() == len as u64;
        if !whole {
            // Partial chunks cannot be checked from their own bytes.
            if !self.all_present(range.clone()) || !self.verify(cache, range)? {
                return Ok(false);
            }
            self.data.read_exact_at(&mut room[..len], offset)?;
            return Ok(true);
        }
        let expected: Vec<Chunk> = {
            let st = lock(&self.state);
            range.clone().map(|i| st.chunks[i as usize]).collect()
        };
        if !expected.iter().all(|c| matches!(c, Chunk::Present { .. })) {
            return Ok(false);
        }
        self.read_for_peer(offset, room, len)?;
        let buf = &room[..len];
        let mut all_good = true;
        let mut at = 0;
        for (idx, chunk) in range.zip(expected) {
            let len = self.chunk_len(idx) as usize;
            if let Chunk::Present {
                crc,
                verified: false,
            } = chunk
            {
                all_good &= self.judge(cache, idx, crc, &buf[at..at + len]);
            }
            at += len;
        }
        if !all_good {
            self.persist()?;
        }
        Ok(all_good)
    }

    /// The stored crc32c of the chunk that is exactly `[offset, offset + len)`, if present.
    pub fn chunk_crc(&self, offset: u64, len: u64) -> Option<u32> {
        let idx = offset / self.chunk_size;
        if !offset.is_multiple_of(self.chunk_size)
            || idx >= self.chunk_count()
            || self.chunk_len(idx) != len
        {
            return None;
        }
        match lock(&self.state).chunks[idx as usize] {
            Chunk::Present { crc, .. } => Some(crc),
            _ => None,
        }
    }

    /// Reads `room[..len]` at `offset` for a peer. Bytes already in the page cache are copied
    /// from it; bytes that are not are read from the disk straight into `room` (O_DIRECT), not
    /// through the page cache: on a node serving its cache to others, that copy costs as much
    /// CPU as the whole transfer (`perf` of `scripts/bench_cluster.sh`), and the pages would
    /// only push the node's own working set out.
    fn read_for_peer(&self, offset: u64, room: &mut [u8], len: usize) -> io::Result<()> {
        if self.all_cached(offset, len) == Some(false) && self.read_direct(offset, room, len) {
            return Ok(());
        }
        self.data.read_exact_at(&mut room[..len], offset)
    }

    /// Reads at least `room[..len]` at `offset` with O_DIRECT, rounded up to whole blocks;
    /// `false` where that is impossible (unaligned, refused) or failed: read another way.
    fn read_direct(&self, offset: u64, room: &mut [u8], len: usize) -> bool {
        const BLOCK: usize = 4096;
        let padded = len.next_multiple_of(BLOCK);
        let aligned = offset.is_multiple_of(BLOCK as u64)
            && (room.as_ptr() as usize).is_multiple_of(BLOCK)
            && padded <= room.len();
        let Some(direct) = self.direct_file().filter(|_| aligned) else {
            return false;
        };
        // A short count only at the end of the file, past `len`.
        let mut done = 0;
        while done < len {
            match direct.read_at(&mut room[done..padded], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        done >= len
    }

    /// Whether every page of `[offset, offset + len)` of the data file is in the page cache,
    /// asked without reading anything (`cachestat(2)`, Linux >= 6.5; `None` where unsupported).
    /// A probing read would start readahead into the page cache, the very copy to avoid.
    fn all_cached(&self, offset: u64, len: usize) -> Option<bool> {
        /// cachestat's number on every architecture (numbers from 424 on are shared).
        const SYS_CACHESTAT: libc::c_long = 451;
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Stat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        let range = Range {
            off: offset,
            len: len as u64,
        };
        let mut stat = Stat::default();
        // SAFETY: both pointers are to live structs with the kernel's layout, for the call only.
        let r = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                self.data.as_raw_fd(),
                &range as *const Range,
                &mut stat as *mut Stat,
                0,
            )
        };
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        (r == 0).then(|| stat.nr_cache >= (len as u64).div_ceil(page))
    }

    /// The data file opened for direct I/O, once; `None` where the file system refuses it.
    fn direct_file(&self) -> Option<&File> {
        self.direct
            .get_or_init(|| {
                use std::os::unix::fs::OpenOptionsExt;
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&self.data_path)
                    .ok()
            })
            .as_ref()
    }

    /// Maps the whole data file for reading (`None` if the system refuses): readers that keep
    /// it (an open handle of a large file) are then served without copying.
    pub fn map(&self) -> Option<Arc<Mapping>> {
        Mapping::new(&self.data, self.version.size as usize).map(Arc::new)
    }

    /// Bytes `[offset, offset + len)` of present chunks (the caller has ensured and verified
    /// them), from `map` if given.
    pub fn read_bytes(
        &self,
        offset: u64,
        len: usize,
        map: Option<&Arc<Mapping>>,
    ) -> io::Result<ReadBytes> {
        if let Some(m) = map.filter(|m| offset as usize + len <= m.len) {
            return Ok(ReadBytes::Mapped(
                m.clone(),
                offset as usize..offset as usize + len,
            ));
        }
        let mut buf = vec![0; len];
        self.data.read_exact_at(&mut buf, offset)?;
        Ok(ReadBytes::Owned(buf))
    }

    /// A handle on the data file, for the kernel to read directly (passthrough).
    pub fn data_file(&self) -> &File {
        &self.data
    }

    /// The header recording this entry's present chunks; `None` once it left the cache.
    fn header(&self) -> Option<Header> {
        let st = lock(&self.state);
        if st.evicted {
            return None;
        }
        Some(Header {
            chunk_size: self.chunk_size as u32,
            version: self.version,
            path: self.path.clone(),
            chunks: st
                .chunks
                .iter()
                .map(|c| match c {
                    Chunk::Present { crc, .. } => Some(*crc),
                    _ => None,
                })
                .collect::<Vec<ChunkRecord>>(),
        })
    }

    /// Records the present chunks in the cache's log, unless the entry left the cache.
    pub fn persist(&self) -> Result<(), CacheError> {
        Ok(self.journal.put(|| self.header())?)
    }
}

#[cfg(test)]
mod tests;
