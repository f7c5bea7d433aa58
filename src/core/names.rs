//! Produced names: what a file or directory written under the mount is published as, and the
//! [`Namespace`] that holds the names (in process on a single node, at name homes in a
//! cluster; see `locator::names`).

use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::NodeId;

pub use super::paths::OBJECT_PREFIX;

pub fn is_object(path: &str) -> bool {
    path.starts_with(OBJECT_PREFIX)
}

/// The node that produced an object (`//produced/<node>/<unique>`).
pub fn producer_of(object: &str) -> Option<NodeId> {
    object
        .strip_prefix(OBJECT_PREFIX)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// One published name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Name {
    pub dir: bool,
    /// The object holding a file's bytes (empty for a directory).
    pub object: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub mode: u32,
    /// The producer: it keeps the object while the name points at it.
    pub holder: NodeId,
    /// The owner: the user and group of the process that created it.
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
}

/// How the filesystem reaches the produced namespace: in process on a single node, by RPC to
/// name homes in a cluster.
pub trait Namespace: Send + Sync + 'static {
    /// The name, waiting up to `wait` for it to be published.
    fn get(&self, dir: &str, name: &str, wait: Duration) -> io::Result<Option<Name>>;
    fn list(&self, dir: &str) -> io::Result<Vec<(String, Name)>>;
    /// Publishes or removes a name; returns what it replaced.
    fn set(&self, dir: &str, name: &str, entry: Option<Name>) -> io::Result<Option<Name>>;
    /// Tells `holder` the name no longer points at `object`: `drop` (unlinked) deletes its
    /// copy now, otherwise (replaced by a new version) the copy becomes ordinary evictable
    /// cache, so a reader of the old version keeps reading it.
    fn release(&self, holder: NodeId, object: &str, size: u64, mtime_ns: i64, drop: bool);
    /// This node's id (the holder of what it produces).
    fn me(&self) -> NodeId;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_never_backing_paths() {
        assert!(is_object("//produced/1/abc"));
        assert!(!is_object("train/a.npz"));
        assert_eq!(producer_of("//produced/17/abc-1"), Some(17));
        assert_eq!(producer_of("train/17/abc"), None);
    }
}
