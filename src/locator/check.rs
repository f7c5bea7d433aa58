//! What a locator message from the wire must satisfy before any table is touched: paths, names
//! and object ids well formed (see [`crate::core::paths`]), node ids known, and a message that
//! speaks for its sender (a publish, a failed fetch, a rejoin, a member's own lookup, a rack's
//! change) sent by that sender, the authenticated peer.

use super::gossip::Liveness;
use super::membership::{Membership, NodeId};
use super::proto::Msg;
use super::watching::NAMES_PER_WATCH;
use crate::core::names::{FILE_SIZE_MAX, Name, TARGET_MAX, is_links_dir};

/// The checks of a message against the cluster as this node sees it: who is a member (and
/// this node), who is down.
pub(super) struct Checks<'a> {
    pub(super) membership: &'a Membership,
    pub(super) liveness: &'a Liveness,
}

impl Checks<'_> {
    /// Whether a request's paths, names and node ids are well formed and known (see
    /// [`crate::core::paths`]): unknown node ids, paths that could escape a root, and object ids
    /// that are not tokens of their holder are refused before any table is touched.
    /// A message that speaks for its sender (a publish, a failed fetch, a rejoin, a member's
    /// own lookup, a rack's change) must come from that sender: `peer` is the authenticated id.
    pub(super) fn check(&self, msg: &Msg, peer: Option<NodeId>) -> Result<(), String> {
        use crate::core::paths::{cache_key, object_id};
        let member = |id: NodeId| self.membership.check_member(id);
        let key = |p: &str| cache_key(p).map_err(|e| format!("{p:?}: {e}"));
        let sender = |id: NodeId| self.sender(id, peer);
        match msg {
            // A rack home forwards a member's miss to the global home (`global: true`).
            Msg::Lookup {
                path,
                requester,
                global,
                ..
            } => {
                key(path)?;
                if *global {
                    member(*requester)
                } else {
                    sender(*requester)
                }
            }
            Msg::Publish { path, node, .. } | Msg::FetchFailed { path, node, .. } => {
                key(path)?;
                sender(*node)
            }
            Msg::RackChanged {
                path, rack, node, ..
            } => {
                key(path)?;
                member(*node)?;
                if self.membership.rack_of(*node) != rack {
                    return Err(format!("node {node} is not in rack {rack:?}"));
                }
                // Only a member of that rack (its rack home) reports the rack's changes.
                match peer {
                    Some(p) if self.membership.rack_of(p) != rack => {
                        Err(format!("node {p} reported for rack {rack:?}"))
                    }
                    _ => Ok(()),
                }
            }
            Msg::Rejoined { node } => sender(*node),
            Msg::BadChunk { path, .. } => key(path),
            Msg::NameGet { .. }
            | Msg::NameList { .. }
            | Msg::NameSet { .. }
            | Msg::NameReplica { .. }
            | Msg::NameWatch { .. }
            | Msg::NamesAre(_) => self.check_names(msg, peer),
            // Replies are checked like requests: a home's answer goes into this node's tables.
            Msg::GainedList { copies, .. } => copies.iter().try_for_each(|(path, _, node)| {
                key(path)?;
                member(*node)
            }),
            Msg::Located(super::tiers::Reply::Holders(h)) => h.iter().try_for_each(|&n| member(n)),
            Msg::Located(super::tiers::Reply::WaitFor(n)) => member(*n),
            Msg::Unhold { object, .. } => match object_id(object) {
                Ok(node) if node == self.membership.own() => Ok(()),
                _ => Err(format!("{object:?} is not an object of this node")),
            },
            Msg::Batch(msgs) => msgs.iter().try_for_each(|m| self.check(m, peer)),
            Msg::PagesOf { path, .. } => key(path),
            // A holder's pages are a chunk's 128th (a 32nd before; chunks of 1-4 MiB), a little room
            // either way.
            Msg::PagesAre(Some(map)) => {
                let pages = map.page.is_power_of_two() && (4096..=1 << 20).contains(&map.page);
                if !pages || map.masks.len() as u64 > super::proto::PAGE_MAP_WORDS {
                    return Err(format!(
                        "a page map of {} words of {}-byte pages",
                        map.masks.len(),
                        map.page
                    ));
                }
                Ok(())
            }
            Msg::ObjectsNamed { holder, .. } => member(*holder),
            _ => Ok(()),
        }
    }

    /// [`Checks::check`] for the produced namespace's messages.
    fn check_names(&self, msg: &Msg, peer: Option<NodeId>) -> Result<(), String> {
        let entry = |d: &str, name: &str, n: Option<&Name>| {
            named(d, name)?;
            n.map_or(Ok(()), |n| check_name(n, self.membership))
        };
        match msg {
            Msg::NameGet { dir, name, .. } => named(dir, name),
            Msg::NameList { dir, after } => {
                dir_ok(dir)?;
                after.as_deref().map_or(Ok(()), one_ok)
            }
            Msg::NameSet {
                dir,
                name,
                entry: n,
            } => entry(dir, name, n.as_ref()),
            // Only the nodes that keep the directory's names (its home and backup) copy them to
            // one another: a replica is what a restarted home is given back.
            Msg::NameReplica {
                dir,
                name,
                entry: n,
            } => {
                entry(dir, name, n.as_ref())?;
                self.kept_by(dir, peer)
            }
            Msg::NameWatch { node, names, .. } => {
                self.sender(*node, peer)?;
                if names.len() > NAMES_PER_WATCH {
                    return Err(format!("{} names in one watch", names.len()));
                }
                names.iter().try_for_each(|(d, name)| named(d, name))
            }
            // Only a node that keeps the directory's names tells of them.
            Msg::NamesAre(found) => {
                if found.len() > NAMES_PER_WATCH {
                    return Err(format!("{} names in one message", found.len()));
                }
                found.iter().try_for_each(|(d, name, n)| {
                    entry(d, name, Some(n))?;
                    self.kept_by(d, peer)
                })
            }
            _ => Ok(()),
        }
    }

    /// The nodes that keep `dir`'s names: its rendezvous order down to the second member not
    /// known to be down here (the live home and its backup, and any dead ones before them).
    fn keepers(&self, dir: &str) -> Vec<NodeId> {
        let mut live = 0;
        self.membership
            .global_order(dir)
            .into_iter()
            .take_while(|&n| {
                let more = live < 2;
                live += usize::from(!self.liveness.is_down(n));
                more
            })
            .collect()
    }

    /// A message that speaks for node `id` comes from it (`peer`, the authenticated sender).
    fn sender(&self, id: NodeId, peer: Option<NodeId>) -> Result<(), String> {
        match peer {
            Some(p) if p != id => Err(format!("node {p} spoke for node {id}")),
            _ => self.membership.check_member(id),
        }
    }

    /// `peer` keeps `dir`'s names (its home or backup).
    fn kept_by(&self, dir: &str, peer: Option<NodeId>) -> Result<(), String> {
        match peer {
            Some(p) if !self.keepers(dir).contains(&p) => {
                Err(format!("node {p} keeps no names of {dir:?}"))
            }
            _ => Ok(()),
        }
    }
}

/// Whether `peer` may change the name that is `old` into `new` at this name home (under
/// its lock, so the check and the change are one step). A hard link's record (in
/// [`crate::core::names::LINKS_DIR`]) keeps its bytes unless its holder changes them: any
/// member may change its attributes and link count (a user of any node may chmod or link
/// the file) or remove it (its last name unlinked), and a new record's key is one the
/// sender made. Other names: see `docs/SECURITY.md` (moves cannot be told from aliases
/// at the target's home).
pub(super) fn check_change(
    dir: &str,
    key: &str,
    old: Option<&Name>,
    new: Option<&Name>,
    peer: Option<NodeId>,
) -> Result<(), String> {
    let (Some(peer), true, Some(new)) = (peer, is_links_dir(dir), new) else {
        return Ok(());
    };
    match old {
        None if !key.starts_with(&format!("{peer}-")) => {
            Err(format!("node {peer} made a record with key {key:?}"))
        }
        None => Ok(()),
        Some(o) if o.holder != peer && !same_bytes(o, new) => Err(format!(
            "node {peer} changed the bytes of node {}'s record {key:?}",
            o.holder
        )),
        Some(_) => Ok(()),
    }
}

/// A directory of produced names: a dataset path, or the links directory.
fn dir_ok(p: &str) -> Result<(), String> {
    if is_links_dir(p) {
        return Ok(());
    }
    crate::core::paths::dataset_path(p).map_err(|e| format!("{p:?}: {e}"))
}

/// One name (no slash, not `.` or `..`).
fn one_ok(n: &str) -> Result<(), String> {
    crate::core::paths::name(n).map_err(|e| format!("{n:?}: {e}"))
}

/// A name in a directory.
fn named(dir: &str, name: &str) -> Result<(), String> {
    dir_ok(dir)?;
    one_ok(name)
}

/// Whether two names hold the same bytes made by the same node.
fn same_bytes(a: &Name, b: &Name) -> bool {
    (&a.object, a.holder, a.size, a.mtime_ns, &a.meta.inode)
        == (&b.object, b.holder, b.size, b.mtime_ns, &b.meta.inode)
}

/// A published name is well formed: a directory, symlink or special file names no object; a
/// symlink's target is short and has no NUL; only a symlink has a target; a file's object is a
/// token of its holder, a member; its size is at most [`FILE_SIZE_MAX`].
pub fn check_name(n: &Name, membership: &Membership) -> Result<(), String> {
    membership.check_member(n.holder)?;
    if n.size > FILE_SIZE_MAX {
        return Err(format!(
            "a name of {} bytes (a produced file holds at most {FILE_SIZE_MAX})",
            n.size
        ));
    }
    let m = &n.meta;
    let special = matches!(
        m.special,
        libc::S_IFLNK | libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK | libc::S_IFSOCK
    );
    if m.special != 0 && (!special || n.dir) {
        return Err(format!("a name of kind {:o}", m.special));
    }
    if m.special == libc::S_IFLNK {
        if m.target.is_empty() || m.target.len() >= TARGET_MAX || m.target.contains('\0') {
            return Err("a malformed symlink target".into());
        }
    } else if !m.target.is_empty() {
        return Err("a target on a name that is not a symlink".into());
    }
    if !m.inode.is_empty() && (n.dir || special || m.inode.len() > 64 || m.inode.contains('/')) {
        return Err("a malformed link record key".into());
    }
    if n.dir || special || n.is_pointer() {
        return if n.object.is_empty() {
            Ok(())
        } else {
            Err("a name without bytes with an object".into())
        };
    }
    match crate::core::paths::object_id(&n.object) {
        Ok(node) if node == n.holder => Ok(()),
        _ => Err(format!(
            "{:?} is not an object of node {}",
            n.object, n.holder
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::core::Version;
    use crate::locator::service::LocatorService;
    use crate::locator::tiers::Reply;

    /// Node `own`'s locator in a job of nodes 0, 1 and 2 (no RPC is ever sent).
    fn service(own: NodeId) -> Arc<LocatorService> {
        let peers = "0 127.0.0.1:1 r\n1 127.0.0.1:2 r\n2 127.0.0.1:3 r\n";
        let m = Membership::parse(peers, own).unwrap();
        let net = crate::locator::loopback::Net::new();
        let s = LocatorService::new(
            m,
            Duration::from_secs(1),
            Default::default(),
            net.port(own),
            Default::default(),
        );
        net.join(&s);
        s
    }

    fn v() -> Version {
        Version {
            size: 3,
            mtime_ns: 1,
        }
    }

    #[test]
    fn a_reply_is_checked_like_a_request() {
        let s = service(0);
        let gained = |path: &str, node| Msg::GainedList {
            next: 1,
            copies: vec![("ok".into(), v(), 1), (path.into(), v(), node)],
        };
        // A copy's path must be a cache key and its holder a member, as in a request.
        assert!(s.outcome(1, Ok(gained("train/x", 2))).is_some());
        assert_eq!(s.outcome(1, Ok(gained("../etc/shadow", 2))), None);
        assert_eq!(s.outcome(1, Ok(gained("/etc/shadow", 2))), None);
        assert_eq!(s.outcome(1, Ok(gained("train/x", 9))), None);
        assert_eq!(
            s.outcome(2, Ok(Msg::Located(Reply::Holders(vec![9])))),
            None
        );
        assert_eq!(s.outcome(2, Ok(Msg::Located(Reply::WaitFor(7)))), None);
        // The home that sent a bad reply is suspect.
        assert!(s.suspects().contains(&1) && s.suspects().contains(&2));
    }

    #[test]
    fn a_page_map_is_checked_before_it_is_believed() {
        use crate::locator::proto::{PAGE_MAP_WORDS, PageMap};
        let s = service(0);
        let map = |page: u64, chunks: u64| {
            Msg::PagesAre(Some(PageMap {
                page,
                first: 0,
                masks: vec![u32::MAX; chunks as usize],
                fills: false,
            }))
        };
        assert!(s.outcome(1, Ok(map(64 << 10, 3))).is_some());
        assert!(s.outcome(1, Ok(map(64 << 10, PAGE_MAP_WORDS))).is_some());
        assert!(s.outcome(1, Ok(Msg::PagesAre(None))).is_some());
        // Pages that are no chunk's 32nd, or more chunks than a map holds: refused, suspect.
        assert_eq!(s.outcome(1, Ok(map(0, 3))), None);
        assert_eq!(s.outcome(1, Ok(map(3 << 10, 3))), None);
        assert_eq!(s.outcome(1, Ok(map(1 << 40, 3))), None);
        assert_eq!(s.outcome(2, Ok(map(64 << 10, PAGE_MAP_WORDS + 1))), None);
        assert!(s.suspects().contains(&1) && s.suspects().contains(&2));
        // A question about a path that could escape the cache is refused too.
        let ask = |path: &str| Msg::PagesOf {
            path: path.into(),
            version: v(),
            offset: 0,
        };
        assert!(s.check(&ask("train/x.h5"), Some(1)).is_ok());
        assert!(s.check(&ask("../etc/shadow"), Some(1)).is_err());
    }

    #[test]
    fn only_a_directorys_keepers_copy_its_names() {
        let s = service(0);
        let order = s.membership.global_order("d");
        let replica = Msg::NameReplica {
            dir: "d".into(),
            name: "n".into(),
            entry: None,
        };
        // The home and its backup copy names to each other; the third node does not.
        assert!(s.check(&replica, Some(order[0])).is_ok());
        assert!(s.check(&replica, Some(order[1])).is_ok());
        let why = s.check(&replica, Some(order[2])).unwrap_err();
        assert!(why.contains("keeps no names"), "{why}");
        let batch = Msg::Batch(vec![replica.clone()]);
        assert!(s.check(&batch, Some(order[2])).is_err());
        // With the home down, the next two keep them.
        s.liveness.set(order[0], true);
        assert!(s.check(&replica, Some(order[2])).is_ok());
    }

    #[test]
    fn a_record_keeps_its_bytes_unless_its_holder_changes_them() {
        let dir = crate::core::names::links_dir("1-a-1");
        let record = |holder: NodeId, object: &str, mode| Name {
            object: object.into(),
            size: 3,
            mtime_ns: 1,
            mode,
            holder,
            meta: crate::core::names::NameMeta {
                inode: "1-a-1".into(),
                nlink: 2,
                ..Default::default()
            },
            ..Default::default()
        };
        let theirs = record(1, "//produced/1/a-1", 0o600);
        let change = |old: Option<&Name>, new: Option<&Name>, peer| {
            check_change(&dir, "1-a-1", old, new, Some(peer))
        };
        // Node 2 may chmod it, link it or remove it, not give it other bytes.
        assert!(
            change(
                Some(&theirs),
                Some(&record(1, "//produced/1/a-1", 0o644)),
                2
            )
            .is_ok()
        );
        assert!(change(Some(&theirs), None, 2).is_ok());
        let why = change(
            Some(&theirs),
            Some(&record(2, "//produced/2/b-1", 0o644)),
            2,
        );
        assert!(why.unwrap_err().contains("changed the bytes"));
        // Its holder may (a new version); a new record's key is its maker's.
        assert!(
            change(
                Some(&theirs),
                Some(&record(1, "//produced/1/a-2", 0o600)),
                1
            )
            .is_ok()
        );
        assert!(change(None, Some(&theirs), 1).is_ok());
        assert!(change(None, Some(&theirs), 2).is_err());
        // Names outside the records' directories are not this check's.
        assert!(check_change("out", "x", Some(&theirs), None, Some(2)).is_ok());
    }

    /// A name claiming more bytes than any node may produce is refused before a consumer
    /// allocates its chunk table (8 bytes a chunk: 64 MiB for 16 TiB, and an abort for more).
    #[test]
    fn a_name_claiming_a_huge_size_is_refused() {
        let m = Membership::parse("0 127.0.0.1:7400 r0\n1 127.0.0.1:7401 r0\n", 0).unwrap();
        let name = |size| Name {
            object: "//produced/1/1-2".into(),
            size,
            holder: 1,
            mode: 0o644,
            ..Name::default()
        };
        assert_eq!(check_name(&name(3 << 30), &m), Ok(()));
        for size in [16 << 40, 1 << 50, u64::MAX] {
            let e = check_name(&name(size), &m).expect_err("refused");
            assert!(e.contains("bytes"), "{e}");
        }
    }
}
