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

use super::entry::reloaded::Reloaded;
use super::format::PartialRecord;
use super::index::place;
use super::journal::{self, Batch, Record, Replayed};
use crate::core::{Version, path_hash};
use hashbrown::HashTable;

/// Headers handed out between two shrinks of a vector (its freed tail goes back to the system
/// at each), and made entries at once by [`map_parallel`].
const SHRINK_EVERY: usize = 1 << 16;

/// A sample's header record, in bytes (a million samples logged 77 MB): a log's length over it
/// is about how many headers it holds.
const RECORD_BYTES: u64 = 77;

/// Threads that load a cache, and its shards of live headers: its log's records decoded, its
/// entries made (a million entries took 1.3 s on one core).
pub(super) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// The shard, of `shards`, of `slot`'s header (bits the tables' own placing does not use).
fn shard_of(slot: u64, shards: usize) -> usize {
    ((place(slot) >> 32) % shards as u64) as usize
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

    /// Hands out every live header, [`SHRINK_EVERY`] at a time, freeing the vectors as it goes.
    pub(super) fn into_batches(self) -> impl Iterator<Item = Vec<Reloaded>> {
        self.shards.into_iter().flat_map(|shard| {
            drop(shard.slots);
            let mut headers = shard.headers;
            std::iter::from_fn(move || {
                if headers.is_empty() {
                    return None;
                }
                let batch = headers
                    .split_off(headers.len().saturating_sub(SHRINK_EVERY))
                    .into_iter()
                    .flatten()
                    .collect();
                headers.shrink_to_fit();
                Some(batch)
            })
        })
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

/// `f` of each item and its index, in order, on up to `threads` threads.
pub(super) fn map_parallel<A: Send, B: Send>(
    mut items: Vec<A>,
    threads: usize,
    f: impl Fn(usize, A) -> B + Sync,
) -> Vec<B> {
    let per = items.len().div_ceil(threads.max(1)).max(1);
    let mut parts = Vec::new();
    while items.len() > per {
        let start = items.len() - per;
        parts.push((start, items.split_off(start)));
    }
    parts.push((0, items));
    let f = &f;
    let done: Vec<Vec<B>> = std::thread::scope(|s| {
        let workers: Vec<_> = parts
            .into_iter()
            .rev()
            .map(|(start, part)| {
                s.spawn(move || {
                    part.into_iter()
                        .enumerate()
                        .map(|(i, a)| f(start + i, a))
                        .collect()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a loading thread panicked"))
            .collect()
    });
    done.into_iter().flatten().collect()
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
                .into_batches()
                .flatten()
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

    #[test]
    fn a_parallel_map_keeps_the_order_and_the_indices() {
        for (n, threads) in [(0, 3), (1, 3), (1000, 1), (1000, 3), (7, 8)] {
            let items: Vec<u64> = (0..n).map(|i| i * 10).collect();
            let got = map_parallel(items, threads, |i, a| (i as u64, a));
            assert_eq!(got, (0..n).map(|i| (i, i * 10)).collect::<Vec<_>>());
        }
    }
}
