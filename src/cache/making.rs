//! How an entry comes to be: found in the index at the version asked for, or made anew in its
//! slot, its bytes placed in a segment, in a data file of its own, or (a sealed file) in the
//! file renamed in by `Cache::adopt`; or, where the cache takes no bytes, an entry outside it.

use std::fs;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::chunks::Chunk;
use super::entry::Entry;
use super::error::CacheError;
use super::events::Events;
use super::files::{Mode, create_fresh, private_file};
use super::index::Index;
use super::write_errors::WriteErrors;
use crate::core::{Version, path_hash};

/// How a new entry's bytes are placed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Making {
    /// In a region of the open segment (`--pack-max`).
    Packed,
    /// In a data file of its own, made empty now.
    OwnFile,
    /// In a data file of its own that the caller renames into place (`Cache::adopt`).
    Adopted,
}

impl Index {
    /// The entry for `path` at `version`, created empty if absent. A cached copy of another
    /// version is dropped (its open handles keep reading their own, now unlinked, copy).
    pub(super) fn entry(
        &self,
        path: &str,
        version: Version,
        events: &Events,
        writes: &WriteErrors,
    ) -> Result<Arc<Entry>, CacheError> {
        let making = if self.shared().segments.packs(version.size) {
            Making::Packed
        } else {
            Making::OwnFile
        };
        self.entry_made(path, version, making, events, writes)
    }

    /// [`Index::entry`], its bytes placed as `making` says (an entry packed in a segment is
    /// replaced when a file of its own is wanted).
    pub(super) fn entry_made(
        &self,
        path: &str,
        version: Version,
        making: Making,
        events: &Events,
        writes: &WriteErrors,
    ) -> Result<Arc<Entry>, CacheError> {
        let pack = making == Making::Packed;
        let fits = |e: &Arc<Entry>| pack || !e.packed();
        {
            let slots = self.lock();
            self.keep_old(&slots);
            if let Some(e) = self.found(&slots, path, version).filter(fits) {
                return Ok(e);
            }
        }
        let hash = path_hash(path);
        let _creating = self.creating_of(hash);
        {
            // Looked up again: another creation of this slot may have ended meanwhile.
            let mut slots = self.lock();
            if let Some(e) = self.found(&slots, path, version).filter(fits) {
                return Ok(e);
            }
            if let Some(old) = slots.remove(path) {
                self.drop_entry(&old, events, writes);
            }
            if self.shared().journal.wants_rewrite() {
                self.rewrite_journal(&slots, writes);
            }
            // A different path with the same hash: the newcomer takes the slot.
            if let Some(other) = slots.in_slot(hash) {
                slots.remove(&other.path);
                self.drop_entry(&other, events, writes);
            }
        }
        // The slot stays empty until the entry is inserted below: only a creation (which waits
        // for this one) fills a slot.
        let shared = self.shared();
        if pack {
            // A region of the open segment: no file is made.
            let (place, freed) = shared.segments.alloc(&shared.files, version.size)?;
            shared.used.fetch_sub(freed, Ordering::Relaxed);
            let entry = Arc::new(Entry::new(
                path.into(),
                version,
                place.id(),
                shared.clone(),
                vec![Chunk::Absent].into(),
                shared.next_tick(),
            ));
            self.lock().insert(entry.clone());
            return Ok(entry);
        }
        if making == Making::Adopted {
            // Its file is renamed in next (`Cache::adopt`): making an empty one first would
            // cost a create and the unlink of what the rename replaces.
            let entry = Arc::new(self.empty_entry(path, version));
            self.lock().insert(entry.clone());
            return Ok(entry);
        }
        let data_path = shared.data_path(hash);
        let files = &shared.files;
        let data = create_fresh(&data_path, || {
            files.open_retrying(|| private_file(&data_path))
        })?;
        // A file of one chunk is written whole by its fill (its one write gives it its size);
        // a larger one is sized now, its chunks and pages written where they fall.
        if version.size > shared.chunk_size
            && let Err(e) = data.set_len(version.size)
        {
            let _ = fs::remove_file(&data_path);
            return Err(e.into());
        }
        let entry = Arc::new(self.empty_entry(path, version));
        // The new file is written next: keep it open.
        files.insert(entry.id, Mode::ReadWrite, data);
        self.lock().insert(entry.clone());
        Ok(entry)
    }

    /// An entry of `path` at `version` with every chunk absent, not in the index yet.
    pub(super) fn empty_entry(&self, path: &str, version: Version) -> Entry {
        let shared = self.shared();
        let n = version.size.div_ceil(shared.chunk_size) as usize;
        Entry::new(
            path.into(),
            version,
            self.next_id(),
            shared.clone(),
            vec![Chunk::Absent; n].into(),
            shared.next_tick(),
        )
    }

    /// The entry to read `path` at `version` through: [`Index::entry`], or, when its data file
    /// cannot be made (the cache's file system is full, read-only or failing), an entry outside
    /// the cache that never caches a byte, so its reads are served uncached instead of failing.
    /// `takes`: whether the cache takes bytes now (see `Cache::entry_or_uncached`).
    pub(super) fn entry_or_uncached(
        &self,
        path: &str,
        version: Version,
        takes: bool,
        events: &Events,
        writes: &WriteErrors,
    ) -> Arc<Entry> {
        if !takes {
            if let Some(e) = self.found(&self.lock(), path, version) {
                return e;
            }
            return self.uncached_entry(path, version);
        }
        match self.entry(path, version, events, writes) {
            Ok(e) => e,
            Err(e) => {
                writes.write_failed(path, &e.into());
                self.uncached_entry(path, version)
            }
        }
    }

    /// An entry outside the cache, as if it had left it: it takes no bytes.
    fn uncached_entry(&self, path: &str, version: Version) -> Arc<Entry> {
        let entry = self.empty_entry(path, version);
        entry.state.lock().evicted = true;
        Arc::new(entry)
    }
}
