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

use std::time::Duration;

use super::backing::BackingStat;

/// What an entry weighs beyond its path's bytes: the stat and the cache's own bookkeeping.
const ENTRY_OVERHEAD: usize = std::mem::size_of::<BackingStat>() + 96;

pub(super) struct RememberedStats {
    stats: moka::sync::Cache<String, BackingStat>,
}

impl RememberedStats {
    /// Remembers stats for `ttl` in at most about `max_bytes`; `None` if either is zero
    /// (`--metadata-ttl 0s`: every lookup asks the shared file system).
    pub(super) fn new(ttl: Duration, max_bytes: u64) -> Option<RememberedStats> {
        if ttl.is_zero() || max_bytes == 0 {
            return None;
        }
        let stats = moka::sync::Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|path: &String, _: &BackingStat| {
                u32::try_from(path.len() + ENTRY_OVERHEAD).unwrap_or(u32::MAX)
            })
            .time_to_live(ttl)
            .build();
        Some(RememberedStats { stats })
    }

    /// The stat of `path` read less than the TTL ago, if remembered.
    pub(super) fn get(&self, path: &str) -> Option<BackingStat> {
        self.stats.get(path)
    }

    pub(super) fn keep(&self, path: &str, stat: &BackingStat) {
        self.stats.insert(path.to_string(), stat.clone());
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
    }

    #[test]
    fn memory_stays_within_its_bound() {
        let max = 64 * (ENTRY_OVERHEAD as u64 + 8);
        let r = RememberedStats::new(Duration::from_secs(60), max).unwrap();
        let stat = stat_of(&std::env::temp_dir());
        for i in 0..1000 {
            r.keep(&format!("f{i:07}"), &stat);
        }
        r.stats.run_pending_tasks();
        assert!(
            r.stats.weighted_size() <= max,
            "{} bytes remembered, bound {max}",
            r.stats.weighted_size()
        );
        assert!(r.stats.entry_count() > 0);
    }
}
