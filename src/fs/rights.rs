//! A caller's rights judged by the shared file system itself, where the mount's own process
//! has more of them than its callers: the node service (root) serving a user's mount of a
//! dataset it caches for every user. The kernel judges each access by the mode bits the mount
//! presents (`default_permissions`, narrowed by ACLs: `backing::acl`), but those say nothing of
//! the directories above the dataset's root, and a caller who made the mount chose its options.
//! So where a [`Judge`] is set, every open and every lookup asks it, as the caller, whatever
//! the cache holds: the shared file system says yes, or the caller gets EACCES before a byte.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::caller::{Context, Credentials};
use crate::core::sync::lock;

/// The port to the shared file system's judgement (`node::rights::AsCaller` asks it as the
/// caller).
pub trait Rights: Send + Sync {
    /// Whether `who` may access `path` (relative to the dataset's root; empty: the root) as
    /// `mode` (`libc::R_OK`, `libc::X_OK`) asks. A path the shared file system does not have
    /// (a produced file) is `None`: no opinion, the mode bits decide.
    fn may(&self, path: &str, who: &Credentials, mode: i32) -> Option<bool>;
}

/// How long a thread's supplementary groups are taken as read: reading them (`/proc`) cost
/// more than the judgement itself, twice per sample (a lookup and an open: 197 against 119 us
/// of daemon CPU per 128 KiB file, `scripts/bench_node.sh`), and a process's groups change only
/// by a privileged `setgroups`.
const GROUPS_FOR: Duration = Duration::from_secs(1);
/// Threads remembered at most; past it the table starts again.
const THREADS: usize = 4096;

/// A request's thread, uid and gid.
type Ids = (u32, u32, u32);

/// The judge a mount asks: the port, the callers' groups read lately, and the directories
/// they were let search lately.
pub struct Judge {
    rights: Arc<dyn Rights>,
    /// (thread, uid, gid) -> its groups, and when they were read.
    groups: Mutex<HashMap<Ids, (Vec<u32>, Instant)>>,
    /// (thread, uid, gid, directory) -> when the caller was let search it. Every sample's
    /// lookup asks about its directory, the same few for a whole dataset: a yes is taken for
    /// [`GROUPS_FOR`]. Opens are judged every time.
    searched: Mutex<HashMap<(u32, u32, u32, String), Instant>>,
}

impl Judge {
    pub fn new(rights: Arc<dyn Rights>) -> Judge {
        Judge {
            rights,
            groups: Mutex::default(),
            searched: Mutex::default(),
        }
    }

    /// Whether `caller` may access `path` as `mode` asks (see [`Rights::may`]).
    pub fn may(&self, path: &str, caller: &dyn Context, mode: i32) -> Option<bool> {
        let thread = caller.thread();
        let search = (mode == libc::X_OK && thread != 0)
            .then(|| (thread, caller.uid(), caller.gid(), path.to_string()));
        if let Some(key) = &search
            && lock(&self.searched)
                .get(key)
                .is_some_and(|at| at.elapsed() < GROUPS_FOR)
        {
            return Some(true);
        }
        let said = self.rights.may(path, &self.credentials(caller), mode);
        if let Some(key) = search
            && said == Some(true)
        {
            let mut table = lock(&self.searched);
            if table.len() >= THREADS {
                table.clear();
            }
            table.insert(key, Instant::now());
        }
        said
    }

    /// The caller's credentials, its groups read at most [`GROUPS_FOR`] ago.
    fn credentials(&self, caller: &dyn Context) -> Credentials {
        let key = (caller.thread(), caller.uid(), caller.gid());
        if key.0 == 0 {
            return caller.credentials();
        }
        if let Some((groups, at)) = lock(&self.groups).get(&key)
            && at.elapsed() < GROUPS_FOR
        {
            return Credentials {
                uid: key.1,
                gid: key.2,
                groups: groups.clone(),
            };
        }
        let read = caller.credentials();
        let mut table = lock(&self.groups);
        if table.len() >= THREADS {
            table.clear();
        }
        table.insert(key, (read.groups.clone(), Instant::now()));
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A caller whose groups are read from a counter: each read is counted.
    struct Counted<'a> {
        thread: u32,
        reads: &'a AtomicU32,
    }

    impl Context for Counted<'_> {
        fn uid(&self) -> u32 {
            1000
        }
        fn gid(&self) -> u32 {
            1000
        }
        fn thread(&self) -> u32 {
            self.thread
        }
        fn process(&self) -> Option<(u32, u32)> {
            None
        }
        fn opening_to_read(&self) -> Option<super::super::caller::OpeningToRead> {
            None
        }
        fn credentials(&self) -> Credentials {
            let n = self.reads.fetch_add(1, Ordering::Relaxed);
            Credentials {
                uid: 1000,
                gid: 1000,
                groups: vec![n],
            }
        }
    }

    /// Says yes to a caller in group 0 only.
    struct GroupZero;

    impl Rights for GroupZero {
        fn may(&self, _: &str, who: &Credentials, _: i32) -> Option<bool> {
            Some(who.in_group(0))
        }
    }

    #[test]
    fn a_threads_groups_are_read_once_a_second_and_never_lent_to_another() {
        let judge = Judge::new(Arc::new(GroupZero));
        let reads = AtomicU32::new(0);
        let one = Counted {
            thread: 7,
            reads: &reads,
        };
        // Read once (groups [0]: yes), then taken as read.
        assert_eq!(judge.may("f", &one, libc::R_OK), Some(true));
        assert_eq!(judge.may("f", &one, libc::R_OK), Some(true));
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        // Another thread's are its own (groups [1]: no).
        let other = Counted {
            thread: 8,
            reads: &reads,
        };
        assert_eq!(judge.may("f", &other, libc::R_OK), Some(false));
        assert_eq!(reads.load(Ordering::Relaxed), 2);
        // A caller of no known thread is read every time.
        let unknown = Counted {
            thread: 0,
            reads: &reads,
        };
        judge.may("f", &unknown, libc::R_OK);
        judge.may("f", &unknown, libc::R_OK);
        assert_eq!(reads.load(Ordering::Relaxed), 4);
    }

    /// Counts its judgements; says yes to searches of `open` only.
    struct Searches(AtomicU32);

    impl Rights for Searches {
        fn may(&self, path: &str, _: &Credentials, mode: i32) -> Option<bool> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Some(path == "open" || mode != libc::X_OK)
        }
    }

    #[test]
    fn a_search_allowed_is_taken_for_a_second_and_opens_are_judged_every_time() {
        let rights = Arc::new(Searches(AtomicU32::new(0)));
        let judge = Judge::new(rights.clone());
        let reads = AtomicU32::new(0);
        let caller = Counted {
            thread: 7,
            reads: &reads,
        };
        let asked = || rights.0.load(Ordering::Relaxed);
        for _ in 0..3 {
            assert_eq!(judge.may("open", &caller, libc::X_OK), Some(true));
        }
        assert_eq!(asked(), 1);
        // A refusal is never taken as read: asked again each time.
        for _ in 0..3 {
            assert_eq!(judge.may("closed", &caller, libc::X_OK), Some(false));
        }
        assert_eq!(asked(), 4);
        for _ in 0..3 {
            judge.may("open/f", &caller, libc::R_OK);
        }
        assert_eq!(asked(), 7);
    }
}
