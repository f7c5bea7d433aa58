//! The files this node was told to fetch from the shared file system, and when: its peers that
//! wait for them pull what they need from it, and it fills what they ask for that it has not
//! read yet (so each chunk is read from the shared file system once). A file leaves the set
//! when this node publishes it (complete: nothing left to fill) or after [`FETCHING_FOR`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::tiers::Key;
use crate::core::Version;

/// How long this node serves as a file's fetcher for its waiting peers after it was told to
/// fetch it (a fetch that outlives this is a new fetch: its own lookups renew it).
const FETCHING_FOR: Duration = Duration::from_secs(600);

/// Fetches in flight below which the map is never swept.
const FETCHING_SWEPT: usize = 4096;

/// The files this node fetches, swept of the overdue ones when the map has doubled since the
/// last sweep (a sweep per fetch over a quarter of a million files was 65% of a daemon's CPU
/// while its node read its shard of a million files).
#[derive(Default)]
pub(super) struct Fetching {
    since: HashMap<Key, Instant>,
    sweep_at: usize,
}

impl Fetching {
    /// Records that this node fetches `key` (forgetting fetches older than [`FETCHING_FOR`]).
    pub(super) fn start(&mut self, key: Key) {
        let now = Instant::now();
        if self.since.len() >= self.sweep_at.max(FETCHING_SWEPT) {
            self.since
                .retain(|_, at| now.saturating_duration_since(*at) < FETCHING_FOR);
            self.sweep_at = 2 * self.since.len();
        }
        self.since.insert(key, now);
    }

    /// Whether this node fetches `path` at `version`.
    pub(super) fn has(&self, path: &str, version: Version) -> bool {
        self.since
            .get(&(path.to_string(), version))
            .is_some_and(|at| at.elapsed() < FETCHING_FOR)
    }

    /// `path` at `version` is complete here (or dropped): nothing is left to fill.
    pub(super) fn done(&mut self, path: &str, version: Version) {
        self.since.remove(&(path.to_string(), version));
    }
}
