//! What loading keeps of the header log: the live header of each data file (slot). Records are
//! replayed in order: a header takes its slot (a colliding path's newer header wins, as the
//! running cache did), a tombstone empties its path's slot.
//!
//! The headers are held in one vector, found by slot through a small table, and handed out
//! from its end while the vector shrinks behind them. A map of headers (a million in 2^21
//! buckets of 80 bytes) was the peak of a restart's memory: 160 MiB alive beside the entries
//! built from it, 324 MiB at its height against 184 MiB once loaded.

use std::collections::HashMap;
use std::io;
use std::path::Path;

use super::entry::reloaded::Reloaded;
use super::format::PartialRecord;
use super::journal::{self, Record};
use crate::core::{Version, path_hash};

/// Headers handed out between two shrinks of the vector (its freed tail goes back to the
/// system at each).
const SHRINK_EVERY: usize = 1 << 16;

#[derive(Default)]
pub(super) struct Live {
    headers: Vec<Option<Reloaded>>,
    /// Slot -> index in `headers`.
    slots: HashMap<u64, u32>,
}

impl Live {
    /// The live headers of the log at `path` (none if it is missing).
    pub(super) fn replay(path: &Path) -> io::Result<Live> {
        let mut live = Live::default();
        journal::replay(path, |record| match record {
            Record::Put(h) => live.put(Reloaded::from(h)),
            Record::Packed(place, h) => live.put(Reloaded::packed(place, h)),
            Record::Drop(path) => live.drop_path(&path),
            Record::Pages {
                path,
                version,
                part,
            } => live.pages(&path, version, part),
            Record::Chunks {
                path,
                version,
                chunks,
            } => live.chunks(&path, version, &chunks),
        })?;
        Ok(live)
    }

    fn put(&mut self, header: Reloaded) {
        let slot = path_hash(&header.path);
        match self.slots.get(&slot) {
            Some(&i) => self.headers[i as usize] = Some(header),
            None => {
                let i = u32::try_from(self.headers.len()).expect("fewer than 2^32 headers");
                self.slots.insert(slot, i);
                self.headers.push(Some(header));
            }
        }
    }

    /// Pages of a partial chunk, over the header its path's slot holds if that is the same
    /// file at the same version (a record for a replaced or dropped one changes nothing).
    fn pages(&mut self, path: &str, version: Version, part: PartialRecord) {
        if let Some(h) = self.same_file(path, version) {
            h.set_pages(part);
        }
    }

    /// Chunks present whole, over the header of the same file at the same version.
    fn chunks(&mut self, path: &str, version: Version, chunks: &[(u32, u32)]) {
        if let Some(h) = self.same_file(path, version) {
            h.set_chunks(chunks);
        }
    }

    /// The header of `path` at `version` (not packed: a later record only extends a file's own).
    fn same_file(&mut self, path: &str, version: Version) -> Option<&mut Reloaded> {
        let &i = self.slots.get(&path_hash(path))?;
        self.headers[i as usize]
            .as_mut()
            .filter(|h| *h.path == *path && h.version() == version && h.place.is_none())
    }

    fn drop_path(&mut self, path: &str) {
        let slot = path_hash(path);
        if let Some(&i) = self.slots.get(&slot)
            && self.headers[i as usize]
                .as_ref()
                .is_some_and(|h| *h.path == *path)
        {
            self.headers[i as usize] = None;
            self.slots.remove(&slot);
        }
    }

    /// Keeps the headers `keep` says yes to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Reloaded) -> bool) {
        for h in &mut self.headers {
            if h.as_ref().is_some_and(|r| !keep(r)) {
                *h = None;
            }
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Reloaded> {
        self.headers.iter().flatten()
    }

    pub(super) fn len(&self) -> usize {
        self.iter().count()
    }

    /// Hands out every live header, freeing the vector as it goes.
    pub(super) fn into_headers(self) -> impl Iterator<Item = Reloaded> {
        drop(self.slots);
        let mut headers = self.headers;
        std::iter::from_fn(move || {
            loop {
                if headers.len().is_multiple_of(SHRINK_EVERY) {
                    headers.shrink_to_fit();
                }
                match headers.pop()? {
                    Some(h) => return Some(h),
                    None => continue,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::Header;
    use crate::cache::journal::Journal;
    use crate::core::Version;

    fn header(path: &str, size: u64) -> Header {
        Header {
            chunk_size: 1 << 20,
            version: Version { size, mtime_ns: 1 },
            path: path.into(),
            chunks: vec![Some(7)],
            partial: Vec::new(),
        }
    }

    #[test]
    fn the_last_header_of_a_path_wins_and_a_tombstone_empties_its_slot() {
        let dir = std::env::temp_dir().join(format!("dyadfs-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("index.log");
        let mut records: Vec<Record> = (0..100_000)
            .map(|i| Record::Put(header(&format!("d/{i}"), i)))
            .collect();
        // A newer header of a path, a tombstone, a tombstone of a path never cached, and a
        // header after its tombstone.
        records.push(Record::Put(header("d/5", 555)));
        records.push(Record::Drop("d/6".into()));
        records.push(Record::Drop("d/x".into()));
        records.push(Record::Drop("d/7".into()));
        records.push(Record::Put(header("d/7", 777)));
        Journal::create(&log, records).unwrap();
        let live = Live::replay(&log).unwrap();
        assert_eq!(live.len(), 99_999);
        let mut sizes: HashMap<String, u64> = live
            .into_headers()
            .map(|h| (h.path.to_string(), h.size()))
            .collect();
        assert_eq!(sizes.len(), 99_999);
        assert_eq!(sizes.remove("d/5"), Some(555));
        assert_eq!(sizes.remove("d/6"), None);
        assert_eq!(sizes.remove("d/7"), Some(777));
        assert_eq!(sizes.remove("d/8"), Some(8));
        let _ = std::fs::remove_dir_all(dir);
    }
}
