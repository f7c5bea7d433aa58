//! What loading keeps of the header log: the live header of each data file (slot). Records are
//! replayed in order: a header takes its slot (a colliding path's newer header wins, as the
//! running cache did), a tombstone empties its path's slot.
//!
//! The headers are held in shards by slot, each a vector whose headers a small table finds by
//! slot, filled at once by the loading threads (a record only touches its own slot, so the
//! shards need no order between them), and handed out from their ends while the vectors shrink
//! behind them. A map of headers (a million in 2^21 buckets of 80 bytes) was the peak of a
//! restart's memory: 160 MiB alive beside the entries built from it, 324 MiB at its height
//! against 184 MiB once loaded; one thread filling one table of 14 million was half of that
//! restart.

use std::io;
use std::path::Path;
use std::sync::Arc;

use super::entry::reloaded::Reloaded;
use super::format::PartialRecord;
use super::index::{Slots, place, shard_of};
use super::journal::{self, Batch, Record, Replayed};
use super::shared::Shared;
use crate::core::{Version, path_hash};
use hashbrown::HashTable;

/// Headers made entries between two shrinks of a shard's vector (its freed tail goes back to
/// the system at each).
const SHRINK_EVERY: usize = 1 << 16;

/// A sample's header record, in bytes (a million samples logged 77 MB): a log's length over it
/// is about how many headers it holds.
const RECORD_BYTES: u64 = 77;

/// Threads that load a cache, and its shards of live headers: its log's records decoded, its
/// entries made (a million entries took 1.3 s on one core).
pub(super) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

pub(super) struct Live {
    shards: Vec<Shard>,
}

#[derive(Default)]
struct Shard {
    headers: Vec<Option<Reloaded>>,
    /// Slot -> index in `headers` (a table placed as the index places slots: SipHash of the
    /// slots was a tenth of a restart).
    slots: HashTable<(u64, u32)>,
}

/// A record as the decoding threads leave it: its path's slot hashed, a header in the entry's
/// form.
enum Prepared {
    Put(u64, Reloaded),
    Drop(u64, String),
    Pages(u64, String, Version, PartialRecord),
    Chunks(u64, String, Version, Vec<(u32, u32)>),
}

impl From<Record> for Prepared {
    fn from(record: Record) -> Prepared {
        match record {
            Record::Put(h) => Prepared::Put(path_hash(&h.path), Reloaded::from(h)),
            Record::Packed(place, h) => {
                Prepared::Put(path_hash(&h.path), Reloaded::packed(place, h))
            }
            Record::Drop(path) => Prepared::Drop(path_hash(&path), path),
            Record::Pages {
                path,
                version,
                part,
            } => Prepared::Pages(path_hash(&path), path, version, part),
            Record::Chunks {
                path,
                version,
                chunks,
            } => Prepared::Chunks(path_hash(&path), path, version, chunks),
        }
    }
}

impl Prepared {
    fn slot(&self) -> u64 {
        match self {
            Prepared::Put(slot, _)
            | Prepared::Drop(slot, _)
            | Prepared::Pages(slot, ..)
            | Prepared::Chunks(slot, ..) => *slot,
        }
    }
}

impl Live {
    /// The live headers of the log at `path` (none if it is missing), and what was read.
    pub(super) fn replay(path: &Path) -> io::Result<(Live, Replayed)> {
        Live::replay_in(path, threads())
    }

    /// [`Live::replay`] in `n` shards, on as many threads.
    fn replay_in(path: &Path, n: usize) -> io::Result<(Live, Replayed)> {
        // Room for the headers a log of this length holds if its records are a sample's (77
        // bytes): growing to 14 million moved and rehashed them all at each doubling.
        let records = std::fs::metadata(path).map_or(0, |m| m.len() / RECORD_BYTES) as usize;
        let per = records / n + records / n / 16;
        let mut live = Live {
            shards: (0..n)
                .map(|_| Shard {
                    headers: Vec::with_capacity(per),
                    slots: HashTable::with_capacity(per),
                })
                .collect(),
        };
        let route = |record: Record| {
            let r = Prepared::from(record);
            (shard_of(r.slot(), n), r)
        };
        let read = journal::replay_sharded(path, n, n, route, |batch| live.apply(batch))?;
        Ok((live, read))
    }

    /// Applies a batch's records, each shard's on a thread of its own.
    fn apply(&mut self, batch: Batch<Prepared>) {
        std::thread::scope(|s| {
            for (shard, parts) in self.shards.iter_mut().zip(batch) {
                if parts.iter().any(|p| !p.is_empty()) {
                    s.spawn(move || parts.into_iter().flatten().for_each(|r| shard.apply(r)));
                }
            }
        });
    }

    /// Keeps the headers `keep` says yes to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Reloaded) -> bool) {
        for h in self.shards.iter_mut().flat_map(|s| &mut s.headers) {
            if h.as_ref().is_some_and(|r| !keep(r)) {
                *h = None;
            }
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Reloaded> {
        self.shards.iter().flat_map(|s| s.headers.iter().flatten())
    }

    pub(super) fn len(&self) -> usize {
        self.iter().count()
    }

    /// The index's table of the entries made from the live headers, each shard's made and put
    /// in place by a thread of its own, its headers freed as it goes; the bytes present in them,
    /// and the first id after theirs.
    pub(super) fn into_slots(self, shared: &Arc<Shared>) -> (Slots, u64, u64) {
        let room: Vec<usize> = self
            .shards
            .iter()
            .map(|s| s.headers.iter().flatten().count())
            .collect();
        let mut slots = Slots::with_shards(&room);
        // Ids from 1, each shard's after the ones before it.
        let firsts: Vec<u64> = room
            .iter()
            .scan(1u64, |next, &n| {
                let first = *next;
                *next += n as u64;
                Some(first)
            })
            .collect();
        let used: u64 = std::thread::scope(|s| {
            let workers: Vec<_> = slots
                .loading()
                .zip(self.shards)
                .zip(firsts)
                .map(|((mut table, shard), mut id)| {
                    s.spawn(move || {
                        drop(shard.slots);
                        let mut headers = shard.headers;
                        let mut used = 0;
                        loop {
                            if headers.len().is_multiple_of(SHRINK_EVERY) {
                                headers.shrink_to_fit();
                            }
                            let Some(header) = headers.pop() else {
                                return used;
                            };
                            let Some(header) = header else { continue };
                            let entry = header.into_entry(id, shared.clone());
                            id += 1;
                            used += entry.state.lock().present_bytes;
                            table.insert(entry.slot(), Arc::new(entry));
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("a loading thread panicked"))
                .sum()
        });
        (slots, used, 1 + room.iter().sum::<usize>() as u64)
    }
}

impl Shard {
    fn apply(&mut self, record: Prepared) {
        match record {
            Prepared::Put(slot, h) => self.put(slot, h),
            Prepared::Drop(slot, path) => self.drop_path(slot, &path),
            Prepared::Pages(slot, path, version, part) => {
                if let Some(h) = self.same_file(slot, &path, version) {
                    h.set_pages(part);
                }
            }
            Prepared::Chunks(slot, path, version, chunks) => {
                if let Some(h) = self.same_file(slot, &path, version) {
                    h.set_chunks(&chunks);
                }
            }
        }
    }

    fn put(&mut self, slot: u64, header: Reloaded) {
        match self.find(slot) {
            Some(i) => self.headers[i] = Some(header),
            None => {
                let i = u32::try_from(self.headers.len()).expect("fewer than 2^32 headers");
                self.slots
                    .insert_unique(place(slot), (slot, i), |&(s, _)| place(s));
                self.headers.push(Some(header));
            }
        }
    }

    /// The index in `headers` of `slot`'s header.
    fn find(&self, slot: u64) -> Option<usize> {
        let &(_, i) = self.slots.find(place(slot), |&(s, _)| s == slot)?;
        Some(i as usize)
    }

    /// The header of `path` (in `slot`) at `version`, not packed: a later record (pages,
    /// chunks) only extends a file's own, and one for a replaced or dropped file changes
    /// nothing.
    fn same_file(&mut self, slot: u64, path: &str, version: Version) -> Option<&mut Reloaded> {
        let i = self.find(slot)?;
        self.headers[i]
            .as_mut()
            .filter(|h| *h.path == *path && h.version() == version && h.place.is_none())
    }

    fn drop_path(&mut self, slot: u64, path: &str) {
        if let Some(i) = self.find(slot)
            && self.headers[i].as_ref().is_some_and(|h| *h.path == *path)
        {
            self.headers[i] = None;
            if let Ok(found) = self.slots.find_entry(place(slot), |&(s, _)| s == slot) {
                found.remove();
            }
        }
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
        // In one shard, or several filled at once across the log's batches.
        for shards in [1, 2, 3, 8] {
            let (live, read) = Live::replay_in(&log, shards).unwrap();
            assert_eq!(read.records, 100_005);
            assert!(read.whole());
            assert_eq!(live.len(), 99_999);
            let mut sizes: std::collections::HashMap<String, u64> = live
                .iter()
                .map(|h| (h.path.to_string(), h.size()))
                .collect();
            assert_eq!(sizes.len(), 99_999);
            assert_eq!(sizes.remove("d/5"), Some(555));
            assert_eq!(sizes.remove("d/6"), None);
            assert_eq!(sizes.remove("d/7"), Some(777));
            assert_eq!(sizes.remove("d/8"), Some(8));
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
