//! Who is in the cluster: the peers file (`ID HOST:PORT RACK` per line, the same file on every
//! node; HOST an address or a name, resolved as the file is read), each member's rack, and which member is home for a path in each tier.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

pub use crate::core::NodeId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub rack: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PeersError {
    #[error("line {line}: expected `ID HOST:PORT RACK`, got {text:?}")]
    Malformed { line: usize, text: String },
    #[error("line {line}: {id:?} is not a node id (a number)")]
    BadId { line: usize, id: String },
    #[error("line {line}: {addr:?} is not an address: {why}")]
    BadAddress {
        line: usize,
        addr: String,
        why: String,
    },
    #[error("line {line}: node id {id} appears twice (first on line {first})")]
    DuplicateId {
        line: usize,
        id: NodeId,
        first: usize,
    },
    #[error("line {line}: address {addr} appears twice (first on line {first})")]
    DuplicateAddress {
        line: usize,
        addr: SocketAddr,
        first: usize,
    },
    #[error("this node's id {0} is not in the peers file")]
    OwnIdMissing(NodeId),
    #[error("the peers file lists no nodes")]
    Empty,
}

#[derive(Debug, Clone)]
pub struct Membership {
    own: NodeId,
    members: BTreeMap<NodeId, Member>,
    racks: BTreeMap<String, Vec<NodeId>>,
}

impl Membership {
    /// Parses a peers file; `#` starts a comment, blank lines are ignored.
    pub fn parse(text: &str, own: NodeId) -> Result<Membership, PeersError> {
        let mut members = Vec::new();
        let mut ids: HashMap<NodeId, usize> = HashMap::new();
        let mut addrs: HashMap<SocketAddr, usize> = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let fields: Vec<&str> = content.split_whitespace().collect();
            let [id, addr, rack] = fields[..] else {
                return Err(PeersError::Malformed {
                    line,
                    text: content.into(),
                });
            };
            let id: NodeId = id.parse().map_err(|_| PeersError::BadId {
                line,
                id: id.into(),
            })?;
            // A host name is resolved here, once: the membership holds addresses.
            let addr: SocketAddr =
                crate::core::addr::socket_addr(addr).map_err(|why| PeersError::BadAddress {
                    line,
                    addr: addr.into(),
                    why,
                })?;
            if let Some(&first) = ids.get(&id) {
                return Err(PeersError::DuplicateId { line, id, first });
            }
            if let Some(&first) = addrs.get(&addr) {
                return Err(PeersError::DuplicateAddress { line, addr, first });
            }
            ids.insert(id, line);
            addrs.insert(addr, line);
            members.push(Member {
                id,
                addr,
                rack: rack.into(),
            });
        }
        Membership::new(members, own)
    }

    pub fn new(members: Vec<Member>, own: NodeId) -> Result<Membership, PeersError> {
        if members.is_empty() {
            return Err(PeersError::Empty);
        }
        let mut racks: BTreeMap<String, Vec<NodeId>> = BTreeMap::new();
        for m in &members {
            racks.entry(m.rack.clone()).or_default().push(m.id);
        }
        let members: BTreeMap<NodeId, Member> = members.into_iter().map(|m| (m.id, m)).collect();
        if !members.contains_key(&own) {
            return Err(PeersError::OwnIdMissing(own));
        }
        Ok(Membership {
            own,
            members,
            racks,
        })
    }

    pub fn own(&self) -> NodeId {
        self.own
    }

    pub fn member(&self, id: NodeId) -> Option<&Member> {
        self.members.get(&id)
    }

    /// `Ok` if `id` is a member; the refusal to send back otherwise (an id from the wire).
    pub fn check_member(&self, id: NodeId) -> Result<(), String> {
        self.member(id)
            .map(|_| ())
            .ok_or_else(|| format!("node {id} is not a member"))
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// The rack of a member ("" for an id that is not one: never a panic on a wire number).
    pub fn rack_of(&self, id: NodeId) -> &str {
        self.members.get(&id).map_or("", |m| m.rack.as_str())
    }

    pub fn rack_members(&self, rack: &str) -> &[NodeId] {
        self.racks.get(rack).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn racks(&self) -> impl Iterator<Item = &str> {
        self.racks.keys().map(String::as_str)
    }

    /// The member of `rack` that knows which rack members hold `path`.
    pub fn rack_home(&self, path: &str, rack: &str) -> NodeId {
        hrw(path, self.rack_members(rack))
    }

    /// The node that knows which racks hold `path` and coordinates its first fetch.
    pub fn global_home(&self, path: &str) -> NodeId {
        let all: Vec<NodeId> = self.members.keys().copied().collect();
        hrw(path, &all)
    }

    /// [`Membership::rack_home`] among the members that are not `down`: a dead home's paths
    /// go to the next member in each path's rendezvous order, the others stay where they are.
    /// (All of a rack down: its home as if all were up.)
    pub fn live_rack_home(&self, path: &str, rack: &str, down: impl Fn(NodeId) -> bool) -> NodeId {
        live_hrw(path, self.rack_members(rack), down)
    }

    /// The member after `path`'s live global home in its rendezvous order (its home if the
    /// home dies); `None` with a single live member.
    pub fn live_global_backup(&self, path: &str, down: impl Fn(NodeId) -> bool) -> Option<NodeId> {
        let live: Vec<NodeId> = self.members.keys().copied().filter(|&n| !down(n)).collect();
        let home = hrw(path, &live);
        let rest: Vec<NodeId> = live.into_iter().filter(|&n| n != home).collect();
        (!rest.is_empty()).then(|| hrw(path, &rest))
    }

    /// Every member in `path`'s global rendezvous order: its home first, then its backup...
    pub fn global_order(&self, path: &str) -> Vec<NodeId> {
        let h = crate::core::path_hash(path);
        let mut all: Vec<NodeId> = self.members.keys().copied().collect();
        all.sort_by_key(|&id| std::cmp::Reverse(weight(h, id)));
        all
    }

    /// [`Membership::global_home`] among the members that are not `down`.
    pub fn live_global_home(&self, path: &str, down: impl Fn(NodeId) -> bool) -> NodeId {
        let all: Vec<NodeId> = self.members.keys().copied().collect();
        live_hrw(path, &all, down)
    }
}

/// Rendezvous (highest random weight) hashing: every node computes the same home, and when a
/// member leaves only the paths it was home of move.
fn hrw(path: &str, candidates: &[NodeId]) -> NodeId {
    let h = crate::core::path_hash(path);
    *candidates
        .iter()
        .max_by_key(|&&id| weight(h, id))
        .expect("a rack has at least one member")
}

/// Node `id`'s weight for a path of hash `h`: the highest is the path's home.
fn weight(h: u64, id: NodeId) -> u64 {
    mix(h ^ u64::from(id).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn live_hrw(path: &str, candidates: &[NodeId], down: impl Fn(NodeId) -> bool) -> NodeId {
    let live: Vec<NodeId> = candidates.iter().copied().filter(|&n| !down(n)).collect();
    if live.is_empty() {
        hrw(path, candidates)
    } else {
        hrw(path, &live)
    }
}

/// splitmix64's finaliser: spreads nearby inputs over the whole range.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The node id a launcher gives this process, if any: (variable, id).
pub fn node_id_from_launcher() -> Option<(&'static str, NodeId)> {
    [
        "SLURM_NODEID",
        "FLUX_TASK_RANK",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
    ]
    .into_iter()
    .find_map(|var| Some((var, std::env::var(var).ok()?.trim().parse().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# id address rack\n0 127.0.0.1:7400 r0\n1 127.0.0.1:7401 r0\n\n2 127.0.0.1:7402 r1 # two\n3 127.0.0.1:7403 r1\n";

    #[test]
    fn a_dead_home_moves_only_its_own_paths() {
        let m = Membership::parse(FILE, 2).unwrap();
        let paths: Vec<String> = (0..200).map(|i| format!("d/{i}")).collect();
        let dead = 3;
        for p in &paths {
            let home = m.global_home(p);
            let live = m.live_global_home(p, |n| n == dead);
            if home == dead {
                assert_ne!(live, dead);
            } else {
                assert_eq!(live, home, "a live home's path moved");
            }
            let rack_home = m.rack_home(p, "r1");
            let live = m.live_rack_home(p, "r1", |n| n == dead);
            assert_eq!(live, if rack_home == dead { 2 } else { rack_home });
            // A rack with every member down keeps its homes.
            assert_eq!(m.live_rack_home(p, "r1", |_| true), rack_home);
        }
    }

    #[test]
    fn parses_members_and_racks() {
        let m = Membership::parse(FILE, 2).unwrap();
        assert_eq!(m.members().count(), 4);
        assert_eq!(m.rack_of(3), "r1");
        assert_eq!(m.rack_members("r0"), &[0, 1]);
        assert_eq!(m.racks().collect::<Vec<_>>(), ["r0", "r1"]);
    }

    #[test]
    fn bad_files_name_the_culprit() {
        let e = |t: &str, own| Membership::parse(t, own).unwrap_err();
        assert_eq!(
            e("0 127.0.0.1:1 r0\n0 127.0.0.1:2 r0\n", 0),
            PeersError::DuplicateId {
                line: 2,
                id: 0,
                first: 1
            }
        );
        assert!(matches!(
            e("0 localhost r0\n", 0),
            PeersError::BadAddress { line: 1, .. }
        ));
        assert!(matches!(
            e("0 127.0.0.1:1\n", 0),
            PeersError::Malformed { .. }
        ));
        assert!(matches!(
            e("x 127.0.0.1:1 r\n", 0),
            PeersError::BadId { .. }
        ));
        assert!(matches!(
            e("0 127.0.0.1:1 r\n1 127.0.0.1:1 r\n", 0),
            PeersError::DuplicateAddress { line: 2, .. }
        ));
        // Host names resolve as the file is read: one that names an address twice is found.
        let named = Membership::parse("0 localhost:7400 r0\n1 127.0.0.1:7401 r0\n", 0).unwrap();
        assert!(named.member(0).unwrap().addr.ip().is_loopback());
        assert!(matches!(
            e("0 localhost:7400 r\n1 127.0.0.1:7400 r\n", 0),
            PeersError::DuplicateAddress { line: 2, .. }
        ));
        assert!(matches!(
            e("0 no-such-host.invalid:7400 r\n", 0),
            PeersError::BadAddress { line: 1, .. }
        ));
        assert_eq!(e(FILE, 9), PeersError::OwnIdMissing(9));
        assert_eq!(e("# nobody\n", 0), PeersError::Empty);
        assert!(e("0 localhost r0\n", 0).to_string().contains("localhost"));
    }

    #[test]
    fn homes_agree_everywhere_and_spread() {
        let a = Membership::parse(FILE, 0).unwrap();
        let b = Membership::parse(FILE, 3).unwrap();
        let mut per_home = [0; 4];
        for i in 0..4000 {
            let p = format!("train/{i}.npz");
            assert_eq!(a.global_home(&p), b.global_home(&p));
            assert!(a.rack_members("r1").contains(&a.rack_home(&p, "r1")));
            per_home[a.global_home(&p) as usize] += 1;
        }
        assert!(per_home.iter().all(|&n| n > 800), "{per_home:?}");
    }
}
