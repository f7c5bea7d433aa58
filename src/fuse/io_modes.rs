//! How the kernel reads each open inode, and the rules it imposes: it fails an open with EIO
//! when modes would mix on one inode. While an inode has a passthrough open, every open of it
//! must be a passthrough open of the same backing file (the same cached version); and a
//! passthrough open is refused while the inode has opens served by the daemon (which use the
//! page cache). The adapter asks [`IoModes::decide`] at every open and records the outcome;
//! `B` is the kernel's backing id (a fuser type the adapter owns).

use std::collections::HashMap;

use crate::core::Version;

/// What an open of an inode becomes.
#[derive(Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Served by the daemon.
    Daemon,
    /// Passthrough to the backing file already registered for the inode.
    Passthrough,
    /// Passthrough to a backing file to register first (then [`IoModes::bind`]).
    Bind,
    /// Another version is open in passthrough mode: the kernel would fail the open with EIO,
    /// so it is refused (EBUSY) with a reason instead.
    Refuse,
}

pub struct IoModes<B> {
    /// inode -> (backing id, version, passthrough opens)
    backing: HashMap<u64, (B, Version, usize)>,
    /// inode -> opens served by the daemon
    daemon: HashMap<u64, usize>,
    /// fh -> (inode, passthrough)
    handles: HashMap<u64, (u64, bool)>,
}

impl<B> Default for IoModes<B> {
    fn default() -> Self {
        IoModes {
            backing: HashMap::new(),
            daemon: HashMap::new(),
            handles: HashMap::new(),
        }
    }
}

impl<B> IoModes<B> {
    /// The mode of a new open of `ino`; `offered`: the version the core offers for passthrough
    /// (a complete, verified cached copy), if any; `keep_pages`: the core would rather the
    /// daemon served it, the kernel keeping the pages it holds (`Opened::keep_pages`), which it
    /// does unless the inode is bound to passthrough already.
    pub fn decide(&self, ino: u64, offered: Option<Version>, keep_pages: bool) -> OpenMode {
        let bound = self.backing.get(&ino).map(|b| b.1);
        match (offered, bound) {
            // Daemon-served opens of this inode are still open: stay in their mode.
            (Some(_), None) if self.daemon.contains_key(&ino) => OpenMode::Daemon,
            (Some(_), None) if keep_pages => OpenMode::Daemon,
            (Some(_), None) => OpenMode::Bind,
            (Some(v), Some(b)) if v == b => OpenMode::Passthrough,
            (_, Some(_)) => OpenMode::Refuse,
            (None, None) => OpenMode::Daemon,
        }
    }

    /// Registers the backing file of `ino` (after [`OpenMode::Bind`]).
    pub fn bind(&mut self, ino: u64, id: B, version: Version) {
        self.backing.insert(ino, (id, version, 0));
    }

    /// Records open `fh` of `ino` in passthrough mode; returns the inode's backing id.
    pub fn passthrough(&mut self, fh: u64, ino: u64) -> &B {
        self.handles.insert(fh, (ino, true));
        let bound = self
            .backing
            .get_mut(&ino)
            .expect("bound before a passthrough open");
        bound.2 += 1;
        &bound.0
    }

    /// Records open `fh` of `ino` served by the daemon.
    pub fn served_by_daemon(&mut self, fh: u64, ino: u64) {
        *self.daemon.entry(ino).or_default() += 1;
        self.handles.insert(fh, (ino, false));
    }

    /// Forgets open `fh`; the last passthrough open of an inode lets go of its backing id,
    /// returned so that the caller drops it (which closes it in the kernel) outside its lock.
    pub fn released(&mut self, fh: u64) -> Option<B> {
        let (ino, passthrough) = self.handles.remove(&fh)?;
        if passthrough {
            if let Some((_, _, count)) = self.backing.get_mut(&ino) {
                *count -= 1;
                if *count == 0 {
                    return self.backing.remove(&ino).map(|(id, _, _)| id);
                }
            }
        } else if let Some(count) = self.daemon.get_mut(&ino) {
            *count -= 1;
            if *count == 0 {
                self.daemon.remove(&ino);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: Version = Version {
        size: 1,
        mtime_ns: 1,
    };
    const V2: Version = Version {
        size: 2,
        mtime_ns: 2,
    };

    #[test]
    fn modes_never_mix_on_one_inode() {
        let mut m: IoModes<&str> = IoModes::default();
        // Nothing to pass through: the daemon serves.
        assert_eq!(m.decide(5, None, false), OpenMode::Daemon);
        m.served_by_daemon(1, 5);
        // A complete copy now, but a daemon-served open is still there.
        assert_eq!(m.decide(5, Some(V1), false), OpenMode::Daemon);
        m.served_by_daemon(2, 5);
        assert_eq!(m.released(1), None);
        assert_eq!(m.released(2), None);
        // The inode is free: bind its backing file, then share it.
        assert_eq!(m.decide(5, Some(V1), false), OpenMode::Bind);
        m.bind(5, "id-v1", V1);
        assert_eq!(*m.passthrough(3, 5), "id-v1");
        assert_eq!(m.decide(5, Some(V1), false), OpenMode::Passthrough);
        assert_eq!(*m.passthrough(4, 5), "id-v1");
        // Another version, or no copy to pass through, while bound: refused, not EIO.
        assert_eq!(m.decide(5, Some(V2), false), OpenMode::Refuse);
        assert_eq!(m.decide(5, None, false), OpenMode::Refuse);
        // Other inodes are not affected.
        assert_eq!(m.decide(6, Some(V2), false), OpenMode::Bind);
        // Bound, an open that would rather be daemon-served passes through too (modes would
        // mix), and one of another version is still refused.
        assert_eq!(m.decide(5, Some(V1), true), OpenMode::Passthrough);
        assert_eq!(m.decide(5, Some(V2), true), OpenMode::Refuse);
        // Unbound, it is served by the daemon.
        assert_eq!(m.decide(7, Some(V1), true), OpenMode::Daemon);
        // The last passthrough close unbinds, handing the backing id back to be closed.
        assert_eq!(m.released(3), None);
        assert_eq!(m.decide(5, Some(V2), false), OpenMode::Refuse);
        assert_eq!(m.released(4), Some("id-v1"));
        assert_eq!(m.decide(5, Some(V2), false), OpenMode::Bind);
        assert_eq!(m.released(99), None);
    }
}
