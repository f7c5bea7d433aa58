//! What a node answers to each locator message: the dispatch, then one named step per request.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::LocatorService;
use crate::core::Version;
use crate::core::names::Name;
use crate::core::sync::lock;
use crate::locator::membership::NodeId;
use crate::locator::pages;
use crate::locator::proto::{Msg, PageMap};
use crate::locator::tiers::{Key, Reply};

/// The most copies one `Gained` is answered with, whatever it asks (then bounded by bytes).
const GAINED_MAX: usize = 4096;

/// The longest a name home holds a `NameGet` open, whatever the caller asks.
const MAX_NAME_WAIT: Duration = Duration::from_secs(3600);

impl LocatorService {
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
            } => self.global_answer((path, version), requester),
            Msg::Batch(msgs) => self.batch(peer, msgs).await,
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
            } => self.rack_changed((path, version), &rack, node, held),
            Msg::Rejoined { node } => {
                // Its address may be reused by a new process: drop the suspicion now.
                lock(&self.suspects).remove(&node);
                self.until_up(node).await;
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
            Msg::NameGet { dir, name, wait_ms } => self.name_get(&dir, &name, wait_ms).await,
            Msg::Gained { after, max } => self.gained_page(after, max),
            Msg::NameList { dir, after } => {
                let (names, more) =
                    lock(&self.names).page(&dir, after.as_deref(), pages::PAGE_BYTES);
                Msg::Names { names, more }
            }
            Msg::NameSet { dir, name, entry } => self.name_set(dir, name, entry, peer),
            Msg::BadChunk {
                path,
                version,
                offset,
            } => {
                (self.hooks.on_bad_chunk)(&path, version, offset);
                Msg::Ack
            }
            Msg::NameReplica { dir, name, entry } => {
                self.store_name(&dir, &name, entry);
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
            Msg::ObjectsNamed { holder, after } => self.objects_page(holder, after.as_deref()),
            Msg::NameWatch {
                node,
                names,
                wait_ms,
            } => self.name_watch(node, names, wait_ms),
            Msg::NamesAre(found) => {
                self.names_are(&found);
                Msg::Ack
            }
            Msg::PagesOf {
                path,
                version,
                offset,
            } => {
                let fills = self.is_fetching(&path, version);
                let map = (self.hooks.pages_of)(&path, version, offset);
                Msg::PagesAre(map.map(|m| PageMap { fills, ..m }))
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

    /// The global home's answer to a lookup of `key` by `requester`.
    fn global_answer(&self, key: Key, requester: NodeId) -> Msg {
        let mut g = lock(&self.global);
        let mut r = g.lookup(&key, requester, Instant::now(), self.timeout);
        // A fetcher the cluster declared down hands the fetch to this requester (one of the
        // waiters, never all of them at once).
        if let Reply::WaitFor(f) = r
            && self.liveness.is_down(f)
        {
            g.fetch_failed(&key, f);
            r = g.lookup(&key, requester, Instant::now(), self.timeout);
        }
        Msg::Located(r)
    }

    /// A batch: each message answered in order. The rack-level changes a batch of publishes
    /// causes go to their global homes in batches too.
    async fn batch(self: Arc<Self>, peer: Option<NodeId>, msgs: Vec<Msg>) -> Msg {
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

    /// At the global home: rack `rack` gained its first copy of `key` (at `node`) or lost its
    /// last.
    fn rack_changed(&self, key: Key, rack: &str, node: NodeId, held: bool) -> Msg {
        let mut g = lock(&self.global);
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

    /// At a name home: the name, once it is set or the wait (bounded) ends, whichever is
    /// first. Woken by the set itself (`name_waits`), never by a timer.
    async fn name_get(&self, dir: &str, name: &str, wait_ms: u64) -> Msg {
        // A number from the wire: bounded, so no caller holds a home's task for long.
        let wait = Duration::from_millis(wait_ms).min(MAX_NAME_WAIT);
        let found = lock(&self.names).get(dir, name);
        if found.is_some() || wait.is_zero() {
            return Msg::NameIs(found);
        }
        // Registered before the table is looked at again, so a set in between wakes it.
        let deadline = tokio::time::Instant::now() + wait;
        let registered = self.name_waits.register(dir, name);
        loop {
            let woken = registered.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let found = lock(&self.names).get(dir, name);
            if found.is_some() || tokio::time::Instant::now() >= deadline {
                return Msg::NameIs(found);
            }
            let _ = tokio::time::timeout_at(deadline, woken).await;
        }
    }

    /// At a name home: `node` watches `names` for up to `wait_ms` (bounded); those published
    /// already are the answer, the others it is told of when they are (see `tell_watchers`).
    fn name_watch(&self, node: NodeId, names: Vec<(String, String)>, wait_ms: u64) -> Msg {
        let until = Instant::now() + Duration::from_millis(wait_ms).min(MAX_NAME_WAIT);
        let mut found = Vec::new();
        let table = lock(&self.names);
        for (dir, name) in names {
            match table.get(&dir, &name) {
                Some(n) => found.push((dir, name, n)),
                None => {
                    // (Past its bound a node learns of the name at its reader's deadline.)
                    self.watchers.add(node, (dir, name), until);
                }
            }
        }
        Msg::NamesAre(found)
    }

    /// `name` of `dir` was published as `entry` here: the nodes watching it are told, each in
    /// a message of its own, off this task.
    fn tell_watchers(self: &Arc<Self>, dir: &str, name: &str, entry: &Name) {
        for node in self.watchers.take(dir, name) {
            let me = self.clone();
            let told = Msg::NamesAre(vec![(dir.to_string(), name.to_string(), entry.clone())]);
            tokio::spawn(async move {
                me.call(node, told).await;
            });
        }
    }

    /// The copies the global tier gained since `after`, a page of at most `max`.
    fn gained_page(&self, after: u64, max: u32) -> Msg {
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

    /// At a name home: sets (or removes) a name if `peer` may, journals it, wakes its waiters
    /// and sends the directory's backup node a copy; answers the name it replaced.
    fn name_set(
        self: &Arc<Self>,
        dir: String,
        name: String,
        entry: Option<Name>,
        peer: Option<NodeId>,
    ) -> Msg {
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
            let old =
                names.set_journaled(self.hooks.journal.as_deref(), &dir, &name, entry.clone());
            self.stats
                .home_names
                .store(names.count(), Ordering::Relaxed);
            old
        };
        self.name_waits.wake(&dir, &name);
        if let Some(n) = &entry {
            self.tell_watchers(&dir, &name, n);
        }
        // The next node in the directory's order keeps a copy: it answers for the directory
        // if this node dies, and gives it back if this node restarts.
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

    /// At a directory's backup node: keeps (and journals) the copy of a name its home sent,
    /// and wakes anyone here waiting for it.
    fn store_name(self: &Arc<Self>, dir: &str, name: &str, entry: Option<Name>) {
        {
            let mut names = lock(&self.names);
            names.set_journaled(self.hooks.journal.as_deref(), dir, name, entry.clone());
            self.stats
                .home_names
                .store(names.count(), Ordering::Relaxed);
        }
        self.name_waits.wake(dir, name);
        // (A restarted home given its names back tells the nodes that watched them meanwhile.)
        if let Some(n) = &entry {
            self.tell_watchers(dir, name, n);
        }
    }

    /// The objects that names kept here say `holder` keeps, after `after`, a page of them
    /// (the holder's sweep of unnamed objects asks).
    fn objects_page(&self, holder: NodeId, after: Option<&str>) -> Msg {
        let mut objects: Vec<String> = lock(&self.names)
            .entries()
            .filter(|(_, _, n)| !n.dir && n.holder == holder && !n.object.is_empty())
            .map(|(_, _, n)| n.object.as_str())
            .filter(|o| after.is_none_or(|a| *o > a))
            .map(String::from)
            .collect();
        objects.sort_unstable();
        objects.dedup();
        let fit = pages::fitting(&objects);
        let more = fit < objects.len();
        objects.truncate(fit);
        Msg::Objects { objects, more }
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
}
