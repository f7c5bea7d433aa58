//! A managed directory's shared file system: its root and nothing beneath it. The root is a
//! directory of the node's own cache disk that nothing ever writes into (produced files live in
//! the cache), so every path beneath it is known not to exist without asking the kernel.
//!
//! Why not ask: a consumer's lookup of a name not yet published stat'ed it first, and that
//! `openat2`, failing with ENOENT, was where 1% of the hand-off's lookups stalled for 15-30 ms
//! on a 16-core host (traced: `shared_stat` p50 6 us, max 29 ms, on both consumers' nodes at
//! once). Asking the kernel for an answer known in advance was also a system call per lookup.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;

use super::port::{BackingStat, SharedFs};
use crate::core::Kind;

/// `inner` (the real root) answers for the root itself; every other path is absent.
pub struct EmptyTree<S>(pub S);

fn absent<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::ENOENT))
}

impl<S: SharedFs> SharedFs for EmptyTree<S> {
    fn stat(&self, rel: &str) -> io::Result<BackingStat> {
        if rel.is_empty() {
            self.0.stat(rel)
        } else {
            absent()
        }
    }

    fn list(&self, rel: &str) -> io::Result<Vec<(OsString, Kind)>> {
        if rel.is_empty() {
            Ok(Vec::new())
        } else {
            absent()
        }
    }

    fn read_link(&self, rel: &str) -> io::Result<PathBuf> {
        if rel.is_empty() {
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        } else {
            absent()
        }
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.0.statvfs()
    }

    fn surely_absent(&self, rel: &str) -> bool {
        !rel.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::memory::{Call, MemShared};

    #[test]
    fn only_the_root_and_the_disk_are_asked_of_the_real_tree() {
        let inner = MemShared::default();
        // Even a file that somehow got into the directory is not presented.
        inner.file("run/f0", 10, 1);
        let tree = EmptyTree(inner);
        assert!(tree.stat("").unwrap().is_dir());
        for path in ["run", "run/f0", "a/b/c"] {
            let e = tree.stat(path).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{path}");
            assert_eq!(
                tree.list(path).unwrap_err().raw_os_error(),
                Some(libc::ENOENT)
            );
            assert_eq!(
                tree.read_link(path).unwrap_err().raw_os_error(),
                Some(libc::ENOENT)
            );
        }
        assert!(tree.list("").unwrap().is_empty());
        assert!(!tree.surely_absent("") && tree.surely_absent("run"));
        tree.statvfs().unwrap();
        assert_eq!(tree.0.made(Call::Stat), 1);
        assert_eq!(tree.0.made(Call::List), 0);
        assert_eq!(tree.0.made(Call::ReadLink), 0);
        assert_eq!(tree.0.made(Call::Statvfs), 1);
    }
}
