//! What every entry of one cache shares: its directory and chunk size, its log, its open data
//! files, its segments, the bytes in use and the clock.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::chunks::PageTables;
use super::files::DataFiles;
use super::journal::Journal;
use super::segments::Segments;

/// What every entry of one cache shares.
pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) chunk_size: u64,
    pub(super) journal: Journal,
    pub(super) files: Arc<DataFiles>,
    /// Bytes of present chunks plus reservations of fills in flight, plus the bytes of packed
    /// objects that left segments not freed yet.
    pub(super) used: AtomicU64,
    pub(super) segments: Segments,
    /// The clock: see `next_tick`.
    pub(super) tick: AtomicU64,
    /// The page tables of its entries' partial chunks, bounded.
    pub(super) page_tables: Arc<PageTables>,
    /// One lock per stripe of entries, held across a write to a data file of many chunks and
    /// the prints around it (see `Entry::write_at`).
    pub(super) writes: [Mutex<()>; WRITE_STRIPES],
}

/// How many locks the writes of entries of many chunks are spread over: a node fills a few
/// large files at a time.
pub(super) const WRITE_STRIPES: usize = 16;

impl Shared {
    /// The data file of the slot `hash`: one directory level keeps directories small.
    pub(super) fn data_path(&self, hash: u64) -> PathBuf {
        self.dir
            .join("data")
            .join(format!("{:02x}", hash >> 56))
            .join(format!("{hash:016x}.dat"))
    }

    /// The write lock of entry `id` (see `Entry::write_at`).
    pub(super) fn write_lock(&self, id: u64) -> MutexGuard<'_, ()> {
        crate::core::sync::lock(&self.writes[id as usize % WRITE_STRIPES])
    }

    /// The cache's clock: one tick per use of an entry (what eviction orders by).
    pub(super) fn next_tick(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }
}
