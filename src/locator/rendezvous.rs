//! Bootstrap without a peers file: each daemon writes `ID HOST:PORT RACK` into a file of its
//! own in a directory on the shared file system and waits (bounded) until K nodes have. The
//! result is the same membership a peers file would give.

use std::path::Path;
use std::time::{Duration, Instant};

use super::membership::{Member, Membership, NodeId, PeersError};

#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("rendezvous dir {dir}: {source}")]
    Io { dir: String, source: std::io::Error },
    #[error(
        "rendezvous dir {dir}: {found} of {wanted} nodes registered after {waited:?} (present: {present})"
    )]
    Timeout {
        dir: String,
        found: usize,
        wanted: usize,
        waited: Duration,
        present: String,
    },
    #[error("rendezvous dir {dir} holds more than {wanted} nodes: {present}")]
    TooMany {
        dir: String,
        wanted: usize,
        present: String,
    },
    #[error("rendezvous dir {dir}: {source}")]
    Peers { dir: String, source: PeersError },
}

pub fn rendezvous(
    dir: &Path,
    me: &Member,
    nodes: usize,
    timeout: Duration,
) -> Result<Membership, RendezvousError> {
    let d = dir.display().to_string();
    let io = |source| RendezvousError::Io {
        dir: d.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let line = format!("{} {} {}\n", me.id, me.addr, me.rack);
    // Written whole then renamed, so a reader never sees half a line.
    let tmp = dir.join(format!(".{}.node.tmp", me.id));
    std::fs::write(&tmp, line).map_err(io)?;
    std::fs::rename(&tmp, dir.join(format!("{}.node", me.id))).map_err(io)?;
    let start = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let mut text = String::new();
        let mut ids: Vec<NodeId> = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io)? {
            let path = e.map_err(io)?.path();
            if path.extension().is_some_and(|x| x == "node") {
                let t = std::fs::read_to_string(&path).map_err(io)?;
                if let Some(id) = t.split_whitespace().next().and_then(|i| i.parse().ok()) {
                    ids.push(id);
                }
                text.push_str(&t);
            }
        }
        ids.sort();
        let present = format!("{ids:?}");
        if ids.len() > nodes {
            return Err(RendezvousError::TooMany {
                dir: d,
                wanted: nodes,
                present,
            });
        }
        if ids.len() == nodes {
            return Membership::parse(&text, me.id)
                .map_err(|source| RendezvousError::Peers { dir: d, source });
        }
        if start.elapsed() >= timeout {
            return Err(RendezvousError::Timeout {
                dir: d,
                found: ids.len(),
                wanted: nodes,
                waited: start.elapsed(),
                present,
            });
        }
        // A shared file system has no cross-node change notification: poll, backing off.
        std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: NodeId) -> Member {
        Member {
            id,
            addr: format!("127.0.0.1:{}", 7400 + id).parse().unwrap(),
            rack: format!("r{}", id / 2),
        }
    }

    #[test]
    fn four_nodes_meet_and_a_missing_one_times_out() {
        let dir = std::env::temp_dir().join(format!("dyadfs-rdv-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let handles: Vec<_> = (0..4)
            .map(|id| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    rendezvous(&dir, &member(id), 4, Duration::from_secs(10))
                })
            })
            .collect();
        for h in handles {
            let m = h.join().unwrap().unwrap();
            assert_eq!(m.members().count(), 4);
            assert_eq!(m.rack_members("r1"), &[2, 3]);
        }
        let err = rendezvous(&dir, &member(0), 5, Duration::from_millis(100)).unwrap_err();
        assert!(err.to_string().contains("4 of 5 nodes"), "{err}");
        let err = rendezvous(&dir, &member(0), 3, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, RendezvousError::TooMany { .. }));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
