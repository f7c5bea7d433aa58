//! Reads ahead of the sampler: a training job hands the mount the order in which it will open
//! its files (`dyadfs prefetch`, or `examples/python/dyadfs_prefetch.py` around a sampler), and
//! background threads fill them into the cache in that order, from peers or the shared file
//! system, a bounded window ahead of what the job has opened so far. The reader then opens
//! local copies instead of waiting for each fetch.
//!
//! The request is a `getxattr` of the mount root named `user.dyadfs.prefetch:STREAM:LIST`:
//! LIST is a file, owned by the caller, of paths relative to the mount root, one per line, in
//! reading order. A getxattr needs only read permission on the root (a setxattr would need
//! write permission there), and the list travels as a file because an attribute value holds
//! 64 KiB. A new list replaces the caller's previous list of the same STREAM (one per rank of a
//! job); an empty one cancels it. The answer is `{"files":N,"skipped":M}` (short, so a first
//! small buffer fits it and the request runs once).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Condvar, Mutex};

use std::sync::Arc;

mod fill;
mod list;
mod paths;
pub use fill::Filler;
pub use list::{read_list, request};
use paths::{Keys, Paths, hash};

/// Files a prefetch thread takes at once from a list, moved as one batch where they can be.
use super::Error;
use super::caller::Credentials;
use crate::core::sync::lock;

/// The extended attribute name's prefix; `STREAM:LIST` follows.
pub const PREFETCH_XATTR: &str = "user.dyadfs.prefetch:";
/// Bounds on what one user can make the daemon hold (docs/CONFIGURATION.md says them): lists,
/// the bytes of all of them (a path costs its text, its newline and [`paths::PATH_COST`]:
/// what it holds), the paths of one list (a longer list's further lines are skipped), the size
/// of one list file, and the length of one line (a longer one is skipped, read past without
/// being held). A user's lists are read one at a time.
pub const MAX_PLANS: usize = 64;
pub const MAX_HELD_BYTES: usize = 128 << 20;
pub const MAX_PATHS: usize = 8 << 20;
pub const MAX_LIST_BYTES: u64 = 1 << 30;
pub const MAX_LINE: usize = libc::PATH_MAX as usize;
pub use paths::PATH_COST;

/// How far ahead of the reader the threads may go.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub files: usize,
    pub bytes: u64,
}

/// One stream's list and how far the reader and the threads have come.
struct Plan {
    id: u64,
    /// Whose list it is: a file is filled only if they may read it.
    who: Arc<Credentials>,
    /// Held until the plan ends however far it has come.
    paths: Paths,
    /// The next position a thread takes.
    next: usize,
    /// One past the furthest position the reader has opened.
    read: usize,
    /// Positions at or past `read` that threads filled, with their sizes.
    ahead: BTreeMap<usize, u64>,
    ahead_bytes: u64,
    in_flight: usize,
}

impl Plan {
    fn runnable(&self, w: Window) -> bool {
        self.next < self.paths.len()
            && self.next - self.read < w.files
            && self.ahead_bytes < w.bytes
    }

    fn finished(&self) -> bool {
        self.next >= self.paths.len() && self.in_flight == 0
    }

    /// The reader opened the file at `pos`: the window moves past it.
    fn reached(&mut self, pos: usize) {
        if pos < self.read {
            return;
        }
        self.read = pos + 1;
        self.next = self.next.max(self.read);
        let keep = self.ahead.split_off(&self.read);
        self.ahead_bytes -= self.ahead.values().sum::<u64>();
        self.ahead = keep;
    }
}

#[derive(Default)]
struct State {
    plans: HashMap<(u32, String), Plan>,
    /// Users one of whose lists is being read.
    reading: HashSet<u32>,
    next_id: u64,
    /// Where the round robin over plans starts next.
    turn: usize,
}

/// What a thread fills next.
pub struct Item {
    key: (u32, String),
    id: u64,
    who: Arc<Credentials>,
    pos: usize,
    pub path: Box<str>,
}

/// The plans and the threads' work queue.
pub struct Prefetcher {
    state: Mutex<State>,
    work: Condvar,
    window: Window,
    keys: Keys,
}

/// A user's list being read (one at a time per user), with the bytes it may cost: given to
/// [`Reading::set`], or dropped to give the user's turn back.
pub struct Reading<'a> {
    prefetcher: &'a Prefetcher,
    key: (u32, String),
    pub budget: usize,
}

impl Reading<'_> {
    pub fn keys(&self) -> &Keys {
        &self.prefetcher.keys
    }

    /// The list read replaces the stream's plan (an empty one cancels it). Returns how many
    /// files were queued.
    pub fn set(self, who: Arc<Credentials>, paths: Paths) -> usize {
        debug_assert!(paths.held() <= self.budget || paths.is_empty());
        let p = self.prefetcher;
        let mut st = lock(&p.state);
        let n = paths.len();
        let old = if paths.is_empty() {
            st.plans.remove(&self.key)
        } else {
            st.next_id += 1;
            let plan = Plan {
                id: st.next_id,
                who,
                paths,
                next: 0,
                read: 0,
                ahead: BTreeMap::new(),
                ahead_bytes: 0,
                in_flight: 0,
            };
            st.plans.insert(self.key.clone(), plan)
        };
        drop(st);
        // (A replaced list's memory is given back off the lock.)
        drop(old);
        if n > 0 {
            p.work.notify_all();
        }
        n
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        lock(&self.prefetcher.state).reading.remove(&self.key.0);
    }
}

impl Prefetcher {
    pub fn new(window: Window) -> Prefetcher {
        Prefetcher {
            state: Mutex::default(),
            work: Condvar::new(),
            window,
            keys: Keys::new(),
        }
    }

    /// Before `uid`'s list for `stream` is read: its turn, and the bytes it may cost beside
    /// the user's other plans (finished or not: a plan waiting at its window holds its paths;
    /// the plan it replaces does not count). Refused (EBUSY) while another list of the user's
    /// is being read, or with [`MAX_PLANS`] others.
    pub fn begin(&self, uid: u32, stream: &str) -> Result<Reading<'_>, Error> {
        let mut st = lock(&self.state);
        let key = (uid, stream.to_string());
        let (plans, held) = st
            .plans
            .iter()
            .filter(|(k, _)| k.0 == uid && **k != key)
            .fold((0, 0), |(n, b), (_, plan)| (n + 1, b + plan.paths.held()));
        if plans >= MAX_PLANS || st.reading.contains(&uid) {
            tracing::warn!(
                uid,
                stream,
                plans,
                "prefetch list refused: another of this user's lists is being read, or it has \
                 the most it may"
            );
            return Err(Error::PrefetchFull);
        }
        st.reading.insert(uid);
        Ok(Reading {
            prefetcher: self,
            key,
            budget: MAX_HELD_BYTES.saturating_sub(held),
        })
    }

    /// A reader opened `path` (relative to the mount root).
    pub fn opened(&self, path: &str) {
        let mut st = lock(&self.state);
        if st.plans.is_empty() {
            return;
        }
        let h = hash(&self.keys, path);
        let mut moved = false;
        for plan in st.plans.values_mut() {
            if let Some(pos) = plan.paths.find(h, path) {
                plan.reached(pos);
                moved = true;
            }
        }
        let done: Vec<Plan> = st
            .plans
            .extract_if(|_, p| p.finished())
            .map(|(_, p)| p)
            .collect();
        drop(st);
        drop(done);
        if moved {
            self.work.notify_all();
        }
    }

    /// Files queued and not yet taken by a thread, over all plans.
    pub fn pending(&self) -> u64 {
        let st = lock(&self.state);
        st.plans
            .values()
            .map(|p| (p.paths.len() - p.next.min(p.paths.len())) as u64)
            .sum()
    }

    /// Blocks until some plan has a file inside its window; takes it.
    pub fn take(&self) -> Item {
        self.take_batch(1).pop().expect("one at least")
    }

    /// Blocks until some plan has a file inside its window; takes it and up to `max - 1` more
    /// that follow it in the same list, inside the window too (a batch moved together).
    pub fn take_batch(&self, max: usize) -> Vec<Item> {
        let mut st = lock(&self.state);
        loop {
            let n = st.plans.len();
            let start = st.turn;
            let mut keys: Vec<&(u32, String)> = st.plans.keys().collect();
            keys.sort();
            let found = (0..n)
                .map(|i| keys[(start + i) % n].clone())
                .find(|k| st.plans[k].runnable(self.window));
            if let Some(key) = found {
                st.turn = st.turn.wrapping_add(1);
                let plan = st.plans.get_mut(&key).expect("found above");
                let mut items = Vec::new();
                while items.len() < max.max(1) && (items.is_empty() || plan.runnable(self.window)) {
                    let pos = plan.next;
                    plan.next += 1;
                    plan.in_flight += 1;
                    items.push(Item {
                        id: plan.id,
                        who: plan.who.clone(),
                        pos,
                        path: plan.paths.get(pos).into(),
                        key: key.clone(),
                    });
                }
                return items;
            }
            st = self.work.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A thread is done with `item`; `size`: the bytes it holds in the cache now.
    pub fn done(&self, item: Item, size: u64) {
        let mut st = lock(&self.state);
        let mut finished = None;
        if let Some(plan) = st.plans.get_mut(&item.key).filter(|p| p.id == item.id) {
            plan.in_flight -= 1;
            if item.pos >= plan.read {
                plan.ahead.insert(item.pos, size);
                plan.ahead_bytes += size;
            }
            if plan.finished() {
                finished = st.plans.remove(&item.key);
            }
        }
        drop(st);
        drop(finished);
        self.work.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32) -> Arc<Credentials> {
        Arc::new(Credentials {
            uid,
            gid: uid,
            groups: Vec::new(),
        })
    }

    fn paths(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("f{i}")).collect()
    }

    /// A list handed over as a request would: its turn, then its paths within its budget.
    fn set(
        p: &Prefetcher,
        who: Arc<Credentials>,
        stream: &str,
        names: &[String],
    ) -> Result<usize, Error> {
        let reading = p.begin(who.uid, stream)?;
        let mut b = paths::Builder::new(0, reading.budget);
        for n in names {
            b.push(n).map_err(|_| list::too_many_bytes())?;
        }
        let paths = b.finish(reading.keys());
        Ok(reading.set(who, paths))
    }

    const WIDE: Window = Window {
        files: 1000,
        bytes: u64::MAX,
    };

    #[test]
    fn threads_take_files_in_list_order_within_the_window() {
        let p = Prefetcher::new(Window {
            files: 3,
            bytes: u64::MAX,
        });
        assert_eq!(set(&p, user(0), "a", &paths(10)).unwrap(), 10);
        let taken: Vec<Item> = (0..3).map(|_| p.take()).collect();
        let names: Vec<&str> = taken.iter().map(|i| &*i.path).collect();
        assert_eq!(names, ["f0", "f1", "f2"]);
        assert!(
            !lock(&p.state)
                .plans
                .values()
                .any(|pl| pl.runnable(p.window))
        );
        // The reader opens f4: f3 is skipped (it reads it itself), the window is f5..f7.
        p.opened("f4");
        assert_eq!(&*p.take().path, "f5");
        for i in taken {
            p.done(i, 1);
        }
        assert_eq!(p.pending(), 4);
    }

    #[test]
    fn a_batch_is_the_next_files_of_one_list_within_its_window() {
        let p = Prefetcher::new(Window {
            files: 5,
            bytes: u64::MAX,
        });
        assert_eq!(set(&p, user(0), "a", &paths(10)).unwrap(), 10);
        let names = |items: &[Item]| items.iter().map(|i| i.path.to_string()).collect::<Vec<_>>();
        let first = p.take_batch(3);
        assert_eq!(names(&first), ["f0", "f1", "f2"]);
        // The window ends the next batch early.
        let second = p.take_batch(3);
        assert_eq!(names(&second), ["f3", "f4"]);
        p.opened("f1");
        assert_eq!(names(&p.take_batch(16)), ["f5", "f6"]);
        for i in first.into_iter().chain(second) {
            p.done(i, 1);
        }
    }

    #[test]
    fn the_byte_window_holds_threads_back_until_the_reader_moves() {
        let p = Prefetcher::new(Window {
            files: 100,
            bytes: 10,
        });
        set(&p, user(7), "s", &paths(5)).unwrap();
        let a = p.take();
        p.done(a, 10);
        assert!(
            !lock(&p.state)
                .plans
                .values()
                .any(|pl| pl.runnable(p.window))
        );
        p.opened("f0");
        assert_eq!(&*p.take().path, "f1");
    }

    #[test]
    fn a_new_list_replaces_the_streams_old_one_and_an_empty_one_cancels() {
        let p = Prefetcher::new(WIDE);
        set(&p, user(1), "s", &paths(5)).unwrap();
        let old = p.take();
        set(&p, user(1), "s", &["x".into()]).unwrap();
        set(&p, user(2), "s", &["y".into()]).unwrap();
        assert_eq!(p.pending(), 2);
        // A thread finishing a file of the replaced list does not touch the new one.
        p.done(old, 1);
        assert_eq!(p.pending(), 2);
        set(&p, user(1), "s", &[]).unwrap();
        assert_eq!(p.pending(), 1);
        let y = p.take();
        assert_eq!(&*y.path, "y");
        p.done(y, 1);
        assert!(lock(&p.state).plans.is_empty());
    }

    #[test]
    fn plans_are_bounded() {
        let p = Prefetcher::new(WIDE);
        for i in 0..MAX_PLANS {
            set(&p, user(0), &i.to_string(), &paths(1)).unwrap();
        }
        assert!(matches!(
            set(&p, user(0), "one more", &paths(1)),
            Err(Error::PrefetchFull)
        ));
        // Replacing an existing plan is allowed, and other users have their own bound.
        set(&p, user(0), "0", &paths(2)).unwrap();
        set(&p, user(1), "0", &paths(2)).unwrap();
    }

    /// One user's lists are read one at a time: a second is refused (EBUSY) before it is
    /// read; another user's is not, and the turn comes back when the first is set or dropped.
    #[test]
    fn a_users_lists_are_read_one_at_a_time() {
        let p = Prefetcher::new(WIDE);
        let first = p.begin(3, "a").unwrap();
        assert_eq!(first.budget, MAX_HELD_BYTES);
        assert_eq!(p.begin(3, "b").err().map(|e| e.errno()), Some(libc::EBUSY));
        assert_eq!(p.begin(3, "a").err().map(|e| e.errno()), Some(libc::EBUSY));
        drop(p.begin(4, "a").unwrap());
        let mut b = paths::Builder::new(0, first.budget);
        b.push("f").unwrap();
        let held = {
            let paths = b.finish(first.keys());
            let held = paths.held();
            first.set(user(3), paths);
            held
        };
        // The next list may cost what the first leaves, but for the stream it replaces.
        assert_eq!(p.begin(3, "b").unwrap().budget, MAX_HELD_BYTES - held);
        assert_eq!(p.begin(3, "a").unwrap().budget, MAX_HELD_BYTES);
    }

    /// The bytes of one user's lists are bounded over its plans, a plan stalled at its window
    /// counting as much as a new one; a list past what is left is refused as it is read.
    #[test]
    fn the_bytes_of_a_users_lists_are_bounded() {
        let p = Prefetcher::new(Window {
            files: 1,
            bytes: u64::MAX,
        });
        // 8 Ki paths each charged 4 KiB: a quarter of the bound per list.
        let quarter = |c: char| -> Vec<String> {
            let len = 4096 - 1 - PATH_COST;
            (0..8192)
                .map(|i| format!("{c}{i:08}{}", "z".repeat(len - 9)))
                .collect()
        };
        for s in ["a", "b", "c"] {
            set(&p, user(5), s, &quarter('a')).unwrap();
        }
        // "a" stalls at its window: one file taken, the rest waiting for the reader.
        let taken = p.take();
        assert!(!lock(&p.state).plans[&(5, "a".into())].runnable(p.window));
        let mut over = quarter('d');
        over.push("x".into());
        let e2big = |r: Result<usize, Error>| r.unwrap_err().errno() == libc::E2BIG;
        assert!(e2big(set(&p, user(5), "d", &over)));
        set(&p, user(5), "d", &quarter('d')).unwrap();
        // At the bound, with "a" stalled: not a byte more.
        assert!(e2big(set(&p, user(5), "e", &["x".into()])));
        // Replacing a plan is judged without it; another user has a bound of its own.
        set(&p, user(5), "d", &quarter('d')).unwrap();
        set(&p, user(6), "d", &quarter('d')).unwrap();
        // Cancelling the stalled plan gives its bytes back.
        set(&p, user(5), "a", &[]).unwrap();
        p.done(taken, 1);
        set(&p, user(5), "e", &quarter('e')).unwrap();

        // Read from a file: refused at the line that passes what the user has left.
        let dir =
            std::env::temp_dir().join(format!("dyadfs-prefetch-bytes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let list = dir.join("l");
        std::fs::write(&list, "p".repeat(100) + "\n").unwrap();
        let me = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&list).unwrap());
        let (keys, budget) = (Keys::new(), 101 + PATH_COST);
        assert_eq!(read_list(&list, me, budget, &keys).unwrap().0.len(), 1);
        std::fs::write(&list, "p".repeat(100) + "\nx\n").unwrap();
        let r = read_list(&list, me, budget, &keys);
        assert_eq!(r.err().map(|e| e.errno()), Some(libc::E2BIG));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
