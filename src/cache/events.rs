//! What the rest of the node learns from the cache: a copy became complete (servable to
//! peers) or left. One channel, made when its one reader takes it (`Cache::take_events`);
//! until then nothing is queued, so a node without a publisher keeps no backlog. The copies
//! held when it is taken are told as the reader reads them, not queued as events: a cache of
//! 14 million files would queue gigabytes of paths for a publisher that sends 512 a round.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};

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
    ) -> Option<CacheEvents> {
        let (tx, live) = crossbeam_channel::unbounded();
        // Under the index's lock, which every drop holds: no copy leaves between the listing
        // and the channel being in place. The channel goes first, so a copy completing during
        // the listing is either listed or told (perhaps both: a repeated `Complete` is harmless).
        self.tx.set(tx).ok()?;
        Some(CacheEvents {
            held: entries.cloned().collect::<Vec<_>>().into_iter(),
            live,
            ended: false,
        })
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

/// The cache's events as their one reader reads them: the changes as they happen, and between
/// them the copies held when the events were taken (an entry, 8 bytes, each until it is read).
/// A held copy is told as it is then: one evicted since is skipped (its `Dropped` is among the
/// changes), one evicted after it is told is told as `Dropped` after it; so the reader never
/// sees a copy's `Complete` after its `Dropped`.
pub struct CacheEvents {
    held: std::vec::IntoIter<Arc<Entry>>,
    live: Receiver<CacheEvent>,
    /// The cache is gone: no change will come.
    ended: bool,
}

impl CacheEvents {
    /// The next event ready now: a change, else the next copy held at the start.
    pub fn try_recv(&mut self) -> Option<CacheEvent> {
        match self.live.try_recv() {
            Ok(ev) => return Some(ev),
            Err(TryRecvError::Disconnected) => self.ended = true,
            Err(TryRecvError::Empty) => {}
        }
        self.next_held()
    }

    /// Whether everything was told and the cache is gone (seen by the last `try_recv`).
    pub fn ended(&self) -> bool {
        self.ended && self.held.len() == 0
    }

    /// The next event, waiting up to `timeout` for a change once the held copies are told.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<CacheEvent, RecvTimeoutError> {
        match self.try_recv() {
            Some(ev) => Ok(ev),
            None => self.live.recv_timeout(timeout),
        }
    }

    /// Held copies not told yet (some may have left since).
    pub fn backlog(&self) -> usize {
        self.held.len()
    }

    fn next_held(&mut self) -> Option<CacheEvent> {
        for e in self.held.by_ref() {
            let (path, version) = (|| e.path.to_string(), e.version);
            if e.is_evicted() {
                continue;
            }
            if e.is_complete() {
                return Some(CacheEvent::Complete {
                    path: path(),
                    version,
                });
            }
            if e.has_pages() {
                e.mark_shared();
                return Some(CacheEvent::Partial {
                    path: path(),
                    version,
                    reloaded: true,
                });
            }
        }
        None
    }
}

/// Where a publisher reads the events it publishes: one cache's (a job's daemon), or every
/// dataset's of a node service (`node::publishing`).
pub trait EventQueue: Send + 'static {
    fn recv_timeout(&mut self, timeout: Duration) -> Result<CacheEvent, RecvTimeoutError>;
    fn try_recv(&mut self) -> Option<CacheEvent>;
}

impl EventQueue for CacheEvents {
    fn recv_timeout(&mut self, timeout: Duration) -> Result<CacheEvent, RecvTimeoutError> {
        CacheEvents::recv_timeout(self, timeout)
    }

    fn try_recv(&mut self) -> Option<CacheEvent> {
        CacheEvents::try_recv(self)
    }
}
