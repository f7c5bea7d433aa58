//! Stat read-ahead for a scan that stats what it lists. Once the kernel asks for a listing's
//! later pages with attributes (READDIRPLUS: the caller looked an entry up), each page costs
//! the daemon a stat of every entry on the backing store, one after another, while the caller
//! waits; then the caller stats the page from the kernel's cache while the daemon waits. A
//! background thread stats the entries a few pages ahead on the backing store, so the backing
//! file system has read their inodes by the time the page is asked for: the two halves
//! overlap instead of taking turns. (Handing the attributes it read to the page, instead of
//! only warming the backing file system's caches, measured no faster: 1.65x vs 1.54x the
//! backing directory, six interleaved runs.) What is read ahead is bounded by [`AHEAD`]
//! entries past the page asked for, and nothing is read ahead for a listing whose attributes
//! nobody asks for (a walk).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::listing::DirEntry;
use super::{DyadFs, join};
use crate::core::source::Source;
use crate::core::sync::lock;

/// Entries stat'ed ahead of the page the kernel asked for.
const AHEAD: usize = 4096;
/// Entries the page being answered may hold (a page of at most 32 KiB of entries with
/// attributes): read ahead from past it, not alongside the thread answering it.
const PAGE: usize = 256;
/// Ranges waiting for the thread; a scan that outruns it drops the oldest.
const MAX_QUEUED: usize = 64;

struct Range {
    fh: u64,
    dir: String,
    entries: Arc<Vec<DirEntry>>,
    from: usize,
    to: usize,
}

#[derive(Default)]
struct State {
    /// Per open directory (its handle): entries before this index were queued already.
    queued_to: HashMap<u64, usize>,
    queue: VecDeque<Range>,
}

#[derive(Default)]
pub struct StatAhead {
    state: Mutex<State>,
    queued: Condvar,
}

impl StatAhead {
    /// The kernel asked open directory `fh` (`dir`, listing `entries`) for attributes from
    /// entry `at` on: the entries up to [`AHEAD`] past it that were not queued yet are.
    pub fn asked(&self, fh: u64, dir: &str, entries: &Arc<Vec<DirEntry>>, at: usize) {
        let mut st = lock(&self.state);
        let queued_to = st.queued_to.entry(fh).or_insert(at + PAGE);
        let from = (*queued_to).max(at + PAGE);
        let to = (at + AHEAD).min(entries.len());
        if from >= to {
            return;
        }
        *queued_to = to;
        // In pieces of a page: a scan's next page is read first.
        for from in (from..to).step_by(PAGE) {
            if st.queue.len() == MAX_QUEUED {
                st.queue.pop_front();
            }
            st.queue.push_back(Range {
                fh,
                dir: dir.to_string(),
                entries: entries.clone(),
                from,
                to: (from + PAGE).min(to),
            });
        }
        self.queued.notify_one();
    }

    /// Directory `fh` was closed: nothing more is read ahead for it.
    pub fn closed(&self, fh: u64) {
        let mut st = lock(&self.state);
        if st.queued_to.remove(&fh).is_some() {
            st.queue.retain(|r| r.fh != fh);
        }
    }

    fn next(&self, wait: Duration) -> Option<Range> {
        let st = lock(&self.state);
        let (mut st, _) = self
            .queued
            .wait_timeout_while(st, wait, |s| s.queue.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        st.queue.pop_front()
    }
}

impl<S: Source> DyadFs<S> {
    /// Starts the thread that stats listed entries ahead of a scan (it ends with the fs). One
    /// thread: two or three, reading more inodes at once, measured slower (they took CPU from
    /// the scan on two cores).
    pub fn start_stat_ahead(fs: &Arc<DyadFs<S>>) -> std::io::Result<()> {
        let (weak, ahead) = (Arc::downgrade(fs), fs.stat_ahead.clone());
        std::thread::Builder::new()
            .name("stat-ahead".into())
            .spawn(move || {
                loop {
                    let next = ahead.next(Duration::from_secs(1));
                    let Some(fs) = weak.upgrade() else { return };
                    let Some(r) = next else { continue };
                    for e in &r.entries[r.from..r.to] {
                        // Only the backing file system's caches are wanted; a name it does
                        // not have (produced, or gone) is looked up when its page is asked for.
                        let _ = fs.backing.stat(&join(&r.dir, &e.name));
                    }
                }
            })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::attr::Kind;

    fn listing(n: usize) -> Arc<Vec<DirEntry>> {
        Arc::new(
            (0..n)
                .map(|i| DirEntry {
                    name: format!("f{i}").into(),
                    ino: i as u64 + 2,
                    kind: Kind::File,
                })
                .collect(),
        )
    }

    /// What was queued, its pieces joined.
    fn ranges(a: &StatAhead) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for r in std::iter::from_fn(|| a.next(Duration::from_millis(1))) {
            assert!(r.to - r.from <= PAGE);
            match out.last_mut() {
                Some(last) if last.1 == r.from => last.1 = r.to,
                _ => out.push((r.from, r.to)),
            }
        }
        out
    }

    #[test]
    fn a_scan_is_read_ahead_once_per_entry_and_bounded() {
        let a = StatAhead::default();
        let l = listing(10_000);
        a.asked(7, "wide", &l, 1000);
        assert_eq!(ranges(&a), [(1000 + PAGE, 1000 + AHEAD)]);
        // The next page: only what is new past the window.
        a.asked(7, "wide", &l, 1200);
        assert_eq!(ranges(&a), [(1000 + AHEAD, 1200 + AHEAD)]);
        // A scan that jumped ahead (a seek) skips what it passed; near the end, up to the
        // last entry, then nothing.
        a.asked(7, "wide", &l, 9000);
        assert_eq!(ranges(&a), [(9000 + PAGE, 10_000)]);
        a.asked(7, "wide", &l, 9800);
        assert_eq!(ranges(&a), []);
        // Another directory has its own window; a closed one starts over.
        a.asked(8, "other", &l, 0);
        assert_eq!(ranges(&a), [(PAGE, AHEAD)]);
        a.closed(7);
        a.asked(7, "wide", &l, 0);
        assert_eq!(ranges(&a), [(PAGE, AHEAD)]);
    }
}
