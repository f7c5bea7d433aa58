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

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Mutex;
use std::time::Duration;

use super::backing::BackingStat;
use crate::core::sync::lock;

/// What an entry weighs: the stat, a path of typical length, the map's and the queue's slots.
const ENTRY_BYTES: usize = std::mem::size_of::<BackingStat>() + 128;

/// Locks taken by a lookup and the stat read-ahead at once are on different shards mostly.
const SHARDS: usize = 16;

/// Remembered stats. Oldest out first once a shard is full: a plain map and a queue, because a
/// general cache (moka, tried first) cost a scan of 100,000 entries 20% (its bookkeeping per
/// insert and get, on a path that stats the shared file system and nothing else).
pub(super) struct RememberedStats {
    ttl: Duration,
    per_shard: usize,
    shards: Box<[Mutex<Shard>]>,
}

#[derive(Default)]
struct Shard {
    /// By a hash of the path (the path kept to tell two of one hash apart).
    stats: HashMap<u64, (Box<str>, BackingStat)>,
    /// Hashes in the order they came in, each once.
    order: VecDeque<u64>,
}

impl RememberedStats {
    /// Remembers stats for `ttl` in at most about `max_bytes`; `None` if either is zero
    /// (`--metadata-ttl 0s`: every lookup asks the shared file system).
    pub(super) fn new(ttl: Duration, max_bytes: u64) -> Option<RememberedStats> {
        let entries = usize::try_from(max_bytes).unwrap_or(usize::MAX) / ENTRY_BYTES;
        if ttl.is_zero() || entries == 0 {
            return None;
        }
        Some(RememberedStats {
            ttl,
            per_shard: entries.div_ceil(SHARDS),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
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
        let (p, stat) = shard.stats.get(&hash)?;
        (**p == *path && stat.read.elapsed() < self.ttl).then(|| stat.clone())
    }

    pub(super) fn keep(&self, path: &str, stat: &BackingStat) {
        let (hash, shard) = self.shard_of(path);
        let mut shard = lock(shard);
        let entry = (Box::from(path), stat.clone());
        if shard.stats.insert(hash, entry).is_none() {
            shard.order.push_back(hash);
        }
        while shard.stats.len() > self.per_shard {
            let Some(oldest) = shard.order.pop_front() else {
                break;
            };
            shard.stats.remove(&oldest);
        }
    }

    /// Names remembered, expired or not (the tests' view of the bound).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).stats.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;
    use std::time::Instant;

    use super::*;

    fn stat_of(dir: &Path) -> BackingStat {
        BackingStat {
            meta: std::fs::symlink_metadata(dir).unwrap(),
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
        assert_eq!(got.ino(), std::fs::metadata(&dir).unwrap().ino());
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
