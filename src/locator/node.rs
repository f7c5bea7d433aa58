//! The node tier: before asking its rack home, a node checks its own cache index (done by the
//! caller) and the recent answers it got, kept for a TTL (moka). Misses are remembered for a
//! shorter TTL, so a file nobody holds is not asked about again and again; an answer whose
//! holder failed a pull is corrected at once.

use std::sync::Arc;
use std::time::Duration;

use super::membership::NodeId;
use super::tiers::Key;

/// Answers the node tier has room for before its table first grows (about 0.5 MiB of buckets).
const HOLDERS_SIZED_FOR: u64 = 1 << 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    Holders(Arc<Vec<NodeId>>),
    /// Recently nobody held it.
    Nobody,
}

pub struct NodeTier {
    holders: moka::sync::Cache<Key, Arc<Vec<NodeId>>>,
    misses: moka::sync::Cache<Key, ()>,
}

impl NodeTier {
    pub fn new(ttl: Duration, negative_ttl: Duration, max_entries: u64) -> NodeTier {
        NodeTier {
            // Sized for a dataset's worth of hints from the start: a later epoch's feeds insert
            // a few per sample, and each doubling of the table on the way rehashed it on the
            // runtime's thread (11% of that thread's samples in a DataLoader's epoch 2, `perf`).
            holders: moka::sync::Cache::builder()
                .max_capacity(max_entries)
                .initial_capacity(max_entries.min(HOLDERS_SIZED_FOR) as usize)
                .time_to_live(ttl)
                .build(),
            misses: moka::sync::Cache::builder()
                .max_capacity(max_entries)
                .time_to_live(negative_ttl)
                .build(),
        }
    }

    pub fn get(&self, key: &Key) -> Option<Known> {
        if let Some(h) = self.holders.get(key) {
            return Some(Known::Holders(h));
        }
        self.misses.get(key).map(|()| Known::Nobody)
    }

    pub fn remember(&self, key: Key, holders: Vec<NodeId>) {
        if holders.is_empty() {
            self.holders.invalidate(&key);
            self.misses.insert(key, ());
        } else {
            self.misses.invalidate(&key);
            self.holders.insert(key, Arc::new(holders));
        }
    }

    /// A feed says `node` gained a copy (see `hints`): one more holder, kept like an answer.
    pub fn hint(&self, key: Key, node: NodeId) {
        let holders = match self.holders.get(&key) {
            Some(h) if h.contains(&node) => return,
            Some(h) => h.iter().copied().chain([node]).collect(),
            None => vec![node],
        };
        self.misses.invalidate(&key);
        self.holders.insert(key, Arc::new(holders));
    }

    /// A pull from `node` failed: it is no longer offered for this file.
    pub fn holder_failed(&self, key: &Key, node: NodeId) {
        if let Some(h) = self.holders.get(key) {
            let rest: Vec<NodeId> = h.iter().copied().filter(|&n| n != node).collect();
            if rest.is_empty() {
                self.holders.invalidate(key);
            } else {
                self.holders.insert(key.clone(), Arc::new(rest));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Version;

    fn key(p: &str) -> Key {
        (
            p.into(),
            Version {
                size: 1,
                mtime_ns: 1,
            },
        )
    }

    #[test]
    fn answers_expire_and_failed_holders_are_dropped() {
        let t = NodeTier::new(Duration::from_millis(300), Duration::from_millis(50), 100);
        assert_eq!(t.get(&key("a")), None);
        t.remember(key("a"), vec![1, 2]);
        t.holder_failed(&key("a"), 1);
        assert_eq!(t.get(&key("a")), Some(Known::Holders(Arc::new(vec![2]))));
        t.holder_failed(&key("a"), 2);
        assert_eq!(t.get(&key("a")), None);
        t.remember(key("b"), vec![]);
        assert_eq!(t.get(&key("b")), Some(Known::Nobody));
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(t.get(&key("b")), None, "negative answers expire sooner");
        t.hint(key("b"), 4);
        t.hint(key("b"), 5);
        t.hint(key("b"), 4);
        assert_eq!(
            t.get(&key("b")),
            Some(Known::Holders(Arc::new(vec![4, 5]))),
            "hints add holders once each"
        );
        t.remember(key("c"), vec![3]);
        std::thread::sleep(Duration::from_millis(350));
        assert_eq!(t.get(&key("c")), None);
    }
}
