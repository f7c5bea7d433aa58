//! Attributes read from the shared file system, remembered for the metadata TTL by path.
//!
//! The daemon trusts a node's attributes for `--metadata-ttl`, but a node lives only as long as
//! the kernel holds its inode: once the kernel forgets it (memory pressure, `drop_caches`, the
//! inode shedder), the next lookup of the name asked the shared file system again, within the
//! TTL it had already been trusted for. On a parallel file system that is a metadata server's
//! round trip per sample per epoch. Remembered here, such a lookup costs none, and a stat the
//! stat read-ahead made ahead of a scan serves the scan's lookups instead of only warming the
//! shared file system's caches. Bounded in bytes (`--backing-stat-cache`); each entry expires
//! the TTL after it was read, so nothing is trusted longer than a live node's attributes are.
//! The mount never changes the shared file system, so only the TTL invalidates an entry.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Mutex;
use std::time::Duration;

use crate::backing::BackingStat;
use crate::core::sync::lock;

/// A remembered stat and the path it is of (kept to tell two paths of one hash apart).
type Slot = (Box<str>, BackingStat);

/// What an entry weighs: its slot, its path's allocation (a typical one), and its row in the
/// map from hashes to slots (16 bytes in a table that a churn of inserts and removals keeps at
/// about twice its rows).
const ENTRY_BYTES: usize = std::mem::size_of::<Slot>() + 96;

/// Locks taken by a lookup and the stat read-ahead at once are on different shards mostly.
const SHARDS: usize = 16;

/// Remembered stats. Oldest out first once a shard is full: each shard is a ring of slots, its
/// next slot the oldest, and a map from a path's hash to its slot. A general cache (moka, tried
/// first) cost a scan of 100,000 entries 20% in its bookkeeping per insert and get; a map of
/// whole stats with a queue beside it held 2.7 times its bound (a hash table that entries churn
/// through doubles its buckets, and the stats sat in them).
pub(super) struct RememberedStats {
    ttl: Duration,
    shards: Box<[Mutex<Shard>]>,
}

struct Shard {
    slot_of: HashMap<u64, u32>,
    /// Filled up to `ring` (their memory touched as they fill: a small dataset costs little),
    /// then reused oldest first.
    slots: Vec<Slot>,
    ring: usize,
    /// Once the ring is full, the slot the next new path takes: the oldest.
    next: usize,
}

impl RememberedStats {
    /// Remembers stats for `ttl` in at most about `max_bytes`; `None` if either is zero
    /// (`--metadata-ttl 0s`: every lookup asks the shared file system).
    pub(super) fn new(ttl: Duration, max_bytes: u64) -> Option<RememberedStats> {
        let entries = usize::try_from(max_bytes).unwrap_or(usize::MAX) / ENTRY_BYTES;
        if ttl.is_zero() || entries == 0 {
            return None;
        }
        // At most u32::MAX slots a shard (a 1 TiB bound would not reach it).
        let per_shard = entries.div_ceil(SHARDS).min(u32::MAX as usize);
        let shard = || {
            Mutex::new(Shard {
                slot_of: HashMap::new(),
                // Reserved whole up to a point (no copy left behind as it grows); a bound far
                // above the default grows instead of reserving gigabytes at mount.
                slots: Vec::with_capacity(per_shard.min(1 << 16)),
                ring: per_shard,
                next: 0,
            })
        };
        Some(RememberedStats {
            ttl,
            shards: (0..SHARDS).map(|_| shard()).collect(),
        })
    }

    fn shard_of(&self, path: &str) -> (u64, &Mutex<Shard>) {
        // Fixed keys: the same path always lands in the same shard.
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(path);
        (hash, &self.shards[hash as usize % SHARDS])
    }

    /// The stat of `path` read less than the TTL ago, if remembered.
    pub(super) fn get(&self, path: &str) -> Option<BackingStat> {
        let (hash, shard) = self.shard_of(path);
        let shard = lock(shard);
        let slot = *shard.slot_of.get(&hash)?;
        let (p, stat) = &shard.slots[slot as usize];
        (**p == *path && stat.read.elapsed() < self.ttl).then(|| stat.clone())
    }

    pub(super) fn keep(&self, path: &str, stat: &BackingStat) {
        let (hash, shard) = self.shard_of(path);
        let shard = &mut *lock(shard);
        let entry = (Box::from(path), stat.clone());
        if let Some(&slot) = shard.slot_of.get(&hash) {
            shard.slots[slot as usize] = entry;
        } else if shard.slots.len() < shard.ring {
            shard.slot_of.insert(hash, shard.slots.len() as u32);
            shard.slots.push(entry);
        } else {
            // The oldest path goes, and its row in the map with it.
            let slot = shard.next;
            shard.next = (slot + 1) % shard.ring;
            let old = std::mem::replace(&mut shard.slots[slot], entry);
            let old_hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(&*old.0);
            shard.slot_of.remove(&old_hash);
            shard.slot_of.insert(hash, slot as u32);
        }
    }

    /// Names remembered, expired or not (the tests' view of the bound).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).slot_of.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Instant;

    use super::*;

    fn stat_of(dir: &Path) -> BackingStat {
        BackingStat {
            meta: crate::backing::Meta::of(&std::fs::symlink_metadata(dir).unwrap()),
            allowed: 0o7777,
            read: Instant::now(),
        }
    }

    #[test]
    fn a_stat_is_remembered_until_its_ttl_has_passed() {
        let dir = std::env::temp_dir();
        let r = RememberedStats::new(Duration::from_millis(300), 1 << 20).unwrap();
        assert!(r.get("a").is_none());
        r.keep("a", &stat_of(&dir));
        let got = r.get("a").expect("remembered");
        assert_eq!(got.meta, stat_of(&dir).meta);
        std::thread::sleep(Duration::from_millis(400));
        assert!(r.get("a").is_none(), "kept past its TTL");
    }

    #[test]
    fn nothing_is_remembered_without_a_ttl_or_room() {
        assert!(RememberedStats::new(Duration::ZERO, 1 << 20).is_none());
        assert!(RememberedStats::new(Duration::from_secs(60), 0).is_none());
        assert!(RememberedStats::new(Duration::from_secs(60), 100).is_none());
    }

    #[test]
    fn memory_stays_within_its_bound() {
        let max = (SHARDS * 4 * ENTRY_BYTES) as u64;
        let r = RememberedStats::new(Duration::from_secs(60), max).unwrap();
        let stat = stat_of(&std::env::temp_dir());
        for i in 0..1000 {
            r.keep(&format!("f{i:07}"), &stat);
        }
        assert!(
            r.len() <= SHARDS * 4,
            "{} remembered, bound {}",
            r.len(),
            SHARDS * 4
        );
        // The newest are kept, the oldest went first.
        assert!(r.get("f0000999").is_some());
        assert!(r.get("f0000000").is_none());
    }
}
