//! The site's one queue of changes to publish: every dataset's cache events, their paths
//! prefixed with the dataset's key, and the copies of datasets that left, to unpublish. The one
//! publisher polls them (every [`POLL`]) instead of a thread per dataset forwarding each event
//! as it came: at a pull per sample, that thread's wake-up per copy was 7% of a pulling node's
//! samples in a profile of `scripts/bench_site.sh` (about 10 us a pulled file when timed), and
//! the publisher gathers a round over its linger anyway.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;

use crate::cache::{CacheEvent, CacheEvents, Entry, EventQueue};
use crate::core::sync::lock;

/// How often an idle publisher looks for changes: what it adds to a change's publishing at
/// most (a round then waits its 10 ms linger for more).
const POLL: Duration = Duration::from_millis(5);

#[derive(Default)]
pub struct SiteEvents(Mutex<Queues>);

#[derive(Default)]
struct Queues {
    /// Each dataset's events, by the prefix of its paths (`<key>/`).
    datasets: Vec<(String, CacheEvents)>,
    /// Copies of datasets that left, told as dropped one by one (8 bytes each until then).
    leaving: Vec<(String, std::vec::IntoIter<Arc<Entry>>)>,
    /// The dataset read first next time, so that none waits behind another's backlog.
    next: usize,
}

impl SiteEvents {
    /// Dataset `key`'s events join the queue.
    pub fn add(&self, key: &str, events: CacheEvents) {
        lock(&self.0).datasets.push((format!("{key}/"), events));
    }

    /// Dataset `key` leaves: what it had not told yet is forgotten, and each of `held` (its
    /// copies now) is told as dropped.
    pub fn remove(&self, key: &str, held: Vec<Arc<Entry>>) {
        let prefix = format!("{key}/");
        let mut q = lock(&self.0);
        q.datasets.retain(|(p, _)| *p != prefix);
        q.leaving.push((prefix, held.into_iter()));
    }
}

impl Queues {
    fn next_event(&mut self) -> Option<CacheEvent> {
        while let Some((prefix, entries)) = self.leaving.last_mut() {
            match entries.next() {
                Some(e) => {
                    let path = format!("{prefix}{}", e.path);
                    return Some(CacheEvent::Dropped {
                        path,
                        version: e.version,
                    });
                }
                None => {
                    self.leaving.pop();
                }
            }
        }
        let n = self.datasets.len();
        for i in 0..n {
            let at = (self.next + i) % n;
            let (prefix, events) = &mut self.datasets[at];
            if let Some(ev) = events.try_recv() {
                self.next = at + 1;
                return Some(prefixed(prefix, ev));
            }
        }
        // A dataset whose cache is gone, everything told, leaves the queue.
        self.datasets.retain(|(_, events)| !events.ended());
        None
    }
}

impl EventQueue for Arc<SiteEvents> {
    fn recv_timeout(&mut self, timeout: Duration) -> Result<CacheEvent, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ev) = self.try_recv() {
                return Ok(ev);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RecvTimeoutError::Timeout);
            }
            std::thread::sleep(POLL.min(left));
        }
    }

    fn try_recv(&mut self) -> Option<CacheEvent> {
        lock(&self.0).next_event()
    }
}

fn prefixed(prefix: &str, ev: CacheEvent) -> CacheEvent {
    let p = |path: String| format!("{prefix}{path}");
    match ev {
        CacheEvent::Complete { path, version } => CacheEvent::Complete {
            path: p(path),
            version,
        },
        CacheEvent::Partial {
            path,
            version,
            reloaded,
        } => CacheEvent::Partial {
            path: p(path),
            version,
            reloaded,
        },
        CacheEvent::Dropped { path, version } => CacheEvent::Dropped {
            path: p(path),
            version,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Cache, CacheConfig};
    use crate::core::Version;

    fn v() -> Version {
        Version {
            size: 4096,
            mtime_ns: 1,
        }
    }

    /// A cache in a fresh directory holding complete copies of `names`.
    fn cache_holding(tag: &str, names: &[&str]) -> (std::path::PathBuf, Arc<Cache>) {
        let dir =
            std::env::temp_dir().join(format!("dyadfs-publishing-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = CacheConfig {
            dir: dir.clone(),
            chunk_size: 1 << 20,
            capacity: Some(1 << 30),
            open_files: 4,
            pack_max: 0,
            max_partial_chunks: crate::cache::MAX_PARTIAL_CHUNKS,
        };
        let cache = Arc::new(Cache::open(&config, Default::default()).unwrap());
        for name in names {
            fill(&cache, name);
        }
        (dir, cache)
    }

    /// `name` complete in `cache`, as a read fills it.
    fn fill(cache: &Cache, name: &str) {
        let e = cache.entry(name, v()).unwrap();
        let claim = e.claim(0..1);
        assert!(cache.reserve(&e, 4096));
        let bytes = vec![7u8; 4096];
        e.write_at(0, &bytes).unwrap();
        assert!(claim.mine == [0] && e.complete(0, crc32c::crc32c(&bytes)));
        cache.filled(&e);
    }

    fn drain(q: &mut Arc<SiteEvents>) -> Vec<CacheEvent> {
        std::iter::from_fn(|| q.try_recv()).collect()
    }

    /// Two datasets' copies reach the publisher with their keys, neither behind the other's
    /// whole backlog; a dataset that leaves is unpublished copy by copy, what it had not told
    /// yet forgotten; a dataset whose cache is gone leaves the queue.
    #[test]
    fn every_datasets_copies_are_published_under_its_key_and_unpublished_when_it_leaves() {
        let (da, a) = cache_holding("a", &["x", "y"]);
        let (db, b) = cache_holding("b", &["z"]);
        let mut q = Arc::new(SiteEvents::default());
        q.add("A", a.take_events().unwrap());
        q.add("B", b.take_events().unwrap());
        let complete = |p: &str| CacheEvent::Complete {
            path: p.into(),
            version: v(),
        };
        let first_two = [q.try_recv().unwrap(), q.try_recv().unwrap()];
        assert!(
            first_two.contains(&complete("B/z")),
            "taken in turn: {first_two:?}"
        );
        let mut rest = drain(&mut q);
        rest.extend(first_two);
        rest.sort_by_key(|e| format!("{e:?}"));
        assert_eq!(rest, [complete("A/x"), complete("A/y"), complete("B/z")]);

        fill(&a, "w");
        q.remove("A", a.held());
        let mut gone = drain(&mut q);
        gone.sort_by_key(|e| format!("{e:?}"));
        let dropped = |p: &str| CacheEvent::Dropped {
            path: p.into(),
            version: v(),
        };
        assert_eq!(gone, [dropped("A/w"), dropped("A/x"), dropped("A/y")]);
        assert_eq!(lock(&q.0).datasets.len(), 1);
        drop(b);
        assert_eq!(
            q.recv_timeout(Duration::from_millis(20)),
            Err(RecvTimeoutError::Timeout)
        );
        assert!(
            lock(&q.0).datasets.is_empty(),
            "a dataset whose cache is gone leaves"
        );
        let _ = std::fs::remove_dir_all(da);
        let _ = std::fs::remove_dir_all(db);
    }
}
