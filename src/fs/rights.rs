//! A caller's rights judged by the shared file system itself, where the mount's own process
//! has more of them than its callers: the node service (root) serving a user's mount of a
//! dataset it caches for every user. The kernel judges each access by the mode bits the mount
//! presents (`default_permissions`, narrowed by ACLs: `backing::acl`), but those say nothing of
//! the directories above the dataset's root, and a caller who made the mount chose its options.
//! So where a [`Rights`] is set, every open and every lookup asks it, as the caller, whatever
//! the cache holds: the shared file system says yes, or the caller gets EACCES before a byte.

use super::caller::Credentials;

/// The port to the judge (`backing::rights::AsCaller` asks the shared file system as the
/// caller).
pub trait Rights: Send + Sync {
    /// Whether `who` may access `path` (relative to the dataset's root; empty: the root) as
    /// `mode` (`libc::R_OK`, `libc::X_OK`) asks. A path the shared file system does not have
    /// (a produced file) is `None`: no opinion, the mode bits decide.
    fn may(&self, path: &str, who: &Credentials, mode: i32) -> Option<bool>;
}
