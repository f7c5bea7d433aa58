//! Directory read-ahead. A walk (`find`, `os.walk`, `du`, a dataset's index scan) opens a
//! directory's subdirectories one after another, and most of each listing's cost is the
//! backing file system reading the directory (ext4 hashing and sorting its entries: 70% of
//! the daemon's CPU in a `find` over a million files). Once a walk shows itself (a directory
//! opened whose parent was opened just before), a background thread lists the next few
//! subdirectories of that parent on the backing store while the walker works through the
//! current one, so those reads overlap the walker's work instead of adding to it.
//!
//! A listing read ahead is used only while fresh ([`FRESH`]): it is then no staler than one
//! the kernel keeps for a directory it listed. What is held is bounded by entries, and
//! nothing is read ahead for a directory listed on its own (an `ls`).

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::paths::{join, split};
use crate::core::Kind;
use crate::core::sync::lock;

/// How long a listing read ahead may be used (and a queued one still read).
pub const FRESH: Duration = Duration::from_secs(2);
/// Subdirectories read ahead of the one the walker opened last.
const WINDOW: usize = 8;
/// Directories remembered as parents of a walk (with their subdirectories' names).
const MAX_PARENTS: usize = 64;
/// A parent with more subdirectories than this is not read ahead in (its names would cost
/// more memory than the walk saves).
const MAX_SUBDIRS: usize = 1 << 16;
/// Entries held in listings read ahead and not used yet.
const MAX_READY_ENTRIES: usize = 1 << 16;

pub type Listing = Vec<(OsString, Kind)>;

struct Parent {
    /// Its subdirectories, in listing order.
    subdirs: Vec<OsString>,
    /// Where the walker was last (a walk goes in listing order: the next search starts here).
    at: usize,
    /// Subdirectories before this index were queued already.
    queued_to: usize,
    seen: Instant,
}

struct Ready {
    listing: Listing,
    at: Instant,
}

#[derive(Default)]
struct State {
    parents: HashMap<String, Parent>,
    queue: VecDeque<(String, Instant)>,
    ready: HashMap<String, Ready>,
    ready_entries: usize,
}

#[derive(Default)]
pub struct DirAhead {
    state: Mutex<State>,
    queued: Condvar,
}

impl DirAhead {
    /// A listing of `dir` read ahead and still fresh, taken (it is used once).
    pub fn take(&self, dir: &str) -> Option<Listing> {
        let mut st = lock(&self.state);
        let ready = st.ready.remove(dir)?;
        st.ready_entries -= ready.listing.len();
        (ready.at.elapsed() < FRESH).then_some(ready.listing)
    }

    /// `dir` was opened and listed (`listing`: its backing entries): remembered as a parent if
    /// it has subdirectories, and if its own parent was opened before (a walk), the next
    /// subdirectories after it there are queued.
    pub fn opened(&self, dir: &str, listing: &[(OsString, Kind)]) {
        let mut st = lock(&self.state);
        let now = Instant::now();
        // The walker got here before the read-ahead did.
        st.queue.retain(|(d, _)| d != dir);
        let subdirs: Vec<OsString> = listing
            .iter()
            .filter(|(_, k)| *k == Kind::Dir)
            .take(MAX_SUBDIRS + 1)
            .map(|(n, _)| n.clone())
            .collect();
        if !subdirs.is_empty() && subdirs.len() <= MAX_SUBDIRS {
            if st.parents.len() >= MAX_PARENTS && !st.parents.contains_key(dir) {
                let oldest = st
                    .parents
                    .iter()
                    .min_by_key(|(_, p)| p.seen)
                    .map(|(d, _)| d.clone());
                if let Some(d) = oldest {
                    st.parents.remove(&d);
                }
            }
            st.parents.insert(
                dir.to_string(),
                Parent {
                    subdirs,
                    at: 0,
                    queued_to: 0,
                    seen: now,
                },
            );
        }
        if dir.is_empty() {
            return;
        }
        let (up, name) = split(dir);
        // A walk: the parent was opened (or another of its subdirectories) just before.
        let Some(parent) = st
            .parents
            .get_mut(up)
            .filter(|p| now.duration_since(p.seen) < FRESH)
        else {
            return;
        };
        parent.seen = now;
        // Search from where the walker was last, wrapping once.
        let n = parent.subdirs.len();
        let Some(pos) = (0..n)
            .map(|i| (parent.at + i) % n)
            .find(|&i| parent.subdirs[i] == name)
        else {
            return;
        };
        parent.at = pos;
        let from = parent.queued_to.max(pos + 1);
        let to = (pos + 1 + WINDOW).min(n);
        if from >= to {
            return;
        }
        parent.queued_to = to;
        let next: Vec<String> = parent.subdirs[from..to]
            .iter()
            .map(|s| join(up, s))
            .collect();
        st.queue.extend(next.into_iter().map(|d| (d, now)));
        drop(st);
        self.queued.notify_one();
    }

    /// The next directory to read ahead, waiting up to `wait` for one; stale ones are skipped.
    pub fn next(&self, wait: Duration) -> Option<String> {
        let mut st = lock(&self.state);
        loop {
            while let Some((dir, at)) = st.queue.pop_front() {
                if at.elapsed() < FRESH && !st.ready.contains_key(&dir) {
                    return Some(dir);
                }
            }
            let (next, timeout) = self
                .queued
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner());
            st = next;
            if timeout.timed_out() && st.queue.is_empty() {
                return None;
            }
        }
    }

    /// A listing read ahead: held until taken, or dropped (the oldest first) to stay within
    /// [`MAX_READY_ENTRIES`].
    pub fn store(&self, dir: String, listing: Listing) {
        let mut st = lock(&self.state);
        let now = Instant::now();
        st.ready.retain(|_, r| now.duration_since(r.at) < FRESH);
        st.ready_entries = st.ready.values().map(|r| r.listing.len()).sum();
        while st.ready_entries + listing.len() > MAX_READY_ENTRIES && !st.ready.is_empty() {
            let oldest = st
                .ready
                .iter()
                .min_by_key(|(_, r)| r.at)
                .map(|(d, _)| d.clone())
                .expect("not empty");
            let r = st.ready.remove(&oldest).expect("present");
            st.ready_entries -= r.listing.len();
        }
        if listing.len() > MAX_READY_ENTRIES {
            return;
        }
        st.ready_entries += listing.len();
        st.ready.insert(dir, Ready { listing, at: now });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(names: &[&str]) -> Listing {
        names
            .iter()
            .map(|n| (OsString::from(*n), Kind::Dir))
            .collect()
    }

    fn queued(a: &DirAhead) -> Vec<String> {
        std::iter::from_fn(|| a.next(Duration::from_millis(1))).collect()
    }

    #[test]
    fn a_walk_queues_the_next_siblings_and_a_lone_listing_nothing() {
        let a = DirAhead::default();
        let names: Vec<String> = (0..20).map(|i| format!("d{i:02}")).collect();
        let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        // `ls top`: nothing is read ahead.
        a.opened("top", &dirs(&refs));
        assert!(queued(&a).is_empty());
        // The walker enters top/d00: the next WINDOW subdirectories are queued, once.
        a.opened("top/d00", &[]);
        let q = queued(&a);
        assert_eq!(q.len(), WINDOW);
        assert_eq!(q[0], "top/d01");
        assert_eq!(q[WINDOW - 1], format!("top/d{WINDOW:02}"));
        a.opened("top/d01", &[]);
        assert_eq!(queued(&a), [format!("top/d{:02}", WINDOW + 1)]);
        // Near the end, the window stops at the last subdirectory.
        a.opened("top/d18", &[]);
        assert_eq!(queued(&a).last().map(String::as_str), Some("top/d19"));
        a.opened("top/d19", &[]);
        assert!(queued(&a).is_empty());
    }

    #[test]
    fn listings_read_ahead_are_used_once_and_bounded() {
        let a = DirAhead::default();
        a.store("x".into(), dirs(&["a", "b"]));
        assert_eq!(a.take("x").map(|l| l.len()), Some(2));
        assert!(a.take("x").is_none());
        // Past the bound, the oldest listings go first.
        let big: Listing = (0..MAX_READY_ENTRIES / 2)
            .map(|i| (OsString::from(i.to_string()), Kind::File))
            .collect();
        a.store("one".into(), big.clone());
        a.store("two".into(), big.clone());
        a.store("three".into(), big);
        assert!(a.take("one").is_none());
        assert!(a.take("two").is_some() && a.take("three").is_some());
    }

    #[test]
    fn root_entries_are_walked_too() {
        let a = DirAhead::default();
        a.opened("", &dirs(&["a", "b", "c"]));
        a.opened("a", &[]);
        assert_eq!(queued(&a), ["b", "c"]);
    }
}
