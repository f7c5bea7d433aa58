//! The node-local NVMe cache: one sparse `.dat` file per cached source file (same size, same
//! offsets, so the kernel can read it directly in passthrough mode) plus a checksummed header
//! saying which chunks are present (see [`format`]), recorded in one log for the whole cache
//! (see [`journal`]).
//!
//! Chunks move Absent -> Filling (claimed by one filler: single flight) -> Present. A present
//! chunk is *verified* once per daemon lifetime against its crc32c before it is served; chunks
//! reloaded after a restart start unverified. Capacity is accounted in bytes of present (or
//! reserved) chunks; least recently used entries that nobody holds open are evicted whole.

pub mod files;
pub mod format;
pub mod journal;

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use files::{DataFiles, Mode};
use format::{ChunkRecord, Header};
use journal::{Journal, Record};

use crate::core::sync::lock;
use crate::core::{Version, path_hash};
use crate::stats::Stats;

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
    /// Data files kept open while idle (see [`files`]).
    pub open_files: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Absent,
    Filling,
    Present { crc: u32, verified: bool },
}

/// An entry's chunks: most training samples are one chunk, kept inline (a million cached files
/// should not mean a million extra allocations).
enum Chunks {
    One([Chunk; 1]),
    Many(Box<[Chunk]>),
}

impl From<Vec<Chunk>> for Chunks {
    fn from(v: Vec<Chunk>) -> Chunks {
        match v[..] {
            [one] => Chunks::One([one]),
            _ => Chunks::Many(v.into_boxed_slice()),
        }
    }
}

impl std::ops::Deref for Chunks {
    type Target = [Chunk];
    fn deref(&self) -> &[Chunk] {
        match self {
            Chunks::One(c) => c,
            Chunks::Many(c) => c,
        }
    }
}

impl std::ops::DerefMut for Chunks {
    fn deref_mut(&mut self) -> &mut [Chunk] {
        match self {
            Chunks::One(c) => c,
            Chunks::Many(c) => c,
        }
    }
}

struct State {
    chunks: Chunks,
    present_bytes: u64,
    /// Set when the entry leaves the index (evicted or replaced): nothing is persisted again,
    /// and its data file is never opened again (its slot may hold another entry's file).
    evicted: bool,
    /// Reloaded at start and its data file not looked at yet (see `Entry::file`).
    unchecked: bool,
}

/// What every entry of one cache shares.
struct Shared {
    dir: PathBuf,
    chunk_size: u64,
    journal: Journal,
    files: Arc<DataFiles>,
    /// Bytes of present chunks plus reservations of fills in flight.
    used: AtomicU64,
}

impl Shared {
    /// The data file of the slot `hash`: one directory level keeps directories small.
    fn data_path(&self, hash: u64) -> PathBuf {
        self.dir
            .join("data")
            .join(format!("{:02x}", hash >> 56))
            .join(format!("{hash:016x}.dat"))
    }
}

/// One cached file. Held by open handles (`pin`) and by the index. It owns no descriptor: its
/// data file is opened through the cache's bounded [`DataFiles`] when used.
pub struct Entry {
    pub path: Box<str>,
    pub version: Version,
    /// Unique for the cache's lifetime: the key of its open data files.
    id: u64,
    shared: Arc<Shared>,
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

/// The entries by slot (the hash of their path, which names their data file): a slot holds one
/// entry at a time (a colliding newcomer takes it), so one map finds both.
#[derive(Default)]
struct Index {
    slots: HashMap<u64, Arc<Entry>>,
}

impl Index {
    fn get(&self, path: &str) -> Option<&Arc<Entry>> {
        self.slots
            .get(&path_hash(path))
            .filter(|e| *e.path == *path)
    }

    fn insert(&mut self, entry: Arc<Entry>) {
        self.slots.insert(path_hash(&entry.path), entry);
    }

    fn remove(&mut self, path: &str) -> Option<Arc<Entry>> {
        let hash = path_hash(path);
        if *self.slots.get(&hash)?.path != *path {
            return None;
        }
        self.slots.remove(&hash)
    }

    fn in_slot(&self, hash: u64) -> Option<Arc<Entry>> {
        self.slots.get(&hash).cloned()
    }

    fn entries(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.slots.values()
    }
}

pub struct Cache {
    shared: Arc<Shared>,
    capacity: u64,
    index: Mutex<Index>,
    tick: AtomicU64,
    next_id: AtomicU64,
    stats: Arc<Stats>,
    /// Told when a file becomes complete or leaves the cache (the locator publishes these).
    events: std::sync::OnceLock<crossbeam_channel::Sender<CacheEvent>>,
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

/// In a cache of more than [`SCAN_CHEAP`] entries, eviction frees this fraction of the capacity
/// beyond what a reservation needs: the scan for victims visits every entry, so with millions
/// of entries it must not run for every new file.
const EVICT_SLACK_DIVISOR: u64 = 64;
const SCAN_CHEAP: usize = 4096;

impl Cache {
    /// Opens (or creates) the cache directory, takes its lock and reloads every entry its log
    /// records, without touching their data files (a million entries load in moments; each
    /// data file is checked when first opened, and its chunks when first served). The log is
    /// rewritten with the live headers only. Data files no header names (a crash's leftovers)
    /// are deleted by [`Cache::sweep_orphans`], which the daemon runs in the background.
    pub fn open(config: &CacheConfig, stats: Arc<Stats>) -> Result<Cache, CacheError> {
        let data_dir = config.dir.join("data");
        // Every data subdirectory exists from the start: no mkdir per new entry.
        for sub in 0..=0xffu64 {
            fs::create_dir_all(data_dir.join(format!("{sub:02x}")))?;
        }
        // Only the daemon reads the cache: other local users must not read each other's
        // cached files (the kernel's passthrough reads use the daemon's credentials).
        fs::set_permissions(&config.dir, fs::Permissions::from_mode(0o700))?;
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
        // The live header of each data file (slot): records are replayed in order, a header
        // takes its slot (a colliding path's newer header wins, as the running cache did), a
        // tombstone empties its path's slot.
        let mut by_slot: HashMap<u64, Header> = HashMap::new();
        journal::replay(&log_path, |record| match record {
            Record::Put(h) => {
                by_slot.insert(path_hash(&h.path), h);
            }
            Record::Drop(path) => {
                let hash = path_hash(&path);
                if by_slot.get(&hash).is_some_and(|h| h.path == path) {
                    by_slot.remove(&hash);
                }
            }
        })?;
        by_slot.retain(|_, header| match check_header(header, chunk_size) {
            Ok(()) => true,
            Err(e) => {
                // Its data file is left to the orphan sweep.
                tracing::warn!(path = %header.path, error = %e, "dropping cache entry");
                false
            }
        });
        let journal = Journal::create(&log_path, by_slot.values().cloned())?;
        let shared = Arc::new(Shared {
            dir: config.dir.clone(),
            chunk_size,
            journal,
            files: Arc::new(DataFiles::new(config.open_files)),
            used: AtomicU64::new(0),
        });
        let mut index = Index::default();
        index.slots.reserve(by_slot.len());
        let mut used = 0;
        let mut next_id = 0;
        for header in by_slot.into_values() {
            next_id += 1;
            let entry = reloaded_entry(header, next_id, shared.clone());
            used += lock(&entry.state).present_bytes;
            index.insert(Arc::new(entry));
        }
        shared.used.store(used, Ordering::Relaxed);
        let capacity = match config.capacity {
            Some(c) => c,
            None => {
                let (total, avail) = fs_space(&config.dir)?;
                (avail + used).saturating_sub(total / 10)
            }
        };
        // Loading a million headers leaves tens of MiB of freed memory behind: give it back.
        // SAFETY: malloc_trim only releases free heap memory; it touches no live allocation.
        unsafe { libc::malloc_trim(0) };
        tracing::info!(
            entries = index.slots.len(),
            used,
            capacity,
            open_files = config.open_files,
            "cache loaded"
        );
        Ok(Cache {
            shared,
            capacity,
            index: Mutex::new(index),
            tick: AtomicU64::new(1),
            next_id: AtomicU64::new(next_id + 1),
            stats,
            events: std::sync::OnceLock::new(),
            _lock: lock_file,
        })
    }

    /// Deletes every data file that no entry owns (a fill cut short by a crash, a dropped
    /// entry, anything foreign) and returns how many. Safe while the cache serves: a slot's
    /// file is only judged under the index lock, under which new entries create theirs.
    pub fn sweep_orphans(&self) -> io::Result<u64> {
        let mut removed = 0;
        for sub in fs::read_dir(self.shared.dir.join("data"))? {
            let sub = sub?.path();
            if !sub.is_dir() {
                continue;
            }
            for file in fs::read_dir(&sub)? {
                let file = file?.path();
                let name = file.file_name().unwrap_or_default().to_string_lossy();
                let slot = name
                    .strip_suffix(".dat")
                    .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                    .filter(|hash| self.shared.data_path(*hash) == file);
                let index = lock(&self.index);
                if slot.is_none_or(|hash| !index.slots.contains_key(&hash)) {
                    let _ = fs::remove_file(&file);
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            tracing::info!(removed, "deleted cache data files no entry owns");
        }
        Ok(removed)
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
        index.get(path).filter(|e| e.version == version).cloned()
    }

    /// Every complete entry (to publish after a restart).
    pub fn complete_entries(&self) -> Vec<(String, Version)> {
        let index = lock(&self.index);
        index
            .entries()
            .filter(|e| e.is_complete())
            .map(|e| (e.path.to_string(), e.version))
            .collect()
    }

    pub fn chunk_size(&self) -> u64 {
        self.shared.chunk_size
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn used_bytes(&self) -> u64 {
        self.shared.used.load(Ordering::Relaxed)
    }

    /// Data files held open while idle.
    pub fn open_files(&self) -> u64 {
        self.shared.files.open_count()
    }

    /// The cache's descriptor LRU: other opens (backing files) retry through it when the
    /// process runs out of descriptors.
    pub fn files(&self) -> Arc<DataFiles> {
        self.shared.files.clone()
    }

    /// Number of entries holding at least one present chunk.
    pub fn cached_files(&self) -> u64 {
        let index = lock(&self.index);
        index
            .entries()
            .filter(|e| lock(&e.state).present_bytes > 0)
            .count() as u64
    }

    /// The entry for `path` at `version`, created empty if absent. A cached copy of another
    /// version is dropped (its open handles keep reading their own, now unlinked, copy).
    pub fn entry(&self, path: &str, version: Version) -> Result<Arc<Entry>, CacheError> {
        let mut index = lock(&self.index);
        if let Some(e) = index.get(path) {
            if e.version == version {
                e.touch(self.next_tick());
                return Ok(e.clone());
            }
            let old = index.remove(path).expect("present");
            self.drop_entry(&old);
        }
        if self.shared.journal.wants_rewrite() {
            self.rewrite_journal(&index);
        }
        let hash = path_hash(path);
        let data_path = self.shared.data_path(hash);
        // A different path with the same hash: the newcomer takes the slot.
        if let Some(other) = index.in_slot(hash) {
            index.remove(&other.path);
            self.drop_entry(&other);
        }
        // A new file, never one an old copy's open handles may still read: a leftover is
        // unlinked first. Usually there is none, so one name lookup, not two.
        let files = &self.shared.files;
        let create = || {
            files.open_retrying(|| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&data_path)
            })
        };
        let data = match create() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&data_path)?;
                create()?
            }
            r => r?,
        };
        data.set_len(version.size)?;
        let n = version.size.div_ceil(self.shared.chunk_size) as usize;
        let entry = Arc::new(Entry::new(
            path.to_string(),
            version,
            self.next_id(),
            self.shared.clone(),
            vec![Chunk::Absent; n],
            self.next_tick(),
        ));
        // The new file is written next: keep it open.
        files.insert(entry.id, Mode::ReadWrite, data);
        index.insert(entry.clone());
        Ok(entry)
    }

    fn next_tick(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Rewrites the log with the live headers only (it has grown well past them).
    fn rewrite_journal(&self, index: &Index) {
        let entries: Vec<Arc<Entry>> = index.entries().cloned().collect();
        let r = self
            .shared
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
                path: entry.path.to_string(),
                version: entry.version,
            });
        }
        self.shared
            .used
            .fetch_sub(st.present_bytes, Ordering::Relaxed);
        st.present_bytes = 0;
        for c in st.chunks.iter_mut() {
            if matches!(c, Chunk::Present { .. }) {
                *c = Chunk::Absent;
            }
        }
        drop(st);
        self.shared.files.close(entry.id);
        // The tombstone goes first: a crash in between leaves data without a header (deleted
        // by the orphan sweep), never a header for deleted or replaced data.
        if let Err(e) = self.shared.journal.drop_path(&entry.path) {
            tracing::warn!(path = %entry.path, error = %e, "could not record a dropped entry");
        }
        let _ = fs::remove_file(entry.data_path());
    }

    /// Reserves room for `bytes` of new chunks of `for_entry`, evicting least recently used
    /// entries that are not open and not being filled. `false`: nothing more can be evicted, the
    /// caller serves the read uncached.
    pub fn reserve(&self, for_entry: &Entry, bytes: u64) -> bool {
        if bytes > self.capacity {
            return false;
        }
        let mut index = lock(&self.index);
        if self.shared.used.load(Ordering::Relaxed) + bytes <= self.capacity {
            self.shared.used.fetch_add(bytes, Ordering::Relaxed);
            return true;
        }
        // In a large cache, free a little more than needed, so the next fills need no scan.
        let slack = if index.slots.len() > SCAN_CHEAP {
            self.capacity / EVICT_SLACK_DIVISOR
        } else {
            0
        };
        let target = self.capacity.saturating_sub(bytes + slack);
        let mut victims: Vec<(u64, Arc<Entry>)> = index
            .entries()
            .filter(|e| {
                !std::ptr::eq(e.as_ref(), for_entry)
                    && e.pins.load(Ordering::Relaxed) == 0
                    && !e.keep.load(Ordering::Relaxed)
            })
            .filter(|e| {
                let st = lock(&e.state);
                st.present_bytes > 0 && !st.chunks.contains(&Chunk::Filling)
            })
            .map(|e| (e.last_use.load(Ordering::Relaxed), e.clone()))
            .collect();
        victims.sort_unstable_by_key(|(tick, _)| *tick);
        for (_, victim) in victims {
            if self.shared.used.load(Ordering::Relaxed) <= target {
                break;
            }
            tracing::debug!(path = %victim.path, "evicting");
            index.remove(&victim.path);
            self.drop_entry(&victim);
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        if self.shared.used.load(Ordering::Relaxed) + bytes <= self.capacity {
            self.shared.used.fetch_add(bytes, Ordering::Relaxed);
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
        let chunk_size = self.shared.chunk_size;
        let mut crcs = Vec::with_capacity(entry.chunk_count() as usize);
        {
            let src = self.shared.files.open_retrying(|| File::open(file))?;
            let mut buf = vec![0; chunk_size as usize];
            for i in 0..entry.chunk_count() {
                let b = &mut buf[..entry.chunk_len(i) as usize];
                src.read_exact_at(b, i * chunk_size)?;
                crcs.push(crc32c::crc32c(b));
            }
        }
        if !self.reserve(&entry, version.size) {
            self.shared.used.fetch_add(version.size, Ordering::Relaxed);
        }
        // The file replaces the empty data file, and a new entry (a new id: its descriptor is
        // opened anew) replaces the empty one.
        fs::rename(file, entry.data_path())?;
        lock(&entry.state).evicted = true;
        self.shared.files.close(entry.id);
        let adopted = Arc::new(Entry::new(
            entry.path.to_string(),
            version,
            self.next_id(),
            self.shared.clone(),
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
        if index.get(path).is_some_and(|e| e.version == version) {
            let e = index.remove(path).expect("present");
            self.drop_entry(&e);
        }
    }

    /// Returns a reservation (or a present chunk's bytes) to the free pool.
    pub fn release(&self, bytes: u64) {
        self.shared.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Checks that a logged header fits this cache (its data file is checked when first opened).
fn check_header(header: &Header, chunk_size: u64) -> Result<(), CacheError> {
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
    Ok(())
}

impl Entry {
    /// An entry holding `chunks` (its present bytes follow from them), last used at `tick`.
    fn new(
        path: String,
        version: Version,
        id: u64,
        shared: Arc<Shared>,
        chunks: Vec<Chunk>,
        tick: u64,
    ) -> Entry {
        let present_bytes = chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| matches!(c, Chunk::Present { .. }))
            .map(|(i, _)| chunk_len(version.size, shared.chunk_size, i as u64))
            .sum();
        Entry {
            path: path.into_boxed_str(),
            version,
            id,
            shared,
            state: Mutex::new(State {
                chunks: chunks.into(),
                present_bytes,
                evicted: false,
                unchecked: false,
            }),
            filled: Condvar::new(),
            pins: AtomicU32::new(0),
            last_use: AtomicU64::new(tick),
            fetched: AtomicBool::new(false),
            pulled: AtomicBool::new(false),
            keep: AtomicBool::new(false),
        }
    }

    fn data_path(&self) -> PathBuf {
        self.shared.data_path(path_hash(&self.path))
    }

    /// The entry's data file opened as `mode`, from the cache's LRU or opened now. An entry
    /// that left the cache never reopens its path (another entry's file may be there now): the
    /// open happens under the entry's lock, and leaving the cache sets `evicted` under it before
    /// the path is unlinked. A reloaded entry's file is checked on first open: a missing or
    /// resized file (changed behind the cache's back) empties the entry, whose chunks are then
    /// fetched again.
    fn file(&self, mode: Mode) -> io::Result<Arc<File>> {
        let files = &self.shared.files;
        // A file in the LRU was opened while the entry was live: it is this entry's.
        if let Some(f) = files.cached(self.id, mode) {
            return Ok(f);
        }
        let mut st = lock(&self.state);
        if st.evicted {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        let path = self.data_path();
        let mut emptied = false;
        if st.unchecked {
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
                st.chunks.fill(Chunk::Absent);
                st.present_bytes = 0;
                emptied = true;
            }
            st.unchecked = false;
        }
        let file = files.open(self.id, &path, mode)?;
        drop(st);
        if emptied {
            self.persist().map_err(io::Error::other)?;
        }
        Ok(file)
    }
}

/// An entry reloaded at start: its chunks are present as logged, but unverified, and its data
/// file unchecked.
fn reloaded_entry(header: Header, id: u64, shared: Arc<Shared>) -> Entry {
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
    let entry = Entry::new(header.path, header.version, id, shared, chunks, 0);
    lock(&entry.state).unchecked = true;
    entry
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
                return Err(CacheError::FillTimeout(self.path.to_string()));
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
        self.file(Mode::ReadWrite)?.write_all_at(bytes, offset)
    }

    /// Verifies every present chunk of `range` not yet verified in this daemon's lifetime.
    /// A chunk whose bytes do not match its checksum is dropped (its bytes released) so the
    /// caller refetches it. Returns whether the whole range is present and verified.
    pub fn verify(&self, cache: &Cache, range: Range<u64>) -> Result<bool, CacheError> {
        let mut all_good = true;
        let mut buf = Vec::new();
        let mut data = None;
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
            if data.is_none() {
                data = Some(self.file(Mode::ReadWrite)?);
            }
            let data = data.as_ref().expect("opened above");
            data.read_exact_at(&mut buf, idx * self.shared.chunk_size)?;
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
        let whole = offset.is_multiple_of(self.shared.chunk_size)
            && range.clone().map(|i| self.chunk_len(i)).sum::<u64>() == len as u64;
        if !whole {
            // Partial chunks cannot be checked from their own bytes.
            if !self.all_present(range.clone()) || !self.verify(cache, range)? {
                return Ok(false);
            }
            self.file(Mode::ReadWrite)?
                .read_exact_at(&mut room[..len], offset)?;
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
        let idx = offset / self.shared.chunk_size;
        if !offset.is_multiple_of(self.shared.chunk_size)
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
        let data = self.file(Mode::ReadWrite)?;
        if all_cached(&data, offset, len) == Some(false) && self.read_direct(offset, room, len) {
            return Ok(());
        }
        data.read_exact_at(&mut room[..len], offset)
    }

    /// Reads at least `room[..len]` at `offset` with O_DIRECT, rounded up to whole blocks;
    /// `false` where that is impossible (unaligned, refused) or failed: read another way.
    fn read_direct(&self, offset: u64, room: &mut [u8], len: usize) -> bool {
        const BLOCK: usize = 4096;
        let padded = len.next_multiple_of(BLOCK);
        let aligned = offset.is_multiple_of(BLOCK as u64)
            && (room.as_ptr() as usize).is_multiple_of(BLOCK)
            && padded <= room.len();
        if !aligned {
            return false;
        }
        // Opened on demand (and kept in the LRU while idle); a refusal means read another way.
        let Ok(direct) = self.file(Mode::Direct) else {
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
}

/// Whether every page of `[offset, offset + len)` of `file` is in the page cache, asked without
/// reading anything (`cachestat(2)`, Linux >= 6.5; `None` where unsupported). A probing read
/// would start readahead into the page cache, the very copy to avoid.
fn all_cached(file: &File, offset: u64, len: usize) -> Option<bool> {
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
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    (r == 0).then(|| stat.nr_cache >= (len as u64).div_ceil(page))
}

impl Entry {
    /// Maps the whole data file for reading (`None` if the system refuses): readers that keep
    /// it (an open handle of a large file) are then served without copying.
    pub fn map(&self) -> Option<Arc<Mapping>> {
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
        if let Some(m) = map.filter(|m| offset as usize + len <= m.len) {
            return Ok(ReadBytes::Mapped(
                m.clone(),
                offset as usize..offset as usize + len,
            ));
        }
        let mut buf = vec![0; len];
        self.file(Mode::ReadWrite)?
            .read_exact_at(&mut buf, offset)?;
        Ok(ReadBytes::Owned(buf))
    }

    /// The data file, for the kernel to read directly (passthrough): the kernel keeps its own
    /// reference, so the descriptor may close once the open is answered.
    pub fn data_file(&self) -> io::Result<Arc<File>> {
        self.file(Mode::ReadWrite)
    }

    /// The header recording this entry's present chunks; `None` once it left the cache.
    fn header(&self) -> Option<Header> {
        let st = lock(&self.state);
        if st.evicted {
            return None;
        }
        Some(Header {
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
        })
    }

    /// Records the present chunks in the cache's log, unless the entry left the cache.
    pub fn persist(&self) -> Result<(), CacheError> {
        Ok(self.shared.journal.put(|| self.header())?)
    }
}

#[cfg(test)]
mod tests;
