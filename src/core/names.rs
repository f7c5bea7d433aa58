//! Produced names: what a file or directory written under the mount is published as, and the
//! [`Namespace`] that holds the names (in process on a single node, at name homes in a
//! cluster; see `locator::names`).

use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ids::NodeId;

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// What else it is (a symlink, a device...) and the times users set on it.
    #[serde(default)]
    pub meta: NameMeta,
}

/// A name's kind beyond a file or a directory, and its times beyond the object's version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameMeta {
    /// `S_IFLNK`, `S_IFIFO`, `S_IFCHR`, `S_IFBLK` or `S_IFSOCK` for a name without bytes
    /// (0: a file or a directory).
    pub special: u32,
    /// A symlink's target.
    pub target: String,
    /// A device node's number.
    pub rdev: u64,
    /// The modification time a user set (`None`: the version's `mtime_ns`, which names the
    /// object's bytes and so never changes without them).
    pub mtime_ns: Option<i64>,
    pub atime_ns: Option<i64>,
    /// When the name's attributes last changed (`None`: its modification time).
    pub ctime_ns: Option<i64>,
    /// A hard-linked file: the key of its record in [`links_dir`], which holds what all its
    /// names share (bytes, mode, owner, times, link count). A name with a key and no object
    /// points at the record; the record carries its own key.
    pub inode: String,
    /// A record's number of names.
    pub nlink: u32,
}

/// The namespace directories of hard-linked files' records (never a dataset path): 256 of
/// them, `//links/00` to `//links/ff`, so the records spread over as many name homes.
pub const LINKS_DIR: &str = "//links";

/// The directory of the record `key`.
pub fn links_dir(key: &str) -> String {
    format!("{LINKS_DIR}/{:02x}", super::ids::path_hash(key) & 0xff)
}

/// Whether `dir` is one of the records' directories.
pub fn is_links_dir(dir: &str) -> bool {
    dir.strip_prefix(LINKS_DIR)
        .and_then(|d| d.strip_prefix('/'))
        .is_some_and(|d| d.len() == 2 && d.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The longest symlink target a name may carry (`PATH_MAX`).
pub const TARGET_MAX: usize = 4096;

/// The most bytes a produced file may hold (4 TiB). A producer's write or truncate past it
/// fails with EFBIG, and a name claiming more is forged: refused before a consumer allocates
/// its chunk table (8 bytes a chunk, so at most 32 MiB at the smallest chunk size).
pub const FILE_SIZE_MAX: u64 = 4 << 40;

impl Name {
    /// The modification time users see.
    pub fn mtime(&self) -> i64 {
        self.meta.mtime_ns.unwrap_or(self.mtime_ns)
    }

    pub fn ctime(&self) -> i64 {
        self.meta.ctime_ns.unwrap_or_else(|| self.mtime())
    }

    pub fn atime(&self) -> i64 {
        self.meta.atime_ns.unwrap_or_else(|| self.mtime())
    }

    /// A regular file (or a pointer at a hard-linked one's record).
    pub fn is_file(&self) -> bool {
        !self.dir && self.meta.special == 0
    }

    /// A name that points at a hard-linked file's record instead of holding its attributes.
    pub fn is_pointer(&self) -> bool {
        !self.meta.inode.is_empty() && self.object.is_empty() && self.is_file()
    }

    /// The name that points at record `key`, made by `holder`.
    pub fn pointer(key: &str, holder: NodeId) -> Name {
        Name {
            holder,
            meta: NameMeta {
                inode: key.to_string(),
                ..NameMeta::default()
            },
            ..Name::default()
        }
    }
}

/// Now, in nanoseconds since the epoch (the clock of produced names' times).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as i64
}

/// What a wait that holds no thread is told (see [`Namespace::watch`]): the name once it is
/// published, or why it cannot be waited for.
pub type Wake = Box<dyn FnOnce(io::Result<Name>) + Send>;

/// A wait started by [`Namespace::watch`]; dropping it ends the wait.
pub type Watch = Box<dyn Send + Sync>;

/// How the filesystem reaches the produced namespace: in process on a single node, by RPC to
/// name homes in a cluster.
pub trait Namespace: Send + Sync + 'static {
    /// The name, waiting up to `wait` for it to be published.
    fn get(&self, dir: &str, name: &str, wait: Duration) -> io::Result<Option<Name>>;
    /// Waits for `name` of `dir` until `until` holding no thread (thousands of readers may wait
    /// at once): `wake` is called once, on any thread, when the name is published (at once if
    /// it is already), unless the returned watch was dropped first. A namespace that cannot
    /// hands `wake` back (the caller then waits in [`Namespace::get`]).
    fn watch(
        &self,
        _dir: &str,
        _name: &str,
        _until: std::time::Instant,
        wake: Wake,
    ) -> Result<Watch, Wake> {
        Err(wake)
    }
    fn list(&self, dir: &str) -> io::Result<Vec<(String, Name)>>;
    /// Whether `dir` holds any name (`rmdir` asks; a cluster asks for one page, not all).
    fn any(&self, dir: &str) -> io::Result<bool> {
        Ok(!self.list(dir)?.is_empty())
    }
    /// Publishes or removes a name; returns what it replaced.
    fn set(&self, dir: &str, name: &str, entry: Option<Name>) -> io::Result<Option<Name>>;
    /// Tells `holder` the name no longer points at `object`: `drop` (unlinked) deletes its
    /// copy now, otherwise (replaced by a new version) the copy becomes ordinary evictable
    /// cache, so a reader of the old version keeps reading it.
    fn release(&self, holder: NodeId, object: &str, size: u64, mtime_ns: i64, drop: bool);
    /// This node's id (the holder of what it produces).
    fn me(&self) -> NodeId;
}

/// Where a node keeps the names it holds (a single node's, or a home's and its backup copies)
/// so that a restart finds them again: told every change as it is made, and handed the live
/// names when it has grown well past them (a user renaming one file in a loop must not grow it
/// without bound).
pub trait NameJournal: Send + Sync + 'static {
    /// `name` of `dir` is now `entry` (`None`: removed).
    fn record(&self, dir: &str, name: &str, entry: Option<&Name>);
    /// Whether the journal wants [`NameJournal::compact`]: asked after each change, under the
    /// lock that orders the changes.
    fn wants_compact(&self) -> bool {
        false
    }
    /// Rewrites the journal with only `live`, every name of the table as of the last record
    /// (called under the same lock, so no change falls between the two).
    fn compact<'a>(&self, _live: &mut dyn Iterator<Item = (&'a str, &'a str, &'a Name)>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_records_spread_over_their_directories() {
        let dirs: std::collections::HashSet<String> = (0..2000)
            .map(|i| links_dir(&format!("0-1-{i:x}")))
            .collect();
        assert!(dirs.len() > 200, "{}", dirs.len());
        assert!(dirs.iter().all(|d| is_links_dir(d)));
        assert!(!is_links_dir("//links") && !is_links_dir("//links/zz") && !is_links_dir("a/b"));
    }

    #[test]
    fn objects_are_never_backing_paths() {
        assert!(is_object("//produced/1/abc"));
        assert!(!is_object("train/a.npz"));
        assert_eq!(producer_of("//produced/17/abc-1"), Some(17));
        assert_eq!(producer_of("train/17/abc"), None);
    }
}
