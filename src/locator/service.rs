//! The locator of one daemon: its node tier, and the rack and global tables for the paths it
//! is home of, answering the locator RPCs that arrive on the control port. A rack home asks the
//! global home once per file however many members missed it; the queued members get their
//! answer when it arrives.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod answer;
mod global;
mod name_home;
mod rack;
mod suspects;

use super::check::Checks;
use super::fetching::Fetching;
use super::gossip::Liveness;
use super::hints::{self, Hints};
use super::membership::{Membership, NodeId};
use super::names::{HoldingsFn, ReleaseFn};
use super::node::{Known, NodeTier};
use super::pages::batches;
use super::peers::Peers;
use super::proto::{Msg, PageMap};
use super::tiers::{Key, Reply};
use super::watching::{Wait, Waiting};
use crate::core::Version;
use crate::core::names::{Name, NameJournal};
use crate::core::sync::lock;
use crate::stats::Stats;
use crate::transport::TransportError;
use global::Global;
use name_home::NameHome;
use rack::{Rack, RackStep};
use suspects::Suspects;

/// One daemon's locator: a facade over its parts, each a struct with its own file: the rack
/// home's side (`service/rack.rs`), the global home's (`service/global.rs`), the name home's
/// (`service/name_home.rs`), the suspects (`service/suspects.rs`), beside the node tier, the
/// hints and the fetches. Its own methods are here (calls to a member, lookups, publishes),
/// in `service/answer.rs` (what it answers) and in `failover.rs` (what it asks of and tells
/// every member: rejoins, deaths and returns, the named-objects sweep).
pub struct LocatorService {
    pub membership: Membership,
    pub node: NodeTier,
    /// When to fill the node tier from the global homes' feeds.
    hints: Hints,
    /// The files this node is rack home of.
    pub(super) rack: Rack,
    /// The files this node is global home of.
    global: Global,
    /// Produced names of the directories this node is name home (or backup) of.
    pub(super) names: NameHome,
    /// This node's readers waiting for names, woken by their homes' `NamesAre`.
    pub waiting: Arc<Waiting>,
    /// What the daemon does for the locator (release, holdings, bad chunks).
    pub(super) hooks: Hooks,
    /// Bound on every RPC and on how long a fetch may hold off the others.
    pub timeout: Duration,
    /// Nodes that recently failed an RPC or a pull, tried last (see [`Suspects`]).
    pub(super) suspects: Suspects,
    /// Who the cluster declared down (gossip): never asked, never waited on; the paths they
    /// were home of go to the next member in rendezvous order.
    pub liveness: Arc<Liveness>,
    /// Files this node was told to fetch from the shared file system (see [`Fetching`]).
    fetching: Mutex<Fetching>,
    /// How messages reach the other members.
    peers: Arc<dyn Peers>,
    pub(super) stats: Arc<Stats>,
}

/// Which pages of its copy of (path, version) this node has, in the window of byte `offset`
/// (see [`Msg::PagesOf`]); `None` if it holds none.
pub type PagesFn = Box<dyn Fn(&str, Version, u64) -> Option<PageMap> + Send + Sync>;

/// Checks a chunk (path, version, offset) of this node's cache again.
pub type BadChunkFn = Box<dyn Fn(&str, Version, u64) + Send + Sync>;

/// What the daemon around the locator does when a peer's message concerns this node's own
/// copies; given at construction (the locator knows no cache or file system).
pub struct Hooks {
    /// Told a produced object of ours is no longer named.
    pub on_release: ReleaseFn,
    /// The copies this node holds, complete or in part (re-announced to a home that restarted
    /// or took over from a dead one).
    pub holdings: HoldingsFn,
    /// Which pages of a copy this node has, for a peer about to pull some.
    pub pages_of: PagesFn,
    /// A puller reports a chunk of ours failed its checksum: check it again in the cache.
    pub on_bad_chunk: BadChunkFn,
    /// Where the names this node holds (as home or backup) are kept for its next start.
    pub journal: Option<Arc<dyn NameJournal>>,
}

impl Default for Hooks {
    /// A node that holds nothing and does nothing when told about its copies.
    fn default() -> Hooks {
        Hooks {
            on_release: Box::new(|_, _, _, _| {}),
            holdings: Box::new(|_| {}),
            pages_of: Box::new(|_, _, _| None),
            on_bad_chunk: Box::new(|_, _, _| {}),
            journal: None,
        }
    }
}

/// How long the node tier keeps an answer (or a hint).
const NODE_TTL: Duration = Duration::from_secs(30);

impl LocatorService {
    pub fn new(
        membership: Membership,
        timeout: Duration,
        stats: Arc<Stats>,
        peers: Arc<dyn Peers>,
        hooks: Hooks,
    ) -> Arc<Self> {
        Arc::new(LocatorService {
            membership,
            node: NodeTier::new(NODE_TTL, Duration::from_millis(500), 1 << 20),
            hints: Hints::new(NODE_TTL),
            rack: Rack::new(stats.clone()),
            global: Global::new(stats.clone()),
            names: NameHome::new(hooks.journal.clone(), stats.clone()),
            waiting: Arc::default(),
            hooks,
            timeout,
            suspects: Suspects::default(),
            liveness: Arc::default(),
            fetching: Mutex::default(),
            peers,
            stats,
        })
    }

    pub fn me(&self) -> NodeId {
        self.membership.own()
    }

    /// A reader of this node waits for `name` of `dir`: its slot, which the name's home fills
    /// when told of it (the caller registers it there with `NameWatch`).
    pub fn wait_for_name(&self, dir: &str, name: &str) -> Wait<'_> {
        self.waiting.register(dir, name)
    }

    /// The names this node's readers wait for now.
    pub fn names_waited(&self) -> Vec<super::watching::Key> {
        self.waiting.keys()
    }

    /// Names published, from a home (pushed, or its answer to a `NameWatch`): their readers
    /// here wake with them.
    pub fn names_are(&self, found: &[(String, String, Name)]) {
        for (dir, name, n) in found {
            self.waiting.deliver(dir, name, n);
        }
    }

    /// The rack home of `path` in `rack` among the members not known to be down.
    pub fn rack_home(&self, path: &str, rack: &str) -> NodeId {
        let down = |n| self.liveness.is_down(n);
        self.membership.live_rack_home(path, rack, down)
    }

    /// The global (and name) home of `path` among the members not known to be down.
    pub fn global_home(&self, path: &str) -> NodeId {
        self.membership
            .live_global_home(path, |n| self.liveness.is_down(n))
    }

    /// The names this node held before it restarted (its journal's), back in its table before
    /// it serves: a restart of every node of a job, or of a lone home, loses none.
    /// `max_per_uid`: the most names one user may own here (`--max-names-per-user`).
    pub fn restore_names(
        &self,
        names: impl IntoIterator<Item = ((String, String), Name)>,
        max_per_uid: u64,
    ) {
        self.names.restore(names, max_per_uid)
    }

    pub fn suspect(&self, node: NodeId) {
        self.suspects.suspect(node)
    }

    /// A call to or pull from `node` failed with `error`: it becomes suspect, unless it only
    /// ran out of a short wait (see `Suspects::failed`).
    pub fn failed(&self, node: NodeId, error: &TransportError) {
        self.suspects.failed(node, error, self.timeout)
    }

    /// Nodes that failed within the last 30 seconds (see `Suspects::list`).
    pub fn suspects(&self) -> Vec<NodeId> {
        self.suspects.list()
    }

    /// Whether a request's paths, names and node ids are well formed and known, and a message
    /// that speaks for its sender comes from it (`peer`, the authenticated id): see
    /// [`Checks::check`].
    pub(super) fn check(&self, msg: &Msg, peer: Option<NodeId>) -> Result<(), String> {
        let (membership, liveness) = (&self.membership, &self.liveness);
        Checks {
            membership,
            liveness,
        }
        .check(msg, peer)
    }

    /// Sends a message to `to`, or handles it here when this node is the addressee.
    pub async fn call(self: &Arc<Self>, to: NodeId, msg: Msg) -> Option<Msg> {
        self.call_within(to, msg, self.timeout).await
    }

    /// As [`LocatorService::call`], waiting at most `within`.
    pub async fn call_within(
        self: &Arc<Self>,
        to: NodeId,
        msg: Msg,
        timeout: Duration,
    ) -> Option<Msg> {
        if to == self.me() {
            // Boxed: answering may call again (rack home -> global home on this node).
            return Some(Box::pin(self.clone().answer(Some(self.me()), msg)).await);
        }
        let addr = self.reachable(to)?;
        self.outcome(to, self.rpc(to, addr, &msg, timeout).await)
    }

    /// As [`LocatorService::call_within`], to the one member that can answer (a directory's
    /// name home): asked even while suspect here, as no other node answers for its names (a
    /// suspect holder is passed over for another copy; a name has no other copy to ask). Only
    /// a home declared down is not asked: its directories have moved to the next member.
    pub async fn call_home(
        self: &Arc<Self>,
        to: NodeId,
        msg: Msg,
        timeout: Duration,
    ) -> Option<Msg> {
        if to == self.me() || self.liveness.is_down(to) {
            return self.call_within(to, msg, timeout).await;
        }
        let addr = self.membership.member(to)?.addr;
        self.outcome(to, self.rpc(to, addr, &msg, timeout).await)
    }

    /// As [`LocatorService::call`], from a plain thread (a FUSE request's), with blocking I/O:
    /// the reply wakes the thread directly. `runtime` answers messages addressed to this node.
    /// Waits at most `within` (and the peer timeout); with no time left, asks nobody.
    fn call_from_thread(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        to: NodeId,
        msg: Msg,
        within: Duration,
    ) -> Option<Msg> {
        let within = within.min(self.timeout);
        if within.is_zero() {
            // (A socket refuses a zero timeout, an error that would make `to` suspect.)
            return None;
        }
        if to == self.me() {
            let answer = self.clone().answer(Some(self.me()), msg);
            // (The timer is made inside the runtime: block_on enters its context.)
            return runtime
                .block_on(async move { tokio::time::timeout(within, answer).await })
                .ok();
        }
        let addr = self.reachable(to)?;
        self.stats.locator_calls.fetch_add(1, Ordering::Relaxed);
        let reply = self.peers.call_blocking(to, addr, &msg, within);
        self.outcome(to, reply)
    }

    /// Which pages `holder` has of `path` at `version`, in the window of byte `offset`:
    /// `Some(None)` if it holds no copy, `None` if it did not say (then pulling is the way to
    /// find out). From a plain thread, like [`LocatorService::locate`].
    pub fn pages_of(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        holder: NodeId,
        (path, version, offset): (&str, Version, u64),
        within: Duration,
    ) -> Option<Option<PageMap>> {
        let msg = Msg::PagesOf {
            path: path.to_string(),
            version,
            offset,
        };
        match self.call_from_thread(runtime, holder, msg, within)? {
            Msg::PagesAre(map) => Some(map),
            other => {
                tracing::debug!(holder, reply = other.kind(), "no page map");
                None
            }
        }
    }

    /// Counts a message that arrived from another node, to be answered (`locator_answers`:
    /// one per round trip, a batch once), as its sender counted it in `locator_calls`.
    pub fn arrived(&self) {
        self.stats.locator_answers.fetch_add(1, Ordering::Relaxed);
    }

    /// One locator message to member `to` at `addr` and its answer, through the port.
    pub(super) async fn rpc(
        &self,
        to: NodeId,
        addr: std::net::SocketAddr,
        msg: &Msg,
        timeout: Duration,
    ) -> Result<Msg, TransportError> {
        self.stats.locator_calls.fetch_add(1, Ordering::Relaxed);
        self.peers.call(to, addr, msg, timeout).await
    }

    /// The address of `to`, unless it is down or suspect (then a call to it is a miss at once).
    fn reachable(&self, to: NodeId) -> Option<std::net::SocketAddr> {
        if self.liveness.is_down(to) || self.suspects().contains(&to) {
            return None;
        }
        Some(self.membership.member(to)?.addr)
    }

    /// A call's reply, checked as a request would be (see [`LocatorService::check`]); a failed
    /// call, or a reply that fails the check, makes its addressee suspect.
    pub(super) fn outcome(&self, to: NodeId, r: Result<Msg, TransportError>) -> Option<Msg> {
        match r {
            Ok(m) => match self.check(&m, Some(to)) {
                Ok(()) => Some(m),
                Err(why) => {
                    tracing::warn!(node = to, %why, "refused a locator reply");
                    self.suspect(to);
                    None
                }
            },
            Err(e) => {
                tracing::warn!(node = to, error = %e, "locator RPC failed");
                self.failed(to, &e);
                None
            }
        }
    }

    /// What this node should do about a file it misses. Called from a FUSE request's thread;
    /// `runtime` answers the question when this node is the path's rack home.
    pub fn locate(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        path: &str,
        version: Version,
        within: Duration,
    ) -> Reply {
        let key: Key = (path.to_string(), version);
        if let Some(Known::Holders(h)) = self.node.get(&key) {
            self.stats.lookups_node.fetch_add(1, Ordering::Relaxed);
            return Reply::Holders(h.to_vec());
        }
        self.stats.lookups_rack.fetch_add(1, Ordering::Relaxed);
        let rack_home = self.rack_home(path, self.membership.rack_of(self.me()));
        let msg = Msg::Lookup {
            path: path.to_string(),
            version,
            requester: self.me(),
            global: false,
        };
        let started = Instant::now();
        let span = tracing::debug_span!("locate", path, tier = "rack").entered();
        let answer = if rack_home == self.me() && self.check(&msg, Some(rack_home)).is_ok() {
            Some(self.rack_lookup_from_thread(runtime, key.clone(), rack_home, within))
        } else {
            self.call_from_thread(runtime, rack_home, msg, within)
        };
        drop(span);
        self.stats.latency.lookup("rack", started);
        match answer {
            Some(Msg::Located(l)) => {
                let r = l;
                match &r {
                    Reply::Holders(h) => {
                        self.node.remember(key, h.clone());
                        if let Some(from_start) = self.hints.answered(Instant::now()) {
                            runtime.spawn(self.clone().read_hints(from_start));
                        }
                    }
                    Reply::Fetch => lock(&self.fetching).start(key),
                    Reply::WaitFor(_) => {}
                }
                r
            }
            // An unreachable home is a miss: read the backing store.
            _ => Reply::Fetch,
        }
    }

    /// Reads the global homes' feeds of copies gained into the node tier (see [`hints`]): from
    /// their start, or on from where the last read stopped. Every rack's copies are taken (a
    /// feed names the first copy in each rack): a file held only in another rack is then pulled
    /// from there without asking the rack home, whose answer would have named the same holder
    /// after a second round trip (to the global home). A holder in this node's rack is still
    /// preferred where one is known ([`super::tiers::pick_holder`]); one its rack gains after
    /// the read is passed over until the hint expires. Another rack's copies are hinted once the
    /// home's feed has been read, after its copies in this node's rack: a file's copies are all
    /// in its global home's feed, so a reader never finds only the far holder of a file whose
    /// near one the same read names. Produced objects are left out (their producer is their
    /// holder, named in their key); so are this node's own copies.
    async fn read_hints(self: Arc<Self>, from_start: bool) {
        let homes: Vec<NodeId> = self.membership.members().map(|m| m.id).collect();
        let rack = self.membership.rack_of(self.me()).to_string();
        let (mut learned, mut read) = (0, 0);
        for home in homes {
            let mut after = if from_start {
                0
            } else {
                self.hints.position(home)
            };
            let mut elsewhere = Vec::new();
            while read < hints::MOST_PER_READ {
                let ask = Msg::Gained {
                    after,
                    max: hints::PAGE,
                };
                let Some(Msg::GainedList { next, copies }) = self.call(home, ask).await else {
                    break;
                };
                // (A page holds fewer than asked when its paths are long: only an empty one,
                // or one that did not move, is the end.)
                let last = copies.is_empty() || next == after;
                read += copies.len();
                for (path, version, node) in copies {
                    if node == self.me() || crate::core::names::is_object(&path) {
                        continue;
                    }
                    if self.membership.rack_of(node) == rack {
                        self.node.hint((path, version), node);
                    } else {
                        elsewhere.push(((path, version), node));
                    }
                    learned += 1;
                }
                self.hints.advanced(home, next);
                if last {
                    break;
                }
                after = next;
            }
            for (key, node) in elsewhere {
                self.node.hint(key, node);
            }
        }
        self.hints.done(learned);
        self.stats
            .locator_hints
            .fetch_add(learned as u64, Ordering::Relaxed);
    }

    /// `path` at `version` is complete here, or was dropped: nothing is left to fill for the
    /// peers that wait on this node's fetch of it.
    pub fn fetched(&self, path: &str, version: Version) {
        lock(&self.fetching).done(path, version);
    }

    /// Whether this node is the designated fetcher of `path` at `version`: peers waiting for it
    /// may make it fill chunks it has not read yet.
    pub fn is_fetching(&self, path: &str, version: Version) -> bool {
        lock(&self.fetching).has(path, version)
    }

    /// The copies racks gained that global home `home` recorded after position `after` of its
    /// feed (at most `max`), and the position to ask from next; `None` if it did not answer.
    /// From a plain thread, like [`LocatorService::locate`].
    pub fn gained(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        home: NodeId,
        after: u64,
        max: u32,
    ) -> Option<(u64, Vec<(Key, NodeId)>)> {
        match self.call_from_thread(runtime, home, Msg::Gained { after, max }, self.timeout)? {
            Msg::GainedList { next, copies } => Some((
                next,
                copies
                    .into_iter()
                    .map(|(path, version, node)| ((path, version), node))
                    .collect(),
            )),
            other => {
                tracing::warn!(reply = ?other, "unexpected answer to Gained");
                None
            }
        }
    }

    /// Tells the rack homes that this node gained (`true`) or lost a complete copy of each
    /// file, one RPC per home (concurrently). Returns which were acknowledged; the caller
    /// retries the others (their home is unreachable).
    pub async fn publish(self: &Arc<Self>, changes: &[(String, Version, bool)]) -> Vec<bool> {
        let rack = self.membership.rack_of(self.me());
        let mut by_home: HashMap<NodeId, Vec<usize>> = HashMap::new();
        for (i, (path, _, _)) in changes.iter().enumerate() {
            by_home
                .entry(self.rack_home(path, rack))
                .or_default()
                .push(i);
        }
        let mut calls = tokio::task::JoinSet::new();
        for (home, items) in by_home {
            let msgs = items
                .iter()
                .map(|&i| Msg::Publish {
                    path: changes[i].0.clone(),
                    version: changes[i].1,
                    node: self.me(),
                    held: changes[i].2,
                })
                .collect();
            // A dead home's copies may be many: each batch within a page.
            let mut items = items.into_iter();
            for batch in batches(msgs) {
                let items: Vec<usize> = items.by_ref().take(batch.len()).collect();
                let me = self.clone();
                calls.spawn(async move { (items, me.call(home, Msg::Batch(batch)).await) });
            }
        }
        let mut acked = vec![false; changes.len()];
        while let Some(Ok((items, reply))) = calls.join_next().await {
            if let Some(Msg::Batch(replies)) = reply {
                for (i, r) in items.into_iter().zip(replies) {
                    acked[i] = r == Msg::Ack;
                }
            }
        }
        let n = acked.iter().filter(|&&a| a).count();
        (self.stats.copies_published).fetch_add(n as u64, Ordering::Relaxed);
        acked
    }

    pub async fn fetch_failed(self: &Arc<Self>, path: &str, version: Version) {
        let msg = Msg::FetchFailed {
            path: path.to_string(),
            version,
            node: self.me(),
        };
        self.call(self.global_home(path), msg).await;
    }

    /// The rack home's answer to a lookup of `key` by `requester`: from its table, after the
    /// lookup queued before it is answered, or from the global home.
    async fn rack_lookup(self: &Arc<Self>, key: Key, requester: NodeId) -> Msg {
        match self.rack.step(&key, requester) {
            RackStep::Answer(r) => Msg::Located(r),
            RackStep::Queued(rx) => {
                // Unanswered in time: read it from the backing store.
                let r = tokio::time::timeout(self.timeout, rx).await;
                Msg::Located(r.ok().and_then(Result::ok).unwrap_or(Reply::Fetch))
            }
            RackStep::AskGlobal => {
                let home = self.global_home(&key.0);
                let msg = rack::global_lookup(&key, requester);
                let started = Instant::now();
                // Within half a peer timeout: a frozen global home then costs this rack
                // home's askers (who wait a whole one for it) an answer, "read it yourself",
                // not a timeout that makes this live node look frozen to them.
                let reply = self.call_within(home, msg, self.timeout / 2).await;
                self.stats.latency.lookup("global", started);
                self.rack.told(key, requester, reply)
            }
        }
    }

    /// As [`LocatorService::rack_lookup`], on this node from a plain thread (a FUSE request's,
    /// when this node is the path's rack home), the global home asked with blocking I/O: from
    /// inside the runtime its reply would wake a runtime thread that then wakes this one, two
    /// context switches more per miss. Waits at most `within` (and the peer timeout).
    fn rack_lookup_from_thread(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        key: Key,
        requester: NodeId,
        within: Duration,
    ) -> Msg {
        let within = within.min(self.timeout);
        match self.rack.step(&key, requester) {
            RackStep::Answer(r) => Msg::Located(r),
            RackStep::Queued(rx) => {
                // (No I/O: the answer comes through the channel, which wakes this thread.)
                let r = runtime.block_on(async move { tokio::time::timeout(within, rx).await });
                Msg::Located(r.ok().and_then(Result::ok).unwrap_or(Reply::Fetch))
            }
            RackStep::AskGlobal => {
                let home = self.global_home(&key.0);
                let msg = rack::global_lookup(&key, requester);
                let started = Instant::now();
                let reply = self.call_from_thread(runtime, home, msg, within.min(self.timeout / 2));
                self.stats.latency.lookup("global", started);
                self.rack.told(key, requester, reply)
            }
        }
    }

    /// Sends `msgs` to `to` as [`batches`], one after another; returns how many of the
    /// messages were acknowledged (a batch that failed counts none of its own).
    pub(super) async fn call_batches(self: &Arc<Self>, to: NodeId, msgs: Vec<Msg>) -> usize {
        let mut acked = 0;
        for batch in batches(msgs) {
            if let Some(Msg::Batch(replies)) = self.call(to, Msg::Batch(batch)).await {
                acked += replies.iter().filter(|r| **r == Msg::Ack).count();
            }
        }
        acked
    }
}
