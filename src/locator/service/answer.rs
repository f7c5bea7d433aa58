//! What a node answers to each locator message: the dispatch, then one named step per request.

use std::collections::HashMap;
use std::sync::Arc;

use super::LocatorService;
use crate::core::Version;
use crate::core::names::Name;
use crate::locator::membership::NodeId;
use crate::locator::proto::{Msg, PageMap};

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
            } => {
                let down = |n| self.liveness.is_down(n);
                self.global
                    .answer((path, version), requester, self.timeout, down)
            }
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
            } => self.global.rack_changed((path, version), &rack, node, held),
            Msg::Rejoined { node } => {
                // Its address may be reused by a new process: drop the suspicion now.
                self.suspects.forget(node);
                self.until_up(node).await;
                self.reannounce(node).await;
                Msg::Ack
            }
            Msg::FetchFailed {
                path,
                version,
                node,
            } => {
                self.global.fetch_failed(&(path, version), node);
                Msg::Ack
            }
            Msg::NameGet { dir, name, wait_ms } => self.names.get(&dir, &name, wait_ms).await,
            Msg::Gained { after, max } => self.global.gained_page(after, max),
            Msg::NameList { dir, after } => self.names.list(&dir, after.as_deref()),
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
            Msg::ObjectsNamed { holder, after } => {
                self.names.objects_page(holder, after.as_deref())
            }
            Msg::NameWatch {
                node,
                names,
                wait_ms,
            } => self.names.watch(node, names, wait_ms),
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
                let (mut files, mut bytes) = (0, 0);
                (self.hooks.holdings)(&mut |_, version| {
                    files += 1;
                    bytes += version.size;
                });
                Msg::Held { files, bytes }
            }
            other => Msg::Refused(format!("not a request: {other:?}")),
        }
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

    /// `name` of `dir` was published as `entry` here: the nodes watching it are told, each in
    /// a message of its own, off this task.
    fn tell_watchers(self: &Arc<Self>, dir: &str, name: &str, entry: &Name) {
        for node in self.names.watchers_of(dir, name) {
            let me = self.clone();
            let told = Msg::NamesAre(vec![(dir.to_string(), name.to_string(), entry.clone())]);
            tokio::spawn(async move {
                me.call(node, told).await;
            });
        }
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
        let old = match self.names.set(&dir, &name, entry.clone(), peer) {
            Ok(old) => old,
            Err(why) => {
                tracing::warn!(%why, "refused a name change");
                return Msg::Refused(why);
            }
        };
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
        self.names.store(dir, name, entry.clone());
        // (A restarted home given its names back tells the nodes that watched them meanwhile.)
        if let Some(n) = &entry {
            self.tell_watchers(dir, name, n);
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
        let changed = self.rack.publish(&key, node, held);
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
