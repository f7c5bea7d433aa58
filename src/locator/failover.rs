//! A member's comings and goings, as the locator handles them: a node that (re)starts with
//! empty tables tells the others (`Rejoined`) and they re-announce what its tables held; a node
//! the cluster declares down (gossip) has its paths re-homed to the next live node, whom the
//! survivors tell what they hold; a node that comes back is told what it is home of again.
//!
//! And what a node asks of every member: `dyadfs status` (each member up, suspect or down, and
//! what its cache holds, asked of each member not known to be down, all at once, each bounded),
//! and which of a holder's objects any name points at. A holder that restarted keeps objects
//! whose names a crash lost (killed between keeping an object and publishing its name, or
//! between unpublishing and deleting it), which no name can reach and nothing would ever
//! delete. The names pointing at its objects live at their directories' homes and backups, so
//! only the answers of every member together say which are unnamed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::membership::NodeId;
use super::proto::Msg;
use super::service::LocatorService;
use crate::core::Version;
use crate::stats::{MemberStatus, StatusReport};

/// The longest a `Rejoined` answer waits for gossip to have its sender up (it never does
/// when gossip cannot reach it: the sender then mounts as before, a second later).
pub const JOIN_WAIT: Duration = Duration::from_secs(1);

/// How often that wait looks.
const JOIN_POLL: Duration = Duration::from_millis(5);

/// The longest `status` waits for a member's counts.
const ASK_FOR: Duration = Duration::from_secs(1);

impl LocatorService {
    /// Tells every peer this node (re)started with empty tables, so they re-announce what the
    /// tables held; waits (at most `timeout` per peer, all at once) for their answers. A peer
    /// that is not up yet has nothing to announce: its failure is ignored, never suspected.
    pub async fn rejoin(self: &Arc<Self>, timeout: Duration) -> usize {
        let mut calls = tokio::task::JoinSet::new();
        for m in self.membership.members() {
            if m.id == self.me() {
                continue;
            }
            let (me, to, addr) = (self.clone(), m.id, m.addr);
            calls.spawn(async move {
                let msg = Msg::Rejoined { node: me.me() };
                me.rpc(to, addr, &msg, timeout).await
            });
        }
        let mut answered = 0;
        while let Some(r) = calls.join_next().await {
            match r {
                Ok(Ok(Msg::Ack)) => answered += 1,
                Ok(Ok(other)) => tracing::warn!(reply = ?other, "unexpected answer to Rejoined"),
                Ok(Err(e)) => tracing::debug!(error = %e, "a peer did not answer Rejoined"),
                Err(e) => tracing::warn!(error = %e, "Rejoined task failed"),
            }
        }
        answered
    }

    /// Waits (at most [`JOIN_WAIT`]) until gossip has `node` up again if this node has it down.
    /// A member that starts after this node declared it down (silent past the failure
    /// detection time: a slow launch) announces itself by gossip before it says `Rejoined`,
    /// and its mount returns when that is answered: answered at once, this node could still
    /// home its directories elsewhere when its first file is produced here and asked for
    /// there, and the name would be missing there until gossip caught up.
    pub(super) async fn until_up(&self, node: NodeId) {
        let deadline = tokio::time::Instant::now() + JOIN_WAIT;
        while self.liveness.is_down(node) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(JOIN_POLL).await;
        }
    }

    /// What `node`, just (re)started, lost: this node's copies it is rack home of, this rack's
    /// files it is global home of, and the names of the directories it is name home of (this
    /// node keeps copies of those as their backup).
    pub(super) async fn reannounce(self: &Arc<Self>, node: NodeId) {
        let names: Vec<Msg> = self.names.with_table(|t| {
            t.entries()
                .filter(|(dir, _, _)| self.global_home(dir) == node)
                .map(|(dir, name, entry)| Msg::NameReplica {
                    dir: dir.to_string(),
                    name: name.to_string(),
                    entry: Some(entry.clone()),
                })
                .collect()
        });
        if !names.is_empty() {
            let sent = names.len();
            let acked = self.call_batches(node, names).await;
            tracing::info!(node, names = sent, acked, "gave names back to their home");
        }
        let rack = self.membership.rack_of(self.me());
        let mut mine: Vec<Msg> = Vec::new();
        (self.hooks.holdings)(&mut |path, version| {
            if self.rack_home(path, rack) == node {
                mine.push(Msg::Publish {
                    path: path.to_string(),
                    version,
                    node: self.me(),
                    held: true,
                });
            }
        });
        let copies = mine.len();
        if !mine.is_empty() {
            self.call_batches(node, mine).await;
        }
        let racks: Vec<Msg> = self.rack.with_table(|t| {
            t.held()
                .filter(|((path, _), _)| self.global_home(path) == node)
                .map(|((path, version), holder)| Msg::RackChanged {
                    path: path.to_string(),
                    version,
                    rack: rack.to_string(),
                    node: holder,
                    held: true,
                })
                .collect()
        });
        if !racks.is_empty() {
            self.call_batches(node, racks).await;
        }
        tracing::info!(node, copies, "re-announced to a restarted node");
    }

    /// Gossip's news: `node` went down, or came back after being down.
    ///
    /// Down: the paths it was home of now have other homes (the next live member in their
    /// rendezvous order), which know nothing of them yet; this node tells them what it holds
    /// (as a member) and what its rack holds (as a rack home), so a dead home costs no reads
    /// of the shared file system for files a live node holds. Back: it gets its paths back,
    /// and is told what they hold (its tables may be empty after a restart, or stale after a
    /// freeze).
    pub async fn member_changed(self: Arc<Self>, node: NodeId, down: bool) {
        let now_down = self.liveness.down_count() as u64;
        self.stats.members_down.store(now_down, Ordering::Relaxed);
        if !down {
            self.suspects.forget(node);
            self.reannounce(node).await;
            return;
        }
        let rack = self.membership.rack_of(self.me()).to_string();
        let mut mine: Vec<(String, Version, bool)> = Vec::new();
        (self.hooks.holdings)(&mut |path, version| {
            if self.membership.rack_home(path, &rack) == node {
                mine.push((path.to_string(), version, true));
            }
        });
        let copies = mine.len();
        if !mine.is_empty() {
            self.publish(&mine).await;
        }
        let mut racks: HashMap<NodeId, Vec<Msg>> = HashMap::new();
        self.rack.with_table(|t| {
            for ((path, version), holder) in t.held() {
                if self.membership.global_home(path) == node {
                    racks
                        .entry(self.global_home(path))
                        .or_default()
                        .push(Msg::RackChanged {
                            path: path.to_string(),
                            version,
                            rack: rack.clone(),
                            node: holder,
                            held: true,
                        });
                }
            }
        });
        let rack_copies: usize = racks.values().map(Vec::len).sum();
        for (home, msgs) in racks {
            self.call_batches(home, msgs).await;
        }
        // The directories whose name home died and that this node (their backup) now answers
        // for get a new backup.
        let mut names: HashMap<NodeId, Vec<Msg>> = HashMap::new();
        self.names.with_table(|t| {
            for (dir, name, entry) in t.entries() {
                let moved = self.membership.global_home(dir) == node;
                if moved && self.global_home(dir) == self.me() {
                    let down = |n| self.liveness.is_down(n);
                    if let Some(b) = self.membership.live_global_backup(dir, down) {
                        names.entry(b).or_default().push(Msg::NameReplica {
                            dir: dir.to_string(),
                            name: name.to_string(),
                            entry: Some(entry.clone()),
                        });
                    }
                }
            }
        });
        for (backup, msgs) in names {
            self.call_batches(backup, msgs).await;
        }
        self.stats.failovers.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            node,
            copies,
            rack_copies,
            "re-homed what a dead node was home of"
        );
    }

    /// `dyadfs status` as this node's locator answers it (see this file's header).
    pub async fn status(self: &Arc<Self>) -> StatusReport {
        let suspects = self.suspects();
        let mut calls = tokio::task::JoinSet::new();
        let mut members: Vec<MemberStatus> = self
            .membership
            .members()
            .map(|m| {
                let state = if m.id == self.me() {
                    "self"
                } else if self.liveness.is_down(m.id) {
                    "down"
                } else if suspects.contains(&m.id) {
                    "suspect"
                } else {
                    "up"
                };
                if state != "down" {
                    let (me, id) = (self.clone(), m.id);
                    calls.spawn(
                        async move { (id, me.call_within(id, Msg::CountHeld, ASK_FOR).await) },
                    );
                }
                MemberStatus {
                    id: m.id,
                    addr: m.addr.to_string(),
                    rack: m.rack.clone(),
                    state: state.into(),
                    files: None,
                    bytes: None,
                }
            })
            .collect();
        while let Some(r) = calls.join_next().await {
            if let Ok((id, Some(Msg::Held { files, bytes }))) = r
                && let Some(m) = members.iter_mut().find(|m| m.id == id)
            {
                (m.files, m.bytes) = (Some(files), Some(bytes));
            }
        }
        members.sort_by_key(|m| m.id);
        StatusReport {
            node: self.me(),
            members,
        }
    }

    /// Every object of `holder` some member's names point at, or `None` if a member did not
    /// answer (then nothing may be taken as unnamed).
    pub async fn objects_named(self: &Arc<Self>, holder: NodeId) -> Option<HashSet<String>> {
        let mut named: HashSet<String> = self.names.objects_of(holder);
        let others: Vec<NodeId> = self
            .membership
            .members()
            .map(|m| m.id)
            .filter(|&id| id != self.me())
            .collect();
        for node in others {
            let mut after = None;
            loop {
                let ask = Msg::ObjectsNamed {
                    holder,
                    after: after.clone(),
                };
                let Some(Msg::Objects { objects, more }) = self.call(node, ask).await else {
                    return None;
                };
                // Each page moves forward, or a member could keep this node asking forever.
                if more
                    && objects
                        .last()
                        .is_none_or(|l| after.as_ref().is_some_and(|a| l <= a))
                {
                    return None;
                }
                after = objects.last().cloned();
                named.extend(objects);
                if !more {
                    break;
                }
            }
        }
        Some(named)
    }
}
