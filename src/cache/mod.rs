//! The node-local NVMe cache: one sparse `.dat` file per cached source file (same size, same
//! offsets, so the kernel can read it directly in passthrough mode), or, for small objects (at
//! most `--pack-max`, a training sample), a region of a large preallocated segment file (see
//! [`segments`]), plus a checksummed header saying which chunks are present (see [`format`]),
//! recorded in one log for the whole cache (see [`journal`]).
//!
//! This file is [`Cache`], a facade over its parts: the index (`index`, and `making` for how an
//! entry comes to be), the capacity (`capacity`: bytes of present or reserved chunks; least
//! recently used entries that nobody holds open are evicted whole), the events and the failed
//! writes (`write_errors`). [`entry`] is one cached file and its chunks' state machine (single-flight fills,
//! verification); [`mapping`] hands cached bytes to readers; `direct` reads chunks for peers;
//! [`files`] bounds the open data files; `events` tells the node which copies it can serve.

mod adopt;
mod capacity;
pub use capacity::fs_space;

/// The capacity of a cache in `dir` given none, with `used` bytes held there: what keeps 10% of
/// its file system free (said in the log when that is small). The node service's budget for
/// all its datasets is the same rule.
pub fn default_capacity(dir: &std::path::Path, used: u64) -> io::Result<u64> {
    Room::unset(dir, used)
}
mod chunks;
mod direct;
pub mod entry;
mod error;
mod events;
pub mod files;
pub mod format;
mod index;
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

pub use chunks::{Claim, PAGES, PageClaim, PageMask};
pub use entry::Entry;
use entry::reloaded::Reloaded;
pub use error::CacheError;
pub use events::{CacheEvent, CacheEvents, EventQueue};
pub use mapping::{Mapping, Pooled, ReadBytes};

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use capacity::Room;
use events::Events;
use files::DataFiles;
use index::Index;
use journal::Journal;
use shared::Shared;
use write_errors::WriteErrors;

use crate::core::Version;
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

/// The cache: a thin facade over its parts, each with its own file: the index of entries
/// (`index.rs`, and `making.rs` for how one comes to be), the capacity and eviction
/// (`capacity.rs`), the events told to the publisher (`events.rs`) and the failed writes
/// (`write_errors.rs`); what every entry shares is `shared::Shared`. Operations across
/// parts are here, or in `adopt.rs`.
pub struct Cache {
    shared: Arc<Shared>,
    index: Index,
    room: Room,
    /// Told when a file becomes complete or leaves the cache (the locator publishes these).
    events: Events,
    writes: WriteErrors,
    stats: Arc<Stats>,
    _lock: File,
}

impl Cache {
    /// Opens (or creates) the cache directory, takes its lock and reloads every entry its log
    /// records, without touching their data files (a million entries load in moments; each
    /// data file is checked when first opened, and its chunks when first served). The log is
    /// rewritten with the live headers only if much of it is dead or torn. Data files no header
    /// names (a crash's leftovers) are deleted by [`Cache::sweep_orphans`], which the daemon
    /// runs in the background.
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
        let (mut live, read) = reload::Live::replay(&log_path)?;
        let mut dropped = false;
        live.retain(|header| match header.check(chunk_size) {
            Ok(()) => true,
            Err(e) => {
                dropped = true;
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
            dropped = true;
        }
        // A log of whole records, most of them live, is appended to as it is: rewriting a
        // million headers (77 MiB) was a tenth of a restart, and they were rewritten at the
        // last start or compaction.
        let live_records = live.len() as u64;
        let journal = if read.whole() && !dropped && read.records <= live_records + live_records / 4
        {
            Journal::append_to(&log_path, read.bytes)?
        } else {
            Journal::create(&log_path, live.iter().map(Reloaded::record))?
        };
        let shared = Arc::new(Shared {
            dir: config.dir.clone(),
            chunk_size,
            journal,
            files: Arc::new(DataFiles::new(config.open_files)),
            used: AtomicU64::new(0),
            segments,
            tick: AtomicU64::new(1),
            page_tables: Arc::new(chunks::PageTables::new(config.max_partial_chunks)),
            writes: std::array::from_fn(|_| Default::default()),
        });
        let (slots, present, next_id) = live.into_slots(&shared);
        let used = shared.segments.count_dead() + present;
        shared.used.store(used, Ordering::Relaxed);
        let capacity = match config.capacity {
            Some(c) => c,
            None => Room::unset(&config.dir, used)?,
        };
        crate::sys::release_free_memory();
        tracing::info!(
            entries = slots.len(),
            used,
            capacity,
            open_files = config.open_files,
            "cache loaded"
        );
        Ok(Cache {
            index: Index::new(shared.clone(), slots, next_id),
            room: Room::new(capacity, shared.clone(), stats.clone()),
            events: Events::default(),
            writes: WriteErrors::new(stats.clone()),
            shared,
            stats,
            _lock: lock_file,
        })
    }

    /// Deletes every data file that no entry owns (a fill cut short by a crash, a dropped
    /// entry, anything foreign) and returns how many. Safe while the cache serves: a slot's
    /// file is only judged under the lock its creations take, and the index's.
    pub fn sweep_orphans(&self) -> io::Result<u64> {
        self.index.sweep_orphans()
    }

    /// The entry for `path` if cached at `version`; never creates one.
    pub fn lookup(&self, path: &str, version: Version) -> Option<Arc<Entry>> {
        self.index.lookup(path, version)
    }

    /// Visits every entry peers can pull from: complete, or with pages of a random reader (to
    /// publish again to a home that restarted). Outside the index's lock: the listing is of
    /// the entries (8 bytes each), a path is only lent to `visit`.
    pub fn visit_held(&self, visit: &mut dyn FnMut(&str, Version)) {
        for e in self.held() {
            visit(&e.path, e.version);
        }
    }

    /// The entries [`Cache::visit_held`] visits, as of now.
    pub fn held(&self) -> Vec<Arc<Entry>> {
        let mut all = self.index.all();
        all.retain(|e| e.is_complete() || e.has_pages());
        all
    }

    pub fn chunk_size(&self) -> u64 {
        self.shared.chunk_size
    }

    pub fn capacity(&self) -> u64 {
        self.room.capacity()
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

    /// Chunks partly present, a page table each (bounded by `max_partial_chunks`).
    pub fn partial_chunks(&self) -> u64 {
        self.shared.page_tables.count()
    }

    /// Number of entries holding at least one present chunk.
    pub fn cached_files(&self) -> u64 {
        self.index.cached_files()
    }

    /// Deletes the entry `path` (at `version`) now, whoever holds it open.
    pub fn forget(&self, path: &str, version: Version) {
        self.index.forget(path, version, &self.events, &self.writes)
    }

    /// The entry for `path` at `version`, created empty if absent. A cached copy of another
    /// version is dropped (its open handles keep reading their own, now unlinked, copy).
    pub fn entry(&self, path: &str, version: Version) -> Result<Arc<Entry>, CacheError> {
        self.index.entry(path, version, &self.events, &self.writes)
    }

    /// The entry to read `path` at `version` through: [`Cache::entry`], or, when its data file
    /// cannot be made (the cache's file system is full, read-only or failing), an entry outside
    /// the cache that never caches a byte, so its reads are served uncached instead of failing.
    /// A cache of no capacity (its file system was over 90% full at the start, and no
    /// --capacity was given) takes no bytes: it makes no file either, where it used to make an
    /// empty one, and an entry, per file read.
    pub fn entry_or_uncached(&self, path: &str, version: Version) -> Arc<Entry> {
        let takes = self.writes.takes_writes() && self.room.capacity() != 0;
        let (events, writes) = (&self.events, &self.writes);
        self.index
            .entry_or_uncached(path, version, takes, events, writes)
    }

    /// Reserves room for `bytes` of new chunks of `for_entry`, evicting least recently used
    /// entries that are not open and not being filled. `false`: nothing more can be evicted, the
    /// caller serves the read uncached.
    pub fn reserve(&self, for_entry: &Entry, bytes: u64) -> bool {
        let (events, writes) = (&self.events, &self.writes);
        self.room
            .reserve(&self.index, for_entry, bytes, events, writes)
    }

    /// Evicts cached files to free at least `bytes` of the cache's file system for something
    /// the capacity does not count (a file being written, which found the disk full); whether
    /// anything was evicted.
    pub fn make_room(&self, bytes: u64) -> bool {
        self.room
            .make_room(&self.index, bytes, &self.events, &self.writes)
    }

    /// Makes the capacity `bytes` (the node service's share of its disk for this dataset),
    /// evicting the least recently used files over it now.
    pub fn set_capacity(&self, bytes: u64) {
        self.room
            .set_capacity(&self.index, bytes, &self.events, &self.writes)
    }

    /// Returns a reservation (or a present chunk's bytes) to the free pool.
    pub fn release(&self, bytes: u64) {
        self.room.release(bytes)
    }

    /// The cache's events, for their one reader (the locator's publisher): a `Complete` for
    /// each complete copy held now, then every change as it happens. Handed out once: a second
    /// call gets `None` (a second reader would silently see nothing).
    pub fn take_events(&self) -> Option<CacheEvents> {
        self.events.take(self.index.lock().entries())
    }

    /// A fill of `entry` put its chunks in place: their checksums go to the log, and a copy
    /// this fill completed is told as complete (one that got its first pages, as partial).
    pub fn filled(&self, entry: &Entry) {
        self.writes.logged(&entry.path, entry.persist());
        self.events.tell_filled(entry);
    }

    /// As [`Cache::filled`] for chunks `chunks` made present whole (see
    /// [`Entry::persist_chunks`]).
    pub fn chunks_filled(&self, entry: &Entry, chunks: &[u64]) {
        self.writes
            .logged(&entry.path, entry.persist_chunks(chunks));
        self.events.tell_filled(entry);
    }

    /// As [`Cache::filled`] for pages of chunk `idx` (see [`Entry::persist_pages`]).
    pub fn pages_filled(&self, entry: &Entry, idx: u64) {
        self.writes.logged(&entry.path, entry.persist_pages(idx));
        self.events.tell_filled(entry);
    }

    /// Re-checks every cached chunk against its checksum and drops the bad ones (`dyadfs
    /// scrub`). Entries that cannot be read are skipped.
    pub fn scrub(&self) -> ScrubReport {
        self.scrub_paced(u64::MAX)
    }

    /// As [`Cache::scrub`], reading at most `bytes_per_sec` on average (the background scrub:
    /// the disk is the readers' first).
    pub fn scrub_paced(&self, bytes_per_sec: u64) -> ScrubReport {
        let entries = self.index.all();
        let recheck = |e: &Entry| e.recheck(self, 0..e.chunk_count());
        scrub::paced(entries, self.chunk_size(), bytes_per_sec, recheck)
    }

    /// Whether new files and chunks may be cached: no write to the cache's file system failed
    /// within a moment (see `write_errors.rs`).
    pub fn takes_writes(&self) -> bool {
        self.writes.takes_writes()
    }

    /// A write to the cache's file system failed (full, over quota, read-only, a failing
    /// disk): counted (`cache_write_errors`) and logged, at most once a minute, and nothing new
    /// is cached for a moment. The caller goes on without the cache (a read is served
    /// uncached, a produced file is not published).
    pub fn write_failed(&self, path: &str, error: &io::Error) {
        self.writes.write_failed(path, error)
    }

    /// A fill of `entry` could not write its bytes: the failure is reported and the entry
    /// dropped with whatever it holds (partial bytes the capacity does not count would keep the
    /// disk full), unless it is a produced file's only copy. Its readers are served uncached.
    pub fn fill_failed(&self, entry: &Entry, error: &io::Error) {
        if self.writes.fill_failed(entry, error) {
            self.index
                .drop_if_current(entry, &self.events, &self.writes);
        }
    }

    /// Cached bytes of `entry` could not be read back: the entry is dropped (its readers are
    /// served uncached, and its next reader caches it again).
    pub fn read_failed(&self, entry: &Entry, error: &io::Error) {
        if self.writes.read_failed(entry, error) {
            self.index
                .drop_if_current(entry, &self.events, &self.writes);
        }
    }
}

#[cfg(test)]
mod tests;
