//! The rack and global tiers as pure state machines (no sockets, no clocks of their own), so
//! they are unit-tested and simulated at scale in one process (`examples/locator_sim.rs`); the
//! daemon feeds them messages from the control channel.
//!
//! A member that misses a file asks its rack home. The rack home answers with rack-local
//! holders, or asks the global home once per file however many members missed it (the others
//! queue at the rack home). The global home answers with one holder per rack that has the
//! file, or coordinates the first fetch: one requester reads the backing store, everybody else
//! waits for it (bounded), so the backing store is read once. A rack home tells the global home
//! only when its rack gains its first copy or loses its last.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::membership::{Membership, NodeId};
use super::table::{self, Few, HomeKey, Table};
use crate::core::Version;

pub use super::table::Key;

/// What a member is told to do about a file it misses.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Reply {
    /// Pull from one of these holders (choose with [`pick_holder`]).
    Holders(Vec<NodeId>),
    /// Nobody has it: read the backing store, then publish.
    Fetch,
    /// Another node is fetching or pulling it: wait (bounded) for it to publish, then pull.
    WaitFor(NodeId),
}

/// What a rack home does with a member's miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RackLookup {
    /// Answer the member now.
    Reply(Reply),
    /// Ask the global home (the first miss of this file in the rack).
    AskGlobal,
    /// A question about this file is already out: the member waits for its answer.
    Queued,
}

#[derive(Debug)]
pub struct RackHome {
    /// The rack's holders of each file it holds (see [`table`] for the row's size).
    holders: Table<Few<NodeId>>,
    /// Members waiting for the global home's answer (transient: a row per question out).
    pending: HashMap<Key, Vec<NodeId>>,
}

impl Default for RackHome {
    fn default() -> Self {
        RackHome {
            holders: table::table(),
            pending: HashMap::new(),
        }
    }
}

impl RackHome {
    pub fn lookup(&mut self, key: &Key, requester: NodeId) -> RackLookup {
        if let Some(h) = self.holders.get(key) {
            return RackLookup::Reply(Reply::Holders(h.as_slice().to_vec()));
        }
        match self.pending.get_mut(key) {
            Some(waiting) => {
                waiting.push(requester);
                RackLookup::Queued
            }
            None => {
                self.pending.insert(key.clone(), vec![requester]);
                RackLookup::AskGlobal
            }
        }
    }

    /// The global home answered: what each queued member is told. When the first is told to
    /// fetch, the others wait for it (and pull each chunk from it as it arrives); otherwise
    /// they are told what the first was (pull from those holders, or wait for the same
    /// fetcher): a rack-mate still pulling a large file could serve them nothing yet.
    pub fn global_answered(&mut self, key: &Key, answer: Reply) -> Vec<(NodeId, Reply)> {
        let waiting = self.pending.remove(key).unwrap_or_default();
        let Some((&first, rest)) = waiting.split_first() else {
            return Vec::new();
        };
        let others = match &answer {
            Reply::Fetch => Reply::WaitFor(first),
            other => other.clone(),
        };
        let mut out = vec![(first, answer)];
        out.extend(rest.iter().map(|&n| (n, others.clone())));
        out
    }

    /// The global home could not be reached: queued members fall back to the backing store.
    pub fn global_unreachable(&mut self, key: &Key) -> Vec<(NodeId, Reply)> {
        let waiting = self.pending.remove(key).unwrap_or_default();
        waiting.into_iter().map(|n| (n, Reply::Fetch)).collect()
    }

    /// A member completed a copy. `true`: the rack's first copy, tell the global home.
    pub fn publish(&mut self, key: &Key, node: NodeId) -> bool {
        match self.holders.get_mut(key) {
            Some(h) => {
                if !h.as_slice().contains(&node) {
                    *h = h.with(node, |n| *n == node);
                }
                false
            }
            None => {
                self.holders.insert(HomeKey::from(key), Few::One(node));
                true
            }
        }
    }

    /// A member dropped its copy. `true`: the rack's last copy, tell the global home.
    pub fn unpublish(&mut self, key: &Key, node: NodeId) -> bool {
        let Some(h) = self.holders.get_mut(key) else {
            return false;
        };
        if !h.as_slice().contains(&node) {
            return false;
        }
        match h.without(|n| *n == node) {
            Some(rest) => {
                *h = rest;
                false
            }
            None => {
                self.holders.remove(key);
                true
            }
        }
    }

    /// Files the rack holds (rows of the table).
    pub fn files(&self) -> usize {
        self.holders.len()
    }

    pub fn holders(&self, key: &Key) -> Vec<NodeId> {
        self.holders
            .get(key)
            .map(|h| h.as_slice().to_vec())
            .unwrap_or_default()
    }

    /// Every file the rack holds, with one of its holders.
    pub fn held(&self) -> impl Iterator<Item = ((&str, Version), NodeId)> {
        self.holders
            .iter()
            .map(|(k, h)| ((&*k.path, k.version), h.as_slice()[0]))
    }
}

#[derive(Debug)]
pub struct GlobalHome {
    /// The racks holding each file, as (rack number in `rack_names`, a member of the rack
    /// that held it when the rack gained it), one per rack (see [`table`] for the row's size).
    racks: Table<Few<(u32, NodeId)>>,
    /// Rack names, numbered in order of appearance (a few hundred at most).
    rack_names: Vec<Box<str>>,
    /// Files nobody holds that a requester was told to fetch, with its deadline. Transient:
    /// removed when a rack gains the file or the fetch fails; rows past their deadline are
    /// swept when the map grows ([`FETCHES_SWEPT`]).
    fetching: HashMap<Key, (NodeId, Instant)>,
    /// Every rack's first copy of a file, in arrival order: the feed replicating nodes read
    /// with [`GlobalHome::gained_since`]. Bounded: the oldest go first ([`MAX_FEED`]).
    gained: std::collections::VecDeque<(HomeKey, NodeId)>,
    /// The feed position of `gained[0]`.
    base: u64,
}

impl Default for GlobalHome {
    fn default() -> Self {
        GlobalHome {
            racks: table::table(),
            rack_names: Vec::new(),
            fetching: HashMap::new(),
            gained: Default::default(),
            base: 0,
        }
    }
}

/// Copies a global home's feed keeps (about 40 bytes each, the path shared with the table): a
/// replicating node that falls further behind skips the oldest (readers still find those
/// copies through the locator).
pub const MAX_FEED: usize = 1 << 18;

/// Fetches in flight past which the overdue ones are swept (a fetcher that died without
/// reporting leaves its row behind until then).
const FETCHES_SWEPT: usize = 1 << 14;

impl GlobalHome {
    /// A rack home asks on behalf of `requester`, a member that missed the file.
    pub fn lookup(
        &mut self,
        key: &Key,
        requester: NodeId,
        now: Instant,
        fetch_timeout: Duration,
    ) -> Reply {
        if let Some(racks) = self.racks.get(key) {
            // One holder per rack, in the order of the racks' names.
            let mut by_name: Vec<(&str, NodeId)> = racks
                .as_slice()
                .iter()
                .map(|&(r, n)| (&*self.rack_names[r as usize], n))
                .collect();
            by_name.sort_unstable();
            return Reply::Holders(by_name.into_iter().map(|(_, n)| n).collect());
        }
        match self.fetching.get(key) {
            Some(&(f, deadline)) if now < deadline && f != requester => Reply::WaitFor(f),
            _ => {
                // No fetch under way, or it overran its deadline: this requester fetches.
                if self.fetching.len() >= FETCHES_SWEPT {
                    self.fetching.retain(|_, (_, deadline)| now < *deadline);
                }
                self.fetching
                    .insert(key.clone(), (requester, now + fetch_timeout));
                Reply::Fetch
            }
        }
    }

    /// The number of rack `name`, numbered on first sight.
    fn rack_number(&mut self, name: &str) -> u32 {
        match self.rack_names.iter().position(|r| **r == *name) {
            Some(i) => i as u32,
            None => {
                self.rack_names.push(name.into());
                (self.rack_names.len() - 1) as u32
            }
        }
    }

    pub fn rack_gained(&mut self, key: &Key, rack: &str, node: NodeId) {
        let r = self.rack_number(rack);
        let row = match self.racks.get_key_value_mut(key) {
            Some((k, racks)) => {
                *racks = racks.with((r, node), |(other, _)| *other == r);
                k.clone()
            }
            None => {
                let k = HomeKey::from(key);
                self.racks.insert(k.clone(), Few::One((r, node)));
                k
            }
        };
        self.fetching.remove(key);
        self.gained.push_back((row, node));
        if self.gained.len() > MAX_FEED {
            self.gained.pop_front();
            self.base += 1;
        }
    }

    /// Up to `max` copies gained after position `after` of the feed, and the position to ask
    /// from next. A position beyond the feed (this home restarted) starts again from 0. A copy
    /// may have been dropped since: its node then refuses the pull.
    pub fn gained_since(&self, after: u64, max: usize) -> (u64, Vec<(Key, NodeId)>) {
        let end = self.feed_end();
        // Past the end (this home restarted) or before the oldest kept: from the oldest.
        let from = if after > end || after < self.base {
            self.base
        } else {
            after
        };
        let skip = (from - self.base) as usize;
        let out: Vec<(Key, NodeId)> = self
            .gained
            .iter()
            .skip(skip)
            .take(max)
            .map(|(k, n)| (k.to_key(), *n))
            .collect();
        (from + out.len() as u64, out)
    }

    /// The feed position after its newest copy: how many copies it has recorded.
    pub fn feed_end(&self) -> u64 {
        self.base + self.gained.len() as u64
    }

    pub fn rack_lost(&mut self, key: &Key, rack: &str) {
        let Some(r) = self.rack_names.iter().position(|n| **n == *rack) else {
            return;
        };
        if let Some(racks) = self.racks.get_mut(key) {
            match racks.without(|(other, _)| *other as usize == r) {
                Some(rest) => *racks = rest,
                None => {
                    self.racks.remove(key);
                }
            }
        }
    }

    /// The designated fetcher gave up: the next requester is told to fetch.
    pub fn fetch_failed(&mut self, key: &Key, node: NodeId) {
        if self.fetching.get(key).is_some_and(|(f, _)| *f == node) {
            self.fetching.remove(key);
        }
    }

    /// Files some rack holds (rows of the table).
    pub fn files(&self) -> usize {
        self.racks.len()
    }

    pub fn racks_holding(&self, key: &Key) -> usize {
        self.racks.get(key).map_or(0, |r| r.as_slice().len())
    }
}

/// Chooses a holder: this node, else one in this rack, else one in another rack; among equals,
/// spread by `salt` (e.g. a hash of requester and path) so a hot file is served by many nodes.
/// Holders in `avoid` (recently failed) are used only if nothing else is left.
pub fn pick_holder(
    membership: &Membership,
    holders: &[NodeId],
    avoid: &[NodeId],
    salt: u64,
) -> Option<NodeId> {
    let me = membership.own();
    let my_rack = membership.rack_of(me);
    let known: Vec<NodeId> = holders
        .iter()
        .copied()
        .filter(|h| membership.member(*h).is_some())
        .collect();
    let fresh: Vec<NodeId> = known
        .iter()
        .copied()
        .filter(|h| !avoid.contains(h))
        .collect();
    let pool = if fresh.is_empty() { known } else { fresh };
    if pool.contains(&me) {
        return Some(me);
    }
    let local: Vec<NodeId> = pool
        .iter()
        .copied()
        .filter(|h| membership.rack_of(*h) == my_rack)
        .collect();
    let tier = if local.is_empty() { pool } else { local };
    (!tier.is_empty()).then(|| tier[(salt % tier.len() as u64) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn key(p: &str) -> Key {
        (
            p.to_string(),
            Version {
                size: 10,
                mtime_ns: 1,
            },
        )
    }

    #[test]
    fn rack_home_coalesces_misses_and_reports_first_and_last_copy() {
        let mut r = RackHome::default();
        let k = key("a");
        assert_eq!(r.lookup(&k, 1), RackLookup::AskGlobal);
        assert_eq!(r.lookup(&k, 2), RackLookup::Queued);
        assert_eq!(r.lookup(&k, 3), RackLookup::Queued);
        let told = r.global_answered(&k, Reply::Fetch);
        assert_eq!(
            told,
            [
                (1, Reply::Fetch),
                (2, Reply::WaitFor(1)),
                (3, Reply::WaitFor(1))
            ]
        );
        // Told to pull, or to wait for another rack's fetcher: the others are told the same.
        for answer in [Reply::Holders(vec![7, 8]), Reply::WaitFor(9)] {
            let k = key("b");
            assert_eq!(r.lookup(&k, 1), RackLookup::AskGlobal);
            assert_eq!(r.lookup(&k, 2), RackLookup::Queued);
            let told = r.global_answered(&k, answer.clone());
            assert_eq!(told, [(1, answer.clone()), (2, answer)]);
        }
        assert!(r.publish(&k, 1));
        assert!(!r.publish(&k, 2));
        assert_eq!(
            r.lookup(&k, 4),
            RackLookup::Reply(Reply::Holders(vec![1, 2]))
        );
        assert!(!r.unpublish(&k, 1));
        assert!(r.unpublish(&k, 2));
        assert!(r.holders(&k).is_empty());
        assert!(!r.unpublish(&k, 2), "unpublishing twice reports nothing");
    }

    #[test]
    fn global_home_lets_one_node_fetch_and_the_others_wait() {
        let mut g = GlobalHome::default();
        let k = key("a");
        let t = Instant::now();
        let timeout = Duration::from_secs(5);
        assert_eq!(g.lookup(&k, 1, t, timeout), Reply::Fetch);
        assert_eq!(g.lookup(&k, 7, t, timeout), Reply::WaitFor(1));
        // The fetcher overran its deadline: the next requester takes over.
        assert_eq!(g.lookup(&k, 7, t + timeout, timeout), Reply::Fetch);
        g.fetch_failed(&k, 7);
        assert_eq!(g.lookup(&k, 9, t, timeout), Reply::Fetch);
        g.rack_gained(&k, "r1", 9);
        assert_eq!(g.lookup(&k, 1, t, timeout), Reply::Holders(vec![9]));
        g.rack_gained(&k, "r0", 1);
        assert_eq!(g.racks_holding(&k), 2);
        g.rack_lost(&k, "r1");
        g.rack_lost(&k, "r0");
        assert_eq!(g.lookup(&k, 3, t, timeout), Reply::Fetch);
    }

    #[test]
    fn global_home_feeds_gained_copies_in_order_from_a_position() {
        let mut g = GlobalHome::default();
        assert_eq!(g.gained_since(0, 10), (0, vec![]));
        g.rack_gained(&key("a"), "r0", 1);
        g.rack_gained(&key("b"), "r1", 2);
        g.rack_gained(&key("a"), "r1", 3);
        assert_eq!(
            g.gained_since(0, 2),
            (2, vec![(key("a"), 1), (key("b"), 2)])
        );
        assert_eq!(g.gained_since(2, 2), (3, vec![(key("a"), 3)]));
        assert_eq!(g.gained_since(3, 2), (3, vec![]));
        assert_eq!(
            g.gained_since(99, 1),
            (1, vec![(key("a"), 1)]),
            "a position past the end (the home restarted) starts over"
        );
        // The feed keeps the newest MAX_FEED copies; a reader behind them resumes at the oldest.
        for i in 0..MAX_FEED + 5 {
            g.rack_gained(&key(&format!("k{i}")), "r0", 1);
        }
        let (next, copies) = g.gained_since(0, 1);
        assert_eq!(copies.len(), 1);
        assert_eq!(
            next,
            3 + 5 + 1,
            "3 first copies and 5 more fell out of the feed"
        );
        assert_eq!(g.gained.len(), MAX_FEED);
    }

    #[test]
    fn holder_choice_prefers_self_then_rack_and_avoids_failures() {
        let file = "0 127.0.0.1:1 r0\n1 127.0.0.1:2 r0\n2 127.0.0.1:3 r1\n3 127.0.0.1:4 r1\n";
        let m = Membership::parse(file, 0).unwrap();
        assert_eq!(pick_holder(&m, &[2, 0, 1], &[], 5), Some(0));
        assert_eq!(pick_holder(&m, &[2, 1, 3], &[], 5), Some(1));
        assert_eq!(pick_holder(&m, &[2, 1, 3], &[1], 5), Some(3));
        let spread: BTreeSet<_> = (0..10).map(|s| pick_holder(&m, &[2, 3], &[], s)).collect();
        assert_eq!(spread.len(), 2, "load spreads over holders");
        assert_eq!(
            pick_holder(&m, &[2], &[2], 0),
            Some(2),
            "a failed holder is a last resort"
        );
        assert_eq!(
            pick_holder(&m, &[42], &[], 0),
            None,
            "unknown nodes are ignored"
        );
    }
}

/// The tables under arbitrary message sequences (what a hostile or confused peer can send once
/// authenticated): no panic, and the answers agree with a plain model of who holds what.
#[cfg(test)]
mod model_tests {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Publish(u8, NodeId),
        Unpublish(u8, NodeId),
        RackLookup(u8, NodeId),
        GlobalAnswered(u8),
        GlobalUnreachable(u8),
        RackGained(u8, u8, NodeId),
        RackLost(u8, u8),
        GlobalLookup(u8, NodeId, u8),
        FetchFailed(u8, NodeId),
        GainedSince(u64, u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        let k = 0u8..4;
        let n = 0u32..6;
        prop_oneof![
            (k.clone(), n.clone()).prop_map(|(k, n)| Op::Publish(k, n)),
            (k.clone(), n.clone()).prop_map(|(k, n)| Op::Unpublish(k, n)),
            (k.clone(), n.clone()).prop_map(|(k, n)| Op::RackLookup(k, n)),
            k.clone().prop_map(Op::GlobalAnswered),
            k.clone().prop_map(Op::GlobalUnreachable),
            (k.clone(), 0u8..3, n.clone()).prop_map(|(k, r, n)| Op::RackGained(k, r, n)),
            (k.clone(), 0u8..3).prop_map(|(k, r)| Op::RackLost(k, r)),
            (k.clone(), n.clone(), 0u8..3).prop_map(|(k, n, t)| Op::GlobalLookup(k, n, t)),
            (k.clone(), n).prop_map(|(k, n)| Op::FetchFailed(k, n)),
            (any::<u64>(), any::<u32>()).prop_map(|(a, m)| Op::GainedSince(a, m)),
        ]
    }

    fn key(k: u8) -> Key {
        (
            format!("f{k}"),
            Version {
                size: 1,
                mtime_ns: 1,
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn tables_agree_with_a_model(ops in proptest::collection::vec(op(), 1..200)) {
            let mut rack = RackHome::default();
            let mut global = GlobalHome::default();
            let mut holders: HashMap<Key, BTreeSet<NodeId>> = HashMap::new();
            let mut pending: HashMap<Key, Vec<NodeId>> = HashMap::new();
            let mut racks: HashMap<Key, BTreeMap<String, NodeId>> = HashMap::new();
            let mut gained = 0u64;
            let t0 = Instant::now();
            for op in ops {
                match op {
                    Op::Publish(k, n) => {
                        let h = holders.entry(key(k)).or_default();
                        prop_assert_eq!(rack.publish(&key(k), n), h.is_empty());
                        h.insert(n);
                    }
                    Op::Unpublish(k, n) => {
                        let h = holders.entry(key(k)).or_default();
                        let last = h.remove(&n) && h.is_empty();
                        prop_assert_eq!(rack.unpublish(&key(k), n), last);
                    }
                    Op::RackLookup(k, n) => {
                        let h = holders.get(&key(k)).cloned().unwrap_or_default();
                        let got = rack.lookup(&key(k), n);
                        if !h.is_empty() {
                            prop_assert_eq!(
                                got,
                                RackLookup::Reply(Reply::Holders(h.into_iter().collect()))
                            );
                        } else {
                            let p = pending.entry(key(k)).or_default();
                            let want = if p.is_empty() {
                                RackLookup::AskGlobal
                            } else {
                                RackLookup::Queued
                            };
                            prop_assert_eq!(got, want);
                            p.push(n);
                        }
                    }
                    Op::GlobalAnswered(k) => {
                        let p = pending.remove(&key(k)).unwrap_or_default();
                        let out = rack.global_answered(&key(k), Reply::Fetch);
                        prop_assert_eq!(out.len(), p.len());
                        for (i, (n, r)) in out.into_iter().enumerate() {
                            prop_assert_eq!(n, p[i]);
                            let want = if i == 0 { Reply::Fetch } else { Reply::WaitFor(p[0]) };
                            prop_assert_eq!(r, want);
                        }
                    }
                    Op::GlobalUnreachable(k) => {
                        let p = pending.remove(&key(k)).unwrap_or_default();
                        let out = rack.global_unreachable(&key(k));
                        prop_assert_eq!(out.len(), p.len());
                        prop_assert!(out.iter().all(|(_, r)| *r == Reply::Fetch));
                    }
                    Op::RackGained(k, r, n) => {
                        global.rack_gained(&key(k), &format!("r{r}"), n);
                        racks.entry(key(k)).or_default().insert(format!("r{r}"), n);
                        gained += 1;
                    }
                    Op::RackLost(k, r) => {
                        global.rack_lost(&key(k), &format!("r{r}"));
                        if let Some(m) = racks.get_mut(&key(k)) {
                            m.remove(&format!("r{r}"));
                        }
                    }
                    Op::GlobalLookup(k, n, t) => {
                        let now = t0 + Duration::from_secs(u64::from(t) * 5);
                        let got = global.lookup(&key(k), n, now, Duration::from_secs(7));
                        let held = racks.get(&key(k)).cloned().unwrap_or_default();
                        if held.is_empty() {
                            prop_assert!(matches!(got, Reply::Fetch | Reply::WaitFor(_)));
                        } else {
                            prop_assert_eq!(got, Reply::Holders(held.into_values().collect()));
                        }
                    }
                    Op::FetchFailed(k, n) => global.fetch_failed(&key(k), n),
                    Op::GainedSince(after, max) => {
                        let (next, out) = global.gained_since(after, max as usize);
                        prop_assert!(out.len() <= max as usize);
                        prop_assert!(next <= gained);
                    }
                }
                for k in 0..4 {
                    let want = racks.get(&key(k)).map_or(0, |m| m.len());
                    prop_assert_eq!(global.racks_holding(&key(k)), want);
                }
            }
        }
    }
}
