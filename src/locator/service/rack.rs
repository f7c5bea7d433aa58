//! The rack home's side of a node: its table of the files it is rack home of (which members
//! hold each), and the members' lookups queued behind a question to the global home, answered
//! together when it is.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::core::sync::lock;
use crate::locator::membership::NodeId;
use crate::locator::proto::Msg;
use crate::locator::tiers::{Key, RackHome, RackLookup, Reply};
use crate::stats::Stats;

#[derive(Default)]
struct RackState {
    table: RackHome,
    /// Members queued behind a pending global question, per file.
    /// (A member may have several lookups of one file queued: its readahead threads.)
    waiters: HashMap<(Key, NodeId), Vec<oneshot::Sender<Reply>>>,
}

/// What a rack home does about a lookup (see [`Rack::step`]).
pub(super) enum RackStep {
    Answer(Reply),
    /// Another lookup of the same key asked the global home: wait for its answer.
    Queued(oneshot::Receiver<Reply>),
    /// Ask the file's global home (then [`Rack::told`] its answer).
    AskGlobal,
}

/// The rack home's table and queued lookups, and the counters it keeps.
pub(in crate::locator) struct Rack {
    state: Mutex<RackState>,
    stats: Arc<Stats>,
}

impl Rack {
    pub(super) fn new(stats: Arc<Stats>) -> Rack {
        Rack {
            state: Mutex::default(),
            stats,
        }
    }

    /// What the rack table says to a lookup of `key` by `requester`.
    pub(super) fn step(&self, key: &Key, requester: NodeId) -> RackStep {
        let mut rack = lock(&self.state);
        match rack.table.lookup(key, requester) {
            RackLookup::Reply(r) => RackStep::Answer(r),
            RackLookup::Queued => {
                let (tx, rx) = oneshot::channel();
                rack.waiters
                    .entry((key.clone(), requester))
                    .or_default()
                    .push(tx);
                RackStep::Queued(rx)
            }
            RackLookup::AskGlobal => {
                self.stats.lookups_global.fetch_add(1, Ordering::Relaxed);
                RackStep::AskGlobal
            }
        }
    }

    /// The global home's `reply` (`None`: none came) to the lookup of `key` that `requester`
    /// made, recorded in the rack table: the answer for `requester`, and one for each lookup
    /// queued behind it.
    pub(super) fn told(&self, key: Key, requester: NodeId, reply: Option<Msg>) -> Msg {
        let answer = match reply {
            Some(Msg::Located(l)) => Some(l),
            _ => None,
        };
        let mut rack = lock(&self.state);
        let told = match answer {
            Some(a) => rack.table.global_answered(&key, a),
            None => rack.table.global_unreachable(&key),
        };
        // The asker's own answer is the first of its entries; each queued lookup gets one.
        let mut mine = None;
        for (node, reply) in told {
            if node == requester && mine.is_none() {
                mine = Some(reply);
                continue;
            }
            let waiting = (key.clone(), node);
            if let Some(txs) = rack.waiters.get_mut(&waiting) {
                if let Some(tx) = txs.pop() {
                    let _ = tx.send(reply);
                }
                if txs.is_empty() {
                    rack.waiters.remove(&waiting);
                }
            }
        }
        Msg::Located(mine.unwrap_or(Reply::Fetch))
    }

    /// Records that `node` gained (`held`) or lost a copy of `key`; whether the rack gained
    /// its first copy or lost its last (the file's global home is then told).
    pub(super) fn publish(&self, key: &Key, node: NodeId, held: bool) -> bool {
        let mut rack = lock(&self.state);
        let changed = if held {
            rack.table.publish(key, node)
        } else {
            rack.table.unpublish(key, node)
        };
        self.stats
            .home_rack_files
            .store(rack.table.files() as u64, Ordering::Relaxed);
        changed
    }

    /// `f` of the rack table, under its lock.
    pub(in crate::locator) fn with_table<R>(&self, f: impl FnOnce(&RackHome) -> R) -> R {
        f(&lock(&self.state).table)
    }
}

/// The question a rack home asks the global home of `key` for `requester`.
pub(super) fn global_lookup(key: &Key, requester: NodeId) -> Msg {
    Msg::Lookup {
        path: key.0.clone(),
        version: key.1,
        requester,
        global: true,
    }
}
