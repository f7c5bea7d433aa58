//! The global home's side of a node: its table of the files it is global home of (which racks
//! hold each, who fetches it), and the feed of copies racks gained.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::core::sync::lock;
use crate::locator::membership::NodeId;
use crate::locator::pages;
use crate::locator::proto::Msg;
use crate::locator::tiers::{GlobalHome, Key, Reply};
use crate::stats::Stats;

/// The most copies one `Gained` is answered with, whatever it asks (then bounded by bytes).
const GAINED_MAX: usize = 4096;

/// The global home's table, and the counters it keeps.
pub(super) struct Global {
    table: Mutex<GlobalHome>,
    stats: Arc<Stats>,
}

impl Global {
    pub(super) fn new(stats: Arc<Stats>) -> Global {
        Global {
            table: Mutex::default(),
            stats,
        }
    }

    /// The answer to a lookup of `key` by `requester` (a fetch is handed on after `timeout`).
    /// A fetcher the cluster declared down (`is_down`) hands the fetch to this requester (one
    /// of the waiters, never all of them at once).
    pub(super) fn answer(
        &self,
        key: Key,
        requester: NodeId,
        timeout: Duration,
        is_down: impl Fn(NodeId) -> bool,
    ) -> Msg {
        let mut g = lock(&self.table);
        let mut r = g.lookup(&key, requester, Instant::now(), timeout);
        if let Reply::WaitFor(f) = r
            && is_down(f)
        {
            g.fetch_failed(&key, f);
            r = g.lookup(&key, requester, Instant::now(), timeout);
        }
        Msg::Located(r)
    }

    /// `node` could not fetch `key`: the next asker fetches it.
    pub(super) fn fetch_failed(&self, key: &Key, node: NodeId) {
        lock(&self.table).fetch_failed(key, node);
    }

    /// Rack `rack` gained its first copy of `key` (at `node`) or lost its last.
    pub(super) fn rack_changed(&self, key: Key, rack: &str, node: NodeId, held: bool) -> Msg {
        let mut g = lock(&self.table);
        if held {
            g.rack_gained(&key, rack, node);
        } else {
            g.rack_lost(&key, rack);
        }
        self.stats
            .home_global_files
            .store(g.files() as u64, Ordering::Relaxed);
        self.stats
            .home_feed_copies
            .store(g.feed_end(), Ordering::Relaxed);
        Msg::Ack
    }

    /// The copies the global tier gained since `after`, a page of at most `max`.
    pub(super) fn gained_page(&self, after: u64, max: u32) -> Msg {
        let max = (max as usize).min(GAINED_MAX);
        let (next, copies) = lock(&self.table).gained_since(after, max);
        let mut copies: Vec<_> = copies
            .into_iter()
            .map(|((path, version), node)| (path, version, node))
            .collect();
        // Within a page, like a listing: the replicator asks again from `next`.
        let fit = pages::fitting(&copies);
        let next = next - (copies.len() - fit) as u64;
        copies.truncate(fit);
        Msg::GainedList { next, copies }
    }
}
