//! Nodes that recently failed an RPC or a pull, and when: skipped as homes (a miss) and tried
//! last as holders, so a dead or frozen node costs one timeout, not one per file.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::core::sync::lock;
use crate::locator::membership::NodeId;
use crate::transport::TransportError;

/// How long a failed node stays suspect.
const SUSPECT_FOR: Duration = Duration::from_secs(30);

/// The nodes suspect here, and since when.
#[derive(Default)]
pub(in crate::locator) struct Suspects {
    since: Mutex<HashMap<NodeId, Instant>>,
}

impl Suspects {
    pub(super) fn suspect(&self, node: NodeId) {
        lock(&self.since).insert(node, Instant::now());
    }

    /// A call to or pull from `node` failed with `error`: it becomes suspect, unless it only
    /// ran out of a short wait (shorter than half of `timeout`, the peer timeout: a read gives
    /// its last calls what is left of one; a busy but live node missing a 20 ms deadline is no
    /// reason to send every miss it is home of to the shared file system for [`SUSPECT_FOR`]).
    pub(super) fn failed(&self, node: NodeId, error: &TransportError, timeout: Duration) {
        match error {
            TransportError::Timeout { timeout: t, .. } if *t < timeout / 2 => {
                tracing::debug!(node, error = %error, "short wait ran out; not suspect");
            }
            _ => self.suspect(node),
        }
    }

    /// Nodes that failed within the last [`SUSPECT_FOR`].
    pub(super) fn list(&self) -> Vec<NodeId> {
        let mut s = lock(&self.since);
        s.retain(|_, at| at.elapsed() < SUSPECT_FOR);
        s.keys().copied().collect()
    }

    /// `node` is suspect no more (it rejoined, or gossip has it back).
    pub(in crate::locator) fn forget(&self, node: NodeId) {
        lock(&self.since).remove(&node);
    }
}
