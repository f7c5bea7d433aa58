//! What the rest of the node learns from the cache: a copy became complete (servable to
//! peers) or left. One channel, made when its one reader takes it ([`Cache::take_events`]);
//! until then nothing is queued, so a node without a publisher keeps no backlog.

use super::*;

/// A change of what this node can serve to its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Every chunk of this version is present: this node can serve it to peers.
    Complete { path: String, version: Version },
    /// Pages of this version are present (a large file read at random): peers can ask which
    /// and pull those. Told once per copy, before it is complete; `reloaded`: held at start.
    Partial {
        path: String,
        version: Version,
        reloaded: bool,
    },
    /// The copy is gone (evicted or replaced by another version).
    Dropped { path: String, version: Version },
}

impl Cache {
    /// The cache's events, for their one reader (the locator's publisher): a `Complete` for
    /// each complete copy held now, then every change as it happens. Handed out once: a second
    /// call gets `None` (a second reader would silently see nothing).
    pub fn take_events(&self) -> Option<crossbeam_channel::Receiver<CacheEvent>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        // Under the index's lock, which every drop holds: no copy leaves between the listing
        // and the channel being in place. The channel goes first, so a copy completing during
        // the listing is either listed or told (perhaps both: a repeated `Complete` is harmless).
        let index = lock(&self.index);
        self.events.set(tx.clone()).ok()?;
        for e in index.entries() {
            let (path, version) = (e.path.to_string(), e.version);
            if e.is_complete() {
                let _ = tx.send(CacheEvent::Complete { path, version });
            } else if e.has_pages() {
                e.mark_shared();
                let _ = tx.send(CacheEvent::Partial {
                    path,
                    version,
                    reloaded: true,
                });
            }
        }
        Some(rx)
    }

    /// A fill of `entry` put its chunks in place: their checksums go to the log, and a copy
    /// this fill completed is told as complete (one that got its first pages, as partial).
    pub fn filled(&self, entry: &Entry) {
        if let Err(e) = entry.persist() {
            // The chunks are there for this daemon's lifetime; the next start refetches them.
            self.write_failed(&entry.path, &e.into());
        }
        self.tell_filled(entry);
    }

    /// As [`Cache::filled`] for chunks `chunks` made present whole (see
    /// [`Entry::persist_chunks`]).
    pub fn chunks_filled(&self, entry: &Entry, chunks: &[u64]) {
        if let Err(e) = entry.persist_chunks(chunks) {
            self.write_failed(&entry.path, &e.into());
        }
        self.tell_filled(entry);
    }

    /// As [`Cache::filled`] for pages of chunk `idx` (see [`Entry::persist_pages`]).
    pub fn pages_filled(&self, entry: &Entry, idx: u64) {
        if let Err(e) = entry.persist_pages(idx) {
            self.write_failed(&entry.path, &e.into());
        }
        self.tell_filled(entry);
    }

    /// Tells the publisher a copy a fill completed, or one that got its first pages.
    fn tell_filled(&self, entry: &Entry) {
        if entry.is_complete() {
            self.completed(entry);
        } else if entry.share_pages() {
            self.emit(CacheEvent::Partial {
                path: entry.path.to_string(),
                version: entry.version,
                reloaded: false,
            });
        }
    }

    /// The one place a copy is told as complete (filled, or adopted whole).
    pub(super) fn completed(&self, entry: &Entry) {
        self.emit(CacheEvent::Complete {
            path: entry.path.to_string(),
            version: entry.version,
        });
    }

    pub(super) fn emit(&self, event: CacheEvent) {
        if let Some(tx) = self.events.get() {
            let _ = tx.send(event);
        }
    }
}
