//! What a failed write to the cache's file system does: the read goes on uncached, the entry is
//! dropped, and nothing new is cached for a moment.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::entry::Entry;
use super::error::CacheError;
use crate::stats::Stats;

/// After a write to the cache's file system failed, nothing new is cached for this long, the
/// reads concerned going straight to the source: a read-only or full disk would otherwise
/// cost every new file a fill that fails (bytes read twice from the source), and an eviction
/// of a good copy to reserve room for it.
const WRITE_BACKOFF: Duration = Duration::from_secs(1);

/// The failed writes to the cache's file system: counted, logged at most once a minute, and
/// the backoff they start.
pub(super) struct WriteErrors {
    stats: Arc<Stats>,
    /// When a failed write to the cache's file system was last logged (seconds since the
    /// epoch): at most one line a minute, every fill would say it.
    warned_at: AtomicU64,
    /// Until when (ms after `opened`) no new file or chunk is cached, after a write to the
    /// cache's file system failed (see [`WRITE_BACKOFF`]).
    refused_until: AtomicU64,
    opened: Instant,
}

impl WriteErrors {
    pub(super) fn new(stats: Arc<Stats>) -> WriteErrors {
        WriteErrors {
            stats,
            warned_at: AtomicU64::new(0),
            refused_until: AtomicU64::new(0),
            opened: Instant::now(),
        }
    }

    /// Whether new files and chunks may be cached: no write to the cache's file system failed
    /// within [`WRITE_BACKOFF`].
    pub(super) fn takes_writes(&self) -> bool {
        self.now_ms() >= self.refused_until.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    /// A write to the cache's file system failed (full, over quota, read-only, a failing
    /// disk): counted (`cache_write_errors`) and logged, at most once a minute, and nothing new
    /// is cached for [`WRITE_BACKOFF`]. The caller goes on without the cache (a read is served
    /// uncached, a produced file is not published).
    pub(super) fn write_failed(&self, path: &str, error: &io::Error) {
        let until = self.now_ms() + WRITE_BACKOFF.as_millis() as u64;
        self.refused_until.fetch_max(until, Ordering::Relaxed);
        let errors = self
            .stats
            .cache_write_errors
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        self.warn_once_a_minute(|| {
            tracing::warn!(
                %path,
                %error,
                errors,
                "a write to the cache's file system failed: reads are served uncached, a file \
                 being written fails (logged at most once a minute; cache_write_errors counts \
                 every failure)"
            )
        });
    }

    /// A record of `path` that could not be logged is told as a failed write; the caller goes
    /// on (its chunks are there for this daemon's lifetime; the next start refetches them).
    pub(super) fn logged(&self, path: &str, persisted: Result<(), CacheError>) {
        if let Err(e) = persisted {
            self.write_failed(path, &e.into());
        }
    }

    /// A fill of `entry` could not write its bytes: the failure is reported; whether the entry
    /// is to be dropped with whatever it holds (partial bytes the capacity does not count would
    /// keep the disk full): not if it left the cache meanwhile, nor if it is a produced file's
    /// only copy.
    pub(super) fn fill_failed(&self, entry: &Entry, error: &io::Error) -> bool {
        if entry.is_evicted() {
            // It left the cache while being filled (its data file is gone): no fault of the disk.
            return false;
        }
        self.write_failed(&entry.path, error);
        !entry.kept()
    }

    /// Cached bytes of `entry` could not be read back: logged (once a minute); whether the
    /// entry is to be dropped (not if it left the cache already, nor if it is kept).
    pub(super) fn read_failed(&self, entry: &Entry, error: &io::Error) -> bool {
        if entry.is_evicted() || entry.kept() {
            return false;
        }
        self.warn_once_a_minute(|| {
            tracing::warn!(path = %entry.path, %error, "cannot read the cache: serving uncached")
        });
        true
    }

    fn warn_once_a_minute(&self, warn: impl FnOnce()) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let last = self.warned_at.load(Ordering::Relaxed);
        if now >= last + 60
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            warn();
        }
    }
}
