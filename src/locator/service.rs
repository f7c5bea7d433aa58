//! The locator of one daemon: its node tier, and the rack and global tables for the paths it
//! is home of, answering the locator RPCs that arrive on the control port. A rack home asks the
//! global home once per file however many members missed it; the queued members get their
//! answer when it arrives.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::fetching::Fetching;
use super::gossip::Liveness;
use super::membership::{Membership, NodeId};
use super::names::{HoldingsFn, NameTable, NameWaits, ReleaseFn};
use super::node::{Known, NodeTier};
use super::pages::{self, PAGE_BYTES, batches};
use super::peers::Peers;
use super::proto::Msg;
use super::tiers::{GlobalHome, Key, RackHome, RackLookup, Reply};
use crate::core::Version;
use crate::core::names::{Name, NameJournal};
use crate::core::sync::lock;
use crate::stats::Stats;
use crate::transport::TransportError;

#[derive(Default)]
pub(super) struct RackState {
    pub(super) table: RackHome,
    /// Members queued behind a pending global question, per file.
    /// (A member may have several lookups of one file queued: its readahead threads.)
    pub(super) waiters: HashMap<(Key, NodeId), Vec<oneshot::Sender<Reply>>>,
}

pub struct LocatorService {
    pub membership: Membership,
    pub node: NodeTier,
    pub(super) rack: Mutex<RackState>,
    global: Mutex<GlobalHome>,
    /// Produced names of the directories this node is name home of.
    pub(super) names: Mutex<NameTable>,
    /// Lookups waiting here for names not set yet.
    pub(super) name_waits: NameWaits,
    /// What the daemon does for the locator (release, holdings, bad chunks).
    pub(super) hooks: Hooks,
    /// Bound on every RPC and on how long a fetch may hold off the others.
    pub timeout: Duration,
    /// Nodes that recently failed an RPC or a pull, and when: skipped as homes (a miss) and
    /// tried last as holders, so a dead or frozen node costs one timeout, not one per file.
    pub(super) suspects: Mutex<HashMap<NodeId, Instant>>,
    /// Who the cluster declared down (gossip): never asked, never waited on; the paths they
    /// were home of go to the next member in rendezvous order.
    pub liveness: Arc<Liveness>,
    /// Files this node was told to fetch from the shared file system (see [`Fetching`]).
    fetching: Mutex<Fetching>,
    /// How messages reach the other members.
    peers: Arc<dyn Peers>,
    pub(super) stats: Arc<Stats>,
}

/// Checks a chunk (path, version, offset) of this node's cache again.
pub type BadChunkFn = Box<dyn Fn(&str, Version, u64) + Send + Sync>;

/// What the daemon around the locator does when a peer's message concerns this node's own
/// copies; given at construction (the locator knows no cache or file system).
pub struct Hooks {
    /// Told a produced object of ours is no longer named.
    pub on_release: ReleaseFn,
    /// The complete copies this node holds (re-announced to a home that restarted or took
    /// over from a dead one).
    pub holdings: HoldingsFn,
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
            holdings: Box::new(Vec::new),
            on_bad_chunk: Box::new(|_, _, _| {}),
            journal: None,
        }
    }
}

/// How long a failed node stays suspect.
const SUSPECT_FOR: Duration = Duration::from_secs(30);

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
            node: NodeTier::new(Duration::from_secs(30), Duration::from_millis(500), 1 << 20),
            rack: Mutex::default(),
            global: Mutex::default(),
            names: Mutex::default(),
            name_waits: NameWaits::default(),
            hooks,
            timeout,
            suspects: Mutex::default(),
            liveness: Arc::default(),
            fetching: Mutex::default(),
            peers,
            stats,
        })
    }

    pub fn me(&self) -> NodeId {
        self.membership.own()
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
        *lock(&self.names) = NameTable::restored(names, max_per_uid);
    }

    pub fn suspect(&self, node: NodeId) {
        lock(&self.suspects).insert(node, Instant::now());
    }

    /// A call to or pull from `node` failed with `error`: it becomes suspect, unless it only
    /// ran out of a short wait (a read gives its last calls what is left of one peer timeout;
    /// a busy but live node missing a 20 ms deadline is no reason to send every miss it is
    /// home of to the shared file system for [`SUSPECT_FOR`]).
    pub fn failed(&self, node: NodeId, error: &TransportError) {
        match error {
            TransportError::Timeout { timeout, .. } if *timeout < self.timeout / 2 => {
                tracing::debug!(node, error = %error, "short wait ran out; not suspect");
            }
            _ => self.suspect(node),
        }
    }

    /// Nodes that failed within the last [`SUSPECT_FOR`].
    pub fn suspects(&self) -> Vec<NodeId> {
        let mut s = lock(&self.suspects);
        s.retain(|_, at| at.elapsed() < SUSPECT_FOR);
        s.keys().copied().collect()
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
        let reply = self.peers.call_blocking(to, addr, &msg, within);
        self.outcome(to, reply)
    }

    /// One locator message to member `to` at `addr` and its answer, through the port.
    pub(super) async fn rpc(
        &self,
        to: NodeId,
        addr: std::net::SocketAddr,
        msg: &Msg,
        timeout: Duration,
    ) -> Result<Msg, TransportError> {
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
                    Reply::Holders(h) => self.node.remember(key, h.clone()),
                    Reply::Fetch => lock(&self.fetching).start(key),
                    Reply::WaitFor(_) => {}
                }
                r
            }
            // An unreachable home is a miss: read the backing store.
            _ => Reply::Fetch,
        }
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
        {
            // Complete here (or dropped): nothing is left to fill for waiting peers.
            let mut f = lock(&self.fetching);
            for (path, version, _) in changes {
                f.done(path, *version);
            }
        }
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

    /// Answers a locator message from `peer` (the authenticated sender; `None` with
    /// `--insecure`), as the port delivered it.
    pub async fn answer(self: Arc<Self>, peer: Option<NodeId>, msg: Msg) -> Msg {
        // Nothing from the wire is used before it is checked: a bad frame changes nothing.
        if let Err(why) = self.check(&msg, peer) {
            tracing::warn!(%why, "refused a locator message");
            return Msg::Refused(why);
        }
        match msg {
            Msg::Lookup {
                path,
                version,
                requester,
                global: false,
            } => self.rack_lookup((path, version), requester).await,
            Msg::Lookup {
                path,
                version,
                requester,
                global: true,
            } => {
                let key = (path, version);
                let mut g = lock(&self.global);
                let mut r = g.lookup(&key, requester, Instant::now(), self.timeout);
                // A fetcher the cluster declared down hands the fetch to this requester (one
                // of the waiters, never all of them at once).
                if let Reply::WaitFor(f) = r
                    && self.liveness.is_down(f)
                {
                    g.fetch_failed(&key, f);
                    r = g.lookup(&key, requester, Instant::now(), self.timeout);
                }
                Msg::Located(r)
            }
            Msg::Batch(msgs) => {
                // The rack-level changes a batch of publishes causes go to their global homes
                // in batches too.
                let mut to_global: HashMap<NodeId, Vec<Msg>> = HashMap::new();
                let mut replies = Vec::with_capacity(msgs.len());
                for msg in msgs {
                    if let Msg::Publish {
                        path,
                        version,
                        node,
                        held,
                    } = msg
                    {
                        if let Some((home, change)) = self.rack_publish(path, version, node, held) {
                            to_global.entry(home).or_default().push(change);
                        }
                        replies.push(Msg::Ack);
                    } else {
                        replies.push(Box::pin(self.clone().answer(peer, msg)).await);
                    }
                }
                for (home, changes) in to_global {
                    self.call_batches(home, changes).await;
                }
                Msg::Batch(replies)
            }
            Msg::Publish {
                path,
                version,
                node,
                held,
            } => {
                if let Some((home, change)) = self.rack_publish(path, version, node, held) {
                    self.call(home, change).await;
                }
                Msg::Ack
            }
            Msg::RackChanged {
                path,
                version,
                rack,
                node,
                held,
            } => {
                let key = (path, version);
                let mut g = lock(&self.global);
                if held {
                    g.rack_gained(&key, &rack, node);
                } else {
                    g.rack_lost(&key, &rack);
                }
                self.stats
                    .home_global_files
                    .store(g.files() as u64, Ordering::Relaxed);
                Msg::Ack
            }
            Msg::Rejoined { node } => {
                // Its address may be reused by a new process: drop the suspicion now.
                lock(&self.suspects).remove(&node);
                self.reannounce(node).await;
                Msg::Ack
            }
            Msg::FetchFailed {
                path,
                version,
                node,
            } => {
                lock(&self.global).fetch_failed(&(path, version), node);
                Msg::Ack
            }
            Msg::NameGet { dir, name, wait_ms } => {
                // A number from the wire: bounded, so no caller holds a home's task for long.
                let wait = Duration::from_millis(wait_ms).min(MAX_NAME_WAIT);
                let found = lock(&self.names).get(&dir, &name);
                if found.is_some() || wait.is_zero() {
                    return Msg::NameIs(found);
                }
                // Registered before the table is looked at again, so a set in between wakes it.
                let deadline = tokio::time::Instant::now() + wait;
                let registered = self.name_waits.register(&dir, &name);
                loop {
                    let woken = registered.notify.notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    let found = lock(&self.names).get(&dir, &name);
                    if found.is_some() || tokio::time::Instant::now() >= deadline {
                        return Msg::NameIs(found);
                    }
                    let _ = tokio::time::timeout_at(deadline, woken).await;
                }
            }
            Msg::Gained { after, max } => {
                let max = (max as usize).min(GAINED_MAX);
                let (next, copies) = lock(&self.global).gained_since(after, max);
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
            Msg::NameList { dir, after } => {
                let (names, more) = lock(&self.names).page(&dir, after.as_deref(), PAGE_BYTES);
                Msg::Names { names, more }
            }
            Msg::NameSet { dir, name, entry } => {
                let old = {
                    let mut names = lock(&self.names);
                    let old = names.get(&dir, &name);
                    let change = self
                        .check_change(&dir, &name, old.as_ref(), entry.as_ref(), peer)
                        .and_then(|()| {
                            names
                                .over_bound(old.as_ref(), entry.as_ref())
                                .map_or(Ok(()), Err)
                        });
                    if let Err(why) = change {
                        tracing::warn!(%why, "refused a name change");
                        return Msg::Refused(why);
                    }
                    if let Some(j) = &self.hooks.journal {
                        j.record(&dir, &name, entry.as_ref());
                    }
                    names.set(&dir, &name, entry.clone())
                };
                self.name_waits.wake(&dir, &name);
                // The next node in the directory's order keeps a copy: it answers for the
                // directory if this node dies, and gives it back if this node restarts.
                let backup = self
                    .membership
                    .live_global_backup(&dir, |n| self.liveness.is_down(n));
                if let Some((b, addr)) = backup
                    .filter(|&b| b != self.me())
                    .and_then(|b| Some((b, self.reachable(b)?)))
                {
                    let (me, timeout) = (self.clone(), self.timeout);
                    let msg = Msg::NameReplica { dir, name, entry };
                    tokio::spawn(async move {
                        if let Err(e) = me.rpc(b, addr, &msg, timeout).await {
                            tracing::debug!(error = %e, "a name's backup copy was not stored");
                        }
                    });
                }
                Msg::NameIs(old)
            }
            Msg::BadChunk {
                path,
                version,
                offset,
            } => {
                (self.hooks.on_bad_chunk)(&path, version, offset);
                Msg::Ack
            }
            Msg::NameReplica { dir, name, entry } => {
                {
                    let mut names = lock(&self.names);
                    if let Some(j) = &self.hooks.journal {
                        j.record(&dir, &name, entry.as_ref());
                    }
                    names.set(&dir, &name, entry);
                }
                self.name_waits.wake(&dir, &name);
                Msg::Ack
            }
            Msg::Unhold {
                object,
                version,
                drop,
            } => {
                (self.hooks.on_release)(&object, version.size, version.mtime_ns, drop);
                Msg::Ack
            }
            Msg::ObjectsNamed { holder, after } => {
                let mut objects: Vec<String> = lock(&self.names)
                    .entries()
                    .filter(|(_, _, n)| !n.dir && n.holder == holder && !n.object.is_empty())
                    .map(|(_, _, n)| n.object.as_str())
                    .filter(|o| after.as_deref().is_none_or(|a| *o > a))
                    .map(String::from)
                    .collect();
                objects.sort_unstable();
                objects.dedup();
                let fit = pages::fitting(&objects);
                let more = fit < objects.len();
                objects.truncate(fit);
                Msg::Objects { objects, more }
            }
            Msg::CountHeld => {
                let held = (self.hooks.holdings)();
                Msg::Held {
                    files: held.len() as u64,
                    bytes: held.iter().map(|(_, v)| v.size).sum(),
                }
            }
            other => Msg::Refused(format!("not a request: {other:?}")),
        }
    }

    /// Records at this rack home that `node` gained or lost a copy; returns the message for
    /// the file's global home when the rack gained its first copy or lost its last.
    fn rack_publish(
        &self,
        path: String,
        version: Version,
        node: NodeId,
        held: bool,
    ) -> Option<(NodeId, Msg)> {
        let key = (path, version);
        let changed = {
            let mut rack = lock(&self.rack);
            let changed = if held {
                rack.table.publish(&key, node)
            } else {
                rack.table.unpublish(&key, node)
            };
            self.stats
                .home_rack_files
                .store(rack.table.files() as u64, Ordering::Relaxed);
            changed
        };
        changed.then(|| {
            let home = self.global_home(&key.0);
            let msg = Msg::RackChanged {
                path: key.0,
                version,
                rack: self.membership.rack_of(node).to_string(),
                node,
                held,
            };
            (home, msg)
        })
    }

    /// The rack home's answer to a lookup of `key` by `requester`: from its table, after the
    /// lookup queued before it is answered, or from the global home.
    async fn rack_lookup(self: &Arc<Self>, key: Key, requester: NodeId) -> Msg {
        match self.rack_step(&key, requester) {
            RackStep::Answer(r) => Msg::Located(r),
            RackStep::Queued(rx) => {
                // Unanswered in time: read it from the backing store.
                let r = tokio::time::timeout(self.timeout, rx).await;
                Msg::Located(r.ok().and_then(Result::ok).unwrap_or(Reply::Fetch))
            }
            RackStep::AskGlobal(home) => {
                let msg = Self::global_lookup(&key, requester);
                let started = Instant::now();
                // Within half a peer timeout: a frozen global home then costs this rack
                // home's askers (who wait a whole one for it) an answer, "read it yourself",
                // not a timeout that makes this live node look frozen to them.
                let reply = self.call_within(home, msg, self.timeout / 2).await;
                self.stats.latency.lookup("global", started);
                self.rack_told(key, requester, reply)
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
        match self.rack_step(&key, requester) {
            RackStep::Answer(r) => Msg::Located(r),
            RackStep::Queued(rx) => {
                // (No I/O: the answer comes through the channel, which wakes this thread.)
                let r = runtime.block_on(async move { tokio::time::timeout(within, rx).await });
                Msg::Located(r.ok().and_then(Result::ok).unwrap_or(Reply::Fetch))
            }
            RackStep::AskGlobal(home) => {
                let msg = Self::global_lookup(&key, requester);
                let started = Instant::now();
                let reply = self.call_from_thread(runtime, home, msg, within.min(self.timeout / 2));
                self.stats.latency.lookup("global", started);
                self.rack_told(key, requester, reply)
            }
        }
    }

    /// What the rack table says to a lookup of `key` by `requester`.
    fn rack_step(&self, key: &Key, requester: NodeId) -> RackStep {
        let mut rack = lock(&self.rack);
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
                RackStep::AskGlobal(self.global_home(&key.0))
            }
        }
    }

    /// The question a rack home asks the global home of `key` for `requester`.
    fn global_lookup(key: &Key, requester: NodeId) -> Msg {
        Msg::Lookup {
            path: key.0.clone(),
            version: key.1,
            requester,
            global: true,
        }
    }

    /// The global home's `reply` (`None`: none came) to the lookup of `key` that `requester`
    /// made, recorded in the rack table: the answer for `requester`, and one for each lookup
    /// queued behind it.
    fn rack_told(&self, key: Key, requester: NodeId, reply: Option<Msg>) -> Msg {
        let answer = match reply {
            Some(Msg::Located(l)) => Some(l),
            _ => None,
        };
        let mut rack = lock(&self.rack);
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
}

/// What a rack home does about a lookup (see [`LocatorService::rack_step`]).
enum RackStep {
    Answer(Reply),
    /// Another lookup of the same key asked the global home: wait for its answer.
    Queued(oneshot::Receiver<Reply>),
    /// Ask the global home, this node.
    AskGlobal(NodeId),
}

/// The most copies one `Gained` is answered with, whatever it asks (then bounded by bytes).
const GAINED_MAX: usize = 4096;

/// The longest a name home holds a `NameGet` open, whatever the caller asks.
const MAX_NAME_WAIT: Duration = Duration::from_secs(3600);

impl LocatorService {
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
