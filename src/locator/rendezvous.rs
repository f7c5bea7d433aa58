//! Bootstrap without a peers file: each daemon writes `ID HOST:PORT RACK` into a file of its
//! own in a directory on the shared file system and waits (bounded) until K nodes have. The
//! result is the same membership a peers file would give.
//!
//! The directory is the job user's, and the daemon is often root: nothing in it is trusted as a
//! path. Every entry is opened without following a symlink (`O_NOFOLLOW`, and `O_NONBLOCK` so a
//! FIFO cannot stall the mount), checked on its descriptor to be a regular file of the daemon's
//! user or the directory's owner, and read with a size bound; our own file is created with
//! `O_EXCL` and renamed into place. A hostile entry fails the mount with one line naming it, so
//! no root file is ever read or written through one.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::membership::{Member, Membership, NodeId, PeersError};

/// The most a `*.node` file may hold: one line of an id, an address and a rack name.
pub const MAX_NODE_FILE: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("rendezvous dir {dir}: {source}")]
    Io { dir: String, source: std::io::Error },
    #[error("rendezvous dir {dir}: refused {entry}: {why}")]
    Hostile {
        dir: String,
        entry: String,
        why: String,
    },
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

/// The users whose files in the directory are taken as written by a daemon of the job: this
/// process's and the directory's owner's (root's daemons write as root; a plain user's as it).
struct Owners {
    me: u32,
    dir: u32,
}

impl Owners {
    fn allows(&self, uid: u32) -> bool {
        uid == self.me || uid == self.dir
    }
}

/// Opens `dir` itself, refusing a final symlink that another user could aim anywhere.
fn check_dir(dir: &Path) -> Result<Owners, String> {
    let me = crate::sys::euid();
    let m = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if m.file_type().is_symlink() && m.uid() != 0 && m.uid() != me {
        return Err(format!("it is a symlink owned by uid {}", m.uid()));
    }
    let m = std::fs::metadata(dir).map_err(|e| e.to_string())?;
    if !m.is_dir() {
        return Err("not a directory".into());
    }
    Ok(Owners { me, dir: m.uid() })
}

/// Reads one entry of the directory as a node file: not through a symlink, a regular file of
/// one of `owners`, at most [`MAX_NODE_FILE`] bytes. `Err` is the reason it is refused.
fn read_node_file(path: &Path, owners: &Owners) -> Result<String, String> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "a symlink".to_string(),
            _ => e.to_string(),
        })?;
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if !owners.allows(m.uid()) {
        return Err(format!(
            "owned by uid {}, neither this daemon's ({}) nor the directory's ({})",
            m.uid(),
            owners.me,
            owners.dir
        ));
    }
    let mut bytes = Vec::new();
    Read::by_ref(&mut f)
        .take(MAX_NODE_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_NODE_FILE {
        return Err(format!("longer than {MAX_NODE_FILE} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| "not text".into())
}

/// Writes this node's line: into a temp file created with `O_EXCL` (never an entry someone
/// planted), then renamed over `ID.node` (a rename replaces a symlink, never follows it).
fn write_own(dir: &Path, me: &Member, owners: &Owners) -> Result<(), (PathBuf, String)> {
    let tmp = dir.join(format!(".{}.node.tmp", me.id));
    let fail = |p: &Path, e: String| (p.to_path_buf(), e);
    // Our own leftover from a crash is removed; anything else there is refused. (An unlink
    // never follows a symlink, so the race between the two calls redirects nothing.)
    match std::fs::symlink_metadata(&tmp) {
        Ok(m) if m.file_type().is_file() && owners.allows(m.uid()) => {
            std::fs::remove_file(&tmp).map_err(|e| fail(&tmp, e.to_string()))?
        }
        Ok(m) if m.file_type().is_symlink() => return Err(fail(&tmp, "a symlink".into())),
        Ok(m) => {
            return Err(fail(
                &tmp,
                format!("not a regular file of ours (uid {})", m.uid()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(&tmp, e.to_string())),
    }
    let line = format!("{} {} {}\n", me.id, me.addr, me.rack);
    // Our id taken by another daemon (a duplicate --node-id, or an earlier job's directory):
    // said at once, instead of both waiting out the rendezvous and counting one node short.
    let own = dir.join(format!("{}.node", me.id));
    if own.symlink_metadata().is_ok() {
        let theirs = read_node_file(&own, owners).map_err(|why| fail(&own, why))?;
        if theirs != line {
            return Err(fail(
                &own,
                format!(
                    "node id {} is already registered as `{}` (a duplicate --node-id, or a \
                     directory of another job: remove the file)",
                    me.id,
                    theirs.trim()
                ),
            ));
        }
    }
    let mut f: File = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| fail(&tmp, e.to_string()))?;
    f.write_all(line.as_bytes())
        .map_err(|e| fail(&tmp, e.to_string()))?;
    drop(f);
    std::fs::rename(&tmp, &own).map_err(|e| fail(&own, e.to_string()))
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
    let hostile = |entry: &Path, why: String| RendezvousError::Hostile {
        dir: d.clone(),
        entry: entry.file_name().map_or_else(
            || entry.display().to_string(),
            |n| n.to_string_lossy().into(),
        ),
        why,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let owners = check_dir(dir).map_err(|why| hostile(dir, why))?;
    write_own(dir, me, &owners).map_err(|(p, why)| hostile(&p, why))?;
    let start = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let mut text = String::new();
        let mut ids: Vec<NodeId> = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io)? {
            let path = e.map_err(io)?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let Some(stem) = name.as_deref().and_then(|n| n.strip_suffix(".node")) else {
                continue;
            };
            let t = read_node_file(&path, &owners).map_err(|why| hostile(&path, why))?;
            let id: Option<NodeId> = t.split_whitespace().next().and_then(|i| i.parse().ok());
            match id {
                Some(id) if stem == id.to_string() => ids.push(id),
                // Half-written files never appear (they are renamed into place whole).
                _ => {
                    return Err(hostile(
                        &path,
                        "its line does not start with the node id its name gives".into(),
                    ));
                }
            }
            text.push_str(&t);
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

    /// A second daemon with an id already registered at another address is refused at once,
    /// naming both; the same daemon starting again (the same line) is not.
    #[test]
    fn a_duplicate_node_id_is_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("dyadfs-rdv-dup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        rendezvous(&dir, &member(0), 1, Duration::from_secs(5)).unwrap();
        rendezvous(&dir, &member(0), 1, Duration::from_secs(5)).unwrap();
        let mut other = member(0);
        other.addr = "127.0.0.1:9999".parse().unwrap();
        let t = Instant::now();
        let err = rendezvous(&dir, &other, 2, Duration::from_secs(30)).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5));
        let err = err.to_string();
        assert!(
            err.contains("0.node") && err.contains("already registered"),
            "{err}"
        );
        assert!(err.contains("127.0.0.1:7400"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A daemon restarted after a crash finds its own temp file and goes on; an oversized node
    /// file is refused by name without being read whole.
    #[test]
    fn a_stale_temp_file_of_ours_is_replaced_and_a_huge_node_file_refused() {
        let dir = std::env::temp_dir().join(format!("dyadfs-rdv-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(".0.node.tmp"), b"half a li").unwrap();
        let m = rendezvous(&dir, &member(0), 1, Duration::from_secs(5)).unwrap();
        assert_eq!(m.members().count(), 1);
        let big = std::fs::File::create(dir.join("1.node")).unwrap();
        big.set_len(1 << 30).unwrap();
        let err = rendezvous(&dir, &member(0), 2, Duration::from_secs(5)).unwrap_err();
        assert!(err.to_string().contains("1.node"), "{err}");
        assert!(err.to_string().contains("longer than"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
