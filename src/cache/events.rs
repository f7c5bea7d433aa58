//! What the rest of the node learns from the cache: a copy became complete (servable to
//! peers) or left. One channel, made when its one reader takes it (`Cache::take_events`);
//! until then nothing is queued, so a node without a publisher keeps no backlog.

use std::sync::{Arc, OnceLock};

use super::entry::Entry;
use crate::core::Version;

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

/// The channel to the one reader of the cache's events, once taken.
#[derive(Default)]
pub(super) struct Events {
    /// Told when a file becomes complete or leaves the cache (the locator publishes these):
    /// set once, by [`Events::take`].
    tx: OnceLock<crossbeam_channel::Sender<CacheEvent>>,
}

impl Events {
    /// The events, for their one reader: a `Complete` for each complete copy of `entries` (the
    /// index's, under its lock), then every change as it happens. Handed out once: a second
    /// call gets `None` (a second reader would silently see nothing).
    pub(super) fn take<'a>(
        &self,
        entries: impl Iterator<Item = &'a Arc<Entry>>,
    ) -> Option<crossbeam_channel::Receiver<CacheEvent>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        // Under the index's lock, which every drop holds: no copy leaves between the listing
        // and the channel being in place. The channel goes first, so a copy completing during
        // the listing is either listed or told (perhaps both: a repeated `Complete` is harmless).
        self.tx.set(tx.clone()).ok()?;
        for e in entries {
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

    /// Tells the publisher a copy a fill completed, or one that got its first pages.
    pub(super) fn tell_filled(&self, entry: &Entry) {
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
        if let Some(tx) = self.tx.get() {
            let _ = tx.send(event);
        }
    }
}
