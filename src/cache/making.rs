//! How an entry comes to be: found in the index at the version asked for, or made anew in its
//! slot, its bytes placed in a segment, in a data file of its own, or (a sealed file) in the
//! file renamed in by `Cache::adopt`; or, where the cache takes no bytes, an entry outside it.

use super::files::{create_fresh, private_file};
use super::*;

/// How a new entry's bytes are placed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Making {
    /// In a region of the open segment (`--pack-max`).
    Packed,
    /// In a data file of its own, made empty now.
    OwnFile,
    /// In a data file of its own that the caller renames into place ([`Cache::adopt`]).
    Adopted,
}

impl Cache {
    /// The entry for `path` at `version`, created empty if absent. A cached copy of another
    /// version is dropped (its open handles keep reading their own, now unlinked, copy).
    pub fn entry(&self, path: &str, version: Version) -> Result<Arc<Entry>, CacheError> {
        let making = if self.shared.segments.packs(version.size) {
            Making::Packed
        } else {
            Making::OwnFile
        };
        self.entry_made(path, version, making)
    }

    /// [`Cache::entry`], its bytes placed as `making` says (an entry packed in a segment is
    /// replaced when a file of its own is wanted).
    pub(super) fn entry_made(
        &self,
        path: &str,
        version: Version,
        making: Making,
    ) -> Result<Arc<Entry>, CacheError> {
        let pack = making == Making::Packed;
        let fits = |e: &Arc<Entry>| pack || !e.packed();
        {
            let index = lock(&self.index);
            self.keep_old(&index);
            if let Some(e) = self.found(&index, path, version).filter(fits) {
                return Ok(e);
            }
        }
        let hash = path_hash(path);
        let _creating = self.creating_of(hash);
        {
            // Looked up again: another creation of this slot may have ended meanwhile.
            let mut index = lock(&self.index);
            if let Some(e) = self.found(&index, path, version).filter(fits) {
                return Ok(e);
            }
            if let Some(old) = index.remove(path) {
                self.drop_entry(&old);
            }
            if self.shared.journal.wants_rewrite() {
                self.rewrite_journal(&index);
            }
            // A different path with the same hash: the newcomer takes the slot.
            if let Some(other) = index.in_slot(hash) {
                index.remove(&other.path);
                self.drop_entry(&other);
            }
        }
        // The slot stays empty until the entry is inserted below: only a creation (which waits
        // for this one) fills a slot.
        if pack {
            // A region of the open segment: no file is made.
            let (place, freed) = self
                .shared
                .segments
                .alloc(&self.shared.files, version.size)?;
            self.release(freed);
            let entry = Arc::new(Entry::new(
                path.into(),
                version,
                place.id(),
                self.shared.clone(),
                vec![Chunk::Absent].into(),
                self.next_tick(),
            ));
            lock(&self.index).insert(entry.clone());
            return Ok(entry);
        }
        if making == Making::Adopted {
            // Its file is renamed in next (`Cache::adopt`): making an empty one first would
            // cost a create and the unlink of what the rename replaces.
            let entry = Arc::new(self.empty_entry(path, version));
            lock(&self.index).insert(entry.clone());
            return Ok(entry);
        }
        let data_path = self.shared.data_path(hash);
        let files = &self.shared.files;
        let data = create_fresh(&data_path, || {
            files.open_retrying(|| private_file(&data_path))
        })?;
        // A file of one chunk is written whole by its fill (its one write gives it its size);
        // a larger one is sized now, its chunks and pages written where they fall.
        if version.size > self.shared.chunk_size
            && let Err(e) = data.set_len(version.size)
        {
            let _ = fs::remove_file(&data_path);
            return Err(e.into());
        }
        let entry = Arc::new(self.empty_entry(path, version));
        // The new file is written next: keep it open.
        files.insert(entry.id, Mode::ReadWrite, data);
        lock(&self.index).insert(entry.clone());
        Ok(entry)
    }

    /// An entry of `path` at `version` with every chunk absent, not in the index yet.
    pub(super) fn empty_entry(&self, path: &str, version: Version) -> Entry {
        let n = version.size.div_ceil(self.shared.chunk_size) as usize;
        Entry::new(
            path.into(),
            version,
            self.next_id(),
            self.shared.clone(),
            vec![Chunk::Absent; n].into(),
            self.next_tick(),
        )
    }

    /// The entry to read `path` at `version` through: [`Cache::entry`], or, when its data file
    /// cannot be made (the cache's file system is full, read-only or failing), an entry outside
    /// the cache that never caches a byte, so its reads are served uncached instead of failing.
    pub fn entry_or_uncached(&self, path: &str, version: Version) -> Arc<Entry> {
        // A cache of no capacity (its file system was over 90% full at the start, and no
        // --capacity was given) takes no bytes: it makes no file either, where it used to make
        // an empty one, and an entry, per file read.
        if !self.takes_writes() || self.capacity == 0 {
            if let Some(e) = self.found(&lock(&self.index), path, version) {
                return e;
            }
            return self.uncached_entry(path, version);
        }
        match self.entry(path, version) {
            Ok(e) => e,
            Err(e) => {
                self.write_failed(path, &e.into());
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
