//! What a locator message from the wire must satisfy before any table is touched: paths, names
//! and object ids well formed (see [`crate::core::paths`]), node ids known, and a message that
//! speaks for its sender (a publish, a failed fetch, a rejoin, a member's own lookup, a rack's
//! change) sent by that sender, the authenticated peer.

use super::membership::{Membership, NodeId};
use super::proto::Msg;
use super::service::LocatorService;
use crate::core::names::{FILE_SIZE_MAX, Name, TARGET_MAX, is_links_dir};

impl LocatorService {
    /// Whether a request's paths, names and node ids are well formed and known (see
    /// [`crate::core::paths`]): unknown node ids, paths that could escape a root, and object ids
    /// that are not tokens of their holder are refused before any table is touched.
    /// A message that speaks for its sender (a publish, a failed fetch, a rejoin, a member's
    /// own lookup, a rack's change) must come from that sender: `peer` is the authenticated id.
    pub(super) fn check(&self, msg: &Msg, peer: Option<NodeId>) -> Result<(), String> {
        use crate::core::paths::{cache_key, dataset_path, name as one_name, object_id};
        let member = |id: NodeId| self.membership.check_member(id);
        let key = |p: &str| cache_key(p).map_err(|e| format!("{p:?}: {e}"));
        let dir = |p: &str| {
            if is_links_dir(p) {
                return Ok(());
            }
            dataset_path(p).map_err(|e| format!("{p:?}: {e}"))
        };
        let one = |n: &str| one_name(n).map_err(|e| format!("{n:?}: {e}"));
        let sender = |id: NodeId| match peer {
            Some(p) if p != id => Err(format!("node {p} spoke for node {id}")),
            _ => member(id),
        };
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
            Msg::NameGet { dir: d, name, .. } => {
                dir(d)?;
                one(name)
            }
            Msg::NameList { dir: d } => dir(d),
            Msg::NameSet {
                dir: d,
                name,
                entry,
            }
            | Msg::NameReplica {
                dir: d,
                name,
                entry,
            } => {
                dir(d)?;
                one(name)?;
                match entry {
                    Some(n) => check_name(n, &self.membership),
                    None => Ok(()),
                }
            }
            Msg::Unhold { object, .. } => match object_id(object) {
                Ok(node) if node == self.me() => Ok(()),
                _ => Err(format!("{object:?} is not an object of this node")),
            },
            Msg::Batch(msgs) => msgs.iter().try_for_each(|m| self.check(m, peer)),
            _ => Ok(()),
        }
    }
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
    use super::*;

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
