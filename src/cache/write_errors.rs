//! What a failed write to the cache's file system does: the read goes on uncached, the entry is
//! dropped, and nothing new is cached for a moment.

use super::*;

impl Cache {
    /// Whether new files and chunks may be cached: no write to the cache's file system failed
    /// within [`WRITE_BACKOFF`].
    pub fn takes_writes(&self) -> bool {
        self.now_ms() >= self.refused_until.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    /// A write to the cache's file system failed (full, over quota, read-only, a failing
    /// disk): counted (`cache_write_errors`) and logged, at most once a minute, and nothing new
    /// is cached for [`WRITE_BACKOFF`]. The caller goes on without the cache (a read is served
    /// uncached, a produced file is not published).
    pub fn write_failed(&self, path: &str, error: &io::Error) {
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

    /// A fill of `entry` could not write its bytes: the failure is reported and the entry
    /// dropped with whatever it holds (partial bytes the capacity does not count would keep the
    /// disk full), unless it is a produced file's only copy. Its readers are served uncached.
    pub fn fill_failed(&self, entry: &Entry, error: &io::Error) {
        if entry.is_evicted() {
            // It left the cache while being filled (its data file is gone): no fault of the disk.
            return;
        }
        self.write_failed(&entry.path, error);
        if !entry.kept() {
            self.drop_if_current(entry);
        }
    }

    /// Cached bytes of `entry` could not be read back: the entry is dropped (its readers are
    /// served uncached, and its next reader caches it again).
    pub fn read_failed(&self, entry: &Entry, error: &io::Error) {
        if entry.is_evicted() || entry.kept() {
            return;
        }
        self.warn_once_a_minute(|| {
            tracing::warn!(path = %entry.path, %error, "cannot read the cache: serving uncached")
        });
        self.drop_if_current(entry);
    }

    /// Removes `entry` from the index and deletes its files, if the index holds this very entry.
    fn drop_if_current(&self, entry: &Entry) {
        let mut index = lock(&self.index);
        if index
            .get(&entry.path)
            .is_some_and(|e| std::ptr::eq(e.as_ref(), entry))
        {
            let e = index.remove(&entry.path).expect("present");
            self.drop_entry(&e);
        }
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
