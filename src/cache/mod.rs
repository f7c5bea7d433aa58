//! The node-local NVMe cache: one sparse `.dat` file per cached source file (same size, same
//! offsets, so the kernel can read it directly in passthrough mode), or, for small objects (at
//! most `--pack-max`, a training sample), a region of a large preallocated segment file (see
//! [`segments`]), plus a checksummed header saying which chunks are present (see [`format`]),
//! recorded in one log for the whole cache (see [`journal`]).
//!
//! This file is the index and its eviction: capacity is accounted in bytes of present (or
//! reserved) chunks; least recently used entries that nobody holds open are evicted whole.
//! [`entry`] is one cached file and its chunks' state machine (single-flight fills,
//! verification); [`mapping`] hands cached bytes to readers; `direct` reads chunks for peers;
//! [`files`] bounds the open data files; `events` tells the node which copies it can serve.

mod adopt;
mod capacity;
mod chunks;
mod direct;
pub mod entry;
mod error;
mod events;
pub mod files;
pub mod format;
pub mod journal;
mod making;
pub mod mapping;
pub mod names_log;
mod reload;
mod scrub;
pub mod segments;
mod shared;
mod verify;
pub use scrub::ScrubReport;
mod write_errors;

use chunks::Chunk;
pub use chunks::{Claim, PAGES, PageClaim, PageMask};
pub use entry::Entry;
use entry::Reloaded;
pub use error::CacheError;
pub use events::CacheEvent;
pub use mapping::{Mapping, Pooled, ReadBytes};

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use files::{DataFiles, Mode};
use journal::Journal;
use shared::Shared;

use crate::core::sync::lock;
use crate::core::{Version, path_hash};
use crate::stats::Stats;

#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dir: PathBuf,
    pub chunk_size: u32,
    /// Bytes the cache may hold; `None` leaves 10% of the cache filesystem free.
    pub capacity: Option<u64>,
    /// Data files kept open while idle (see [`files`]).
    pub open_files: u64,
    /// Objects of at most this many bytes are packed into segments (see [`segments`]); 0: none.
    /// At most one chunk.
    pub pack_max: u64,
    /// Chunks that may be partly present at once (a page table each, in memory); a random read
    /// of an absent chunk beyond that fills it whole.
    pub max_partial_chunks: u64,
}

/// The default of [`CacheConfig::max_partial_chunks`]: 262,144 chunks (512 GiB of large files
/// read at random at 2 MiB chunks) in about 64 MB of tables (236-265 bytes each, measured with
/// a page per chunk: docs/BENCHMARKS.md).
pub const MAX_PARTIAL_CHUNKS: u64 = 1 << 18;

/// The entries by slot (the hash of their path, which names their data file): a slot holds one
/// entry at a time (a colliding newcomer takes it), so one table finds both. A table of bare
/// entries placed by their slot: 9 bytes a bucket where a map from slot took 17 (a million
/// entries: 17 MB less).
#[derive(Default)]
struct Index {
    slots: hashbrown::HashTable<Arc<Entry>>,
}

/// Where slot `slot` goes in the table: FNV's low bits are weak, so they are mixed first
/// (splitmix64's finalizer).
fn place(slot: u64) -> u64 {
    let z = (slot ^ (slot >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Index {
    fn get(&self, path: &str) -> Option<&Arc<Entry>> {
        let slot = path_hash(path);
        self.slots.find(place(slot), |e| *e.path == *path)
    }

    fn insert(&mut self, entry: Arc<Entry>) {
        let slot = entry.slot();
        match self
            .slots
            .entry(place(slot), |e| e.slot() == slot, |e| place(e.slot()))
        {
            hashbrown::hash_table::Entry::Occupied(mut taken) => *taken.get_mut() = entry,
            hashbrown::hash_table::Entry::Vacant(free) => {
                free.insert(entry);
            }
        }
    }

    fn remove(&mut self, path: &str) -> Option<Arc<Entry>> {
        let slot = path_hash(path);
        let found = self
            .slots
            .find_entry(place(slot), |e| *e.path == *path)
            .ok()?;
        Some(found.remove().0)
    }

    fn in_slot(&self, slot: u64) -> Option<Arc<Entry>> {
        self.slots.find(place(slot), |e| e.slot() == slot).cloned()
    }

    fn entries(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.slots.iter()
    }

    fn len(&self) -> usize {
        self.slots.len()
    }
}

pub struct Cache {
    shared: Arc<Shared>,
    capacity: u64,
    index: Mutex<Index>,
    /// Creations of new entries take turns per shard of slots (a slot's data file has one
    /// name), outside the index's lock: creating a file is a directory update on the cache's
    /// file system, and every open of the mount looks the index up.
    creating: Box<[Mutex<()>]>,

    /// The tick of the last pass that kept old entries' ages from wrapping ([`Self::keep_old`]).
    kept_old_at: AtomicU64,
    next_id: AtomicU64,
    stats: Arc<Stats>,
    /// Told when a file becomes complete or leaves the cache (the locator publishes these):
    /// set once, by [`Cache::take_events`].
    events: std::sync::OnceLock<crossbeam_channel::Sender<CacheEvent>>,
    /// When a failed write to the cache's file system was last logged (seconds since the
    /// epoch): at most one line a minute, every fill would say it.
    warned_at: AtomicU64,
    /// Until when (ms after `opened`) no new file or chunk is cached, after a write to the
    /// cache's file system failed (see [`WRITE_BACKOFF`]).
    refused_until: AtomicU64,
    opened: std::time::Instant,
    _lock: File,
}

/// In a cache of more than [`SCAN_CHEAP`] entries, eviction frees this fraction of the capacity
/// beyond what a reservation needs: the scan for victims visits every entry, so with millions
/// of entries it must not run for every new file.
const EVICT_SLACK_DIVISOR: u64 = 64;
const SCAN_CHEAP: usize = 4096;
/// Shards of [`Cache::entry`]'s creations (by slot): enough that fills of different files
/// rarely wait for each other's file creation.
const CREATING_SHARDS: usize = 64;
/// The least [`Cache::make_room`] frees.
const MAKE_ROOM_MIN: u64 = 64 << 20;
/// After a write to the cache's file system failed, nothing new is cached for this long, the
/// reads concerned going straight to the source: a read-only or full disk would otherwise
/// cost every new file a fill that fails (bytes read twice from the source), and an eviction
/// of a good copy to reserve room for it.
const WRITE_BACKOFF: Duration = Duration::from_secs(1);

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
        let segment_size = segments::Segments::size_for(match config.capacity {
            Some(c) => c,
            None => fs_space(&config.dir)?.0 / 10 * 9,
        });
        let segments = segments::Segments::new(
            config.dir.join("segments"),
            segment_size,
            config.pack_max.min(chunk_size),
        )?;
        let mut live = reload::Live::replay(&log_path)?;
        live.retain(|header| match header.check(chunk_size) {
            Ok(()) => true,
            Err(e) => {
                // Its data file is left to the orphan sweep.
                tracing::warn!(path = %header.path, error = %e, "dropping cache entry");
                false
            }
        });
        // Packed objects whose segment is missing or cut short are not loaded.
        for r in live.iter() {
            if let Some(place) = r.place {
                segments.reloaded(place, r.size());
            }
        }
        let unusable = segments.unusable();
        if !unusable.is_empty() {
            tracing::warn!(segments = ?unusable, "cache segments missing or cut short: their objects are fetched again");
            live.retain(|r| r.place.is_none_or(|p| !unusable.contains(&p.segment)));
            segments.forget(&unusable);
        }
        let journal = Journal::create(&log_path, live.iter().map(Reloaded::record))?;
        let shared = Arc::new(Shared {
            dir: config.dir.clone(),
            chunk_size,
            journal,
            files: Arc::new(DataFiles::new(config.open_files)),
            used: AtomicU64::new(0),
            segments,
            tick: AtomicU64::new(1),
            page_tables: Arc::new(chunks::PageTables::new(config.max_partial_chunks)),
        });
        let mut index = Index::default();
        index.slots.reserve(live.len(), |e| place(e.slot()));
        let mut used = shared.segments.count_dead();
        let mut next_id = 0;
        for header in live.into_headers() {
            next_id += 1;
            let entry = header.into_entry(next_id, shared.clone());
            used += entry.state.lock().present_bytes;
            index.insert(Arc::new(entry));
        }
        shared.used.store(used, Ordering::Relaxed);
        let capacity = match config.capacity {
            Some(c) => c,
            None => {
                let (total, avail) = fs_space(&config.dir)?;
                let c = (avail + used).saturating_sub(total / 10);
                if c < (total / 100).max(1 << 30) {
                    // Every read would then go uncached to the shared file system: say why,
                    // and which: a disk mostly full, or one that is small (10% kept free).
                    let why = if avail + used < total / 2 {
                        "is over half full"
                    } else {
                        "is small"
                    };
                    tracing::warn!(
                        capacity = c,
                        free = avail,
                        size = total,
                        "the cache file system ({total} bytes, {avail} free) {why}: the cache \
                         gets {c} bytes, keeping 10% of the disk free (give --capacity to \
                         choose), so most reads may go to the shared file system"
                    );
                }
                c
            }
        };
        crate::sys::release_free_memory();
        tracing::info!(
            entries = index.len(),
            used,
            capacity,
            open_files = config.open_files,
            "cache loaded"
        );
        Ok(Cache {
            shared,
            capacity,
            index: Mutex::new(index),
            creating: (0..CREATING_SHARDS).map(|_| Mutex::new(())).collect(),
            kept_old_at: AtomicU64::new(1),
            next_id: AtomicU64::new(next_id + 1),
            stats,
            events: std::sync::OnceLock::new(),
            warned_at: AtomicU64::new(0),
            refused_until: AtomicU64::new(0),
            opened: std::time::Instant::now(),
            _lock: lock_file,
        })
    }

    /// Deletes every data file that no entry owns (a fill cut short by a crash, a dropped
    /// entry, anything foreign) and returns how many. Safe while the cache serves: a slot's
    /// file is only judged under the lock its creations take, and the index's.
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
                let _creating = slot.map(|hash| self.creating_of(hash));
                let index = lock(&self.index);
                // A packed entry has no data file: one in its slot is a leftover.
                if slot.is_none_or(|hash| index.in_slot(hash).is_none_or(|e| e.packed())) {
                    let _ = fs::remove_file(&file);
                    removed += 1;
                }
            }
        }
        let segments = self.shared.segments.sweep()?;
        if removed + segments > 0 {
            tracing::info!(removed, segments, "deleted cache files no entry owns");
        }
        Ok(removed + segments)
    }

    /// The entry for `path` if cached at `version`; never creates one.
    pub fn lookup(&self, path: &str, version: Version) -> Option<Arc<Entry>> {
        let index = lock(&self.index);
        index.get(path).filter(|e| e.version == version).cloned()
    }

    /// Every entry peers can pull from: complete, or with pages of a random reader (to
    /// publish again to a home that restarted).
    pub fn held_entries(&self) -> Vec<(String, Version)> {
        let index = lock(&self.index);
        index
            .entries()
            .filter(|e| e.is_complete() || e.has_pages())
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

    /// Segment files of packed objects (see [`segments`]).
    pub fn segment_files(&self) -> u64 {
        self.shared.segments.count().0
    }

    /// Packs new cached objects of at most `max` bytes from now on (0: none; at most a chunk,
    /// as at [`Cache::open`]); objects packed already stay packed.
    pub fn set_pack_max(&self, max: u64) {
        self.shared
            .segments
            .set_max(max.min(self.shared.chunk_size));
    }

    /// Number of entries holding at least one present chunk.
    /// Chunks partly present, a page table each (bounded by `max_partial_chunks`).
    pub fn partial_chunks(&self) -> u64 {
        self.shared.page_tables.count()
    }

    pub fn cached_files(&self) -> u64 {
        let index = lock(&self.index);
        index
            .entries()
            .filter(|e| e.state.lock().present_bytes > 0)
            .count() as u64
    }

    /// The turn of creations of slot `hash` (taken before the index's lock, never after).
    fn creating_of(&self, hash: u64) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.creating[(hash % CREATING_SHARDS as u64) as usize])
    }

    /// The entry of `path` at `version` if the index has it (marked used).
    fn found(&self, index: &Index, path: &str, version: Version) -> Option<Arc<Entry>> {
        let e = index.get(path).filter(|e| e.version == version)?;
        e.touch(self.next_tick());
        Some(e.clone())
    }

    /// Entries record their last use in 32 bits, and an age is taken modulo 2^32: an entry
    /// idle for 2^31 ticks (a day at 10,000 opens a second) would read as just used and
    /// outlive hot ones. Every 2^28 ticks, entries older than 2^30 are made exactly that old,
    /// so no age ever reaches 2^31 and the least recently used still go first.
    fn keep_old(&self, index: &Index) {
        const EVERY: u64 = 1 << 28;
        const OLD: u64 = 1 << 30;
        let now = self.shared.tick.load(Ordering::Relaxed);
        let last = self.kept_old_at.load(Ordering::Relaxed);
        if now.wrapping_sub(last) < EVERY
            || self
                .kept_old_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        for e in index.entries() {
            if u64::from(e.age(now)) > OLD {
                e.touch(now.wrapping_sub(OLD));
            }
        }
    }

    fn next_tick(&self) -> u64 {
        self.shared.next_tick()
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
            .rewrite(|| entries.iter().filter_map(|e| e.record()));
        if let Err(e) = r {
            // Appending goes on; the rewrite is tried again once the log has grown further.
            self.write_failed("index.log (rewrite)", &e.into());
        }
    }

    /// Removes an entry's files and returns its bytes. The caller has taken it out of the index.
    fn drop_entry(&self, entry: &Entry) {
        let mut st = entry.state.lock();
        st.evicted = true;
        if st.present_bytes > 0 {
            self.emit(CacheEvent::Dropped {
                path: entry.path.to_string(),
                version: entry.version,
            });
        }
        let present = std::mem::take(&mut st.present_bytes);
        st.drop_present();
        drop(st);
        if let Some(place) = entry.place() {
            // Its bytes are counted until its whole segment goes.
            let segments = &self.shared.segments;
            self.release(segments.dropped(&self.shared.files, place, present));
            if let Err(e) = self.shared.journal.drop_path(&entry.path) {
                self.write_failed(&entry.path, &e);
            }
            return;
        }
        self.shared.used.fetch_sub(present, Ordering::Relaxed);
        self.shared.files.close(entry.id);
        // The tombstone goes first: a crash in between leaves data without a header (deleted
        // by the orphan sweep), never a header for deleted or replaced data.
        if let Err(e) = self.shared.journal.drop_path(&entry.path) {
            // The data file goes anyway: a header that outlives it is checked at first use.
            self.write_failed(&entry.path, &e);
        }
        let _ = fs::remove_file(entry.data_path());
    }

    /// Deletes the entry `path` (at `version`) now, whoever holds it open.
    pub fn forget(&self, path: &str, version: Version) {
        let mut index = lock(&self.index);
        if index.get(path).is_some_and(|e| e.version == version) {
            let e = index.remove(path).expect("present");
            self.drop_entry(&e);
        }
    }
}

/// (total, available to unprivileged users) bytes of the filesystem holding `dir`.
pub fn fs_space(dir: &Path) -> io::Result<(u64, u64)> {
    let s = crate::sys::statvfs(dir)?;
    Ok((s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize))
}

#[cfg(test)]
mod tests;
