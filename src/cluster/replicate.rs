//! Replication (`dyadfs mount --replicate`): a background thread copies into this node's cache
//! the files other nodes fetched, so a later epoch that gives this node another shard of the
//! dataset finds it local instead of pulling it file by file while the training waits.
//!
//! The thread reads each global home's feed of copies racks gained (`Message::Gained`) and
//! pulls what this node lacks from the holder named there: never from the backing store, never
//! evicting (it stops while the cache is [`FILL_LIMIT`] full). Copies use the CPU a cold epoch
//! leaves idle while the shared file system is the bottleneck: the thread, the holder's serving
//! thread and both UCX progress threads (a background worker on each node) run at the lowest
//! priority, and copies pause while the machine has been busy ([`IdleGate`]). Each node then
//! moves the whole dataset once over the network; without replication each epoch moves most
//! of a shard.

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::source::{ClusterSource, Locate, read_at_via_pieces};
use crate::cache::Cache;
use crate::core::Version;
use crate::core::source::{FillSink, Origin, Source};
use crate::fill::Reader;
use crate::locator::error::LocatorError;
use crate::locator::membership::NodeId;
use crate::locator::tiers::Key;
use crate::stats::Stats;
use crate::transport::pull::Puller;

/// Replication stops while the cache holds more than this share of its capacity, leaving the
/// rest to the files this node's readers ask for.
pub const FILL_LIMIT: f64 = 0.9;
/// Most copies asked of one global home at a time.
const FEED_BATCH: u32 = 512;
/// Pause between feed polls once nothing new arrives: from the first to the last, doubling.
const POLL_FIRST: Duration = Duration::from_millis(50);
const POLL_LAST: Duration = Duration::from_secs(1);
/// Copies pause while less than this share of the machine's CPU time was idle over the last
/// [`IDLE_WINDOW`]: lowest priority alone still lets them take CPU the readers are about to
/// need (a reader's request, woken, waits for the copy's thread to be preempted; locks the
/// copy holds), so they leave the readers some slack.
const MIN_IDLE: f64 = 0.2;
const IDLE_WINDOW: Duration = Duration::from_millis(100);

/// Waits, before each copy, until the machine's CPUs have been idle enough lately.
struct IdleGate {
    /// (busy, idle) CPU ticks of the machine at the last sample, and when it was taken.
    last: Option<(u64, u64)>,
    at: Instant,
}

impl IdleGate {
    fn new() -> IdleGate {
        IdleGate {
            last: cpu_ticks(),
            at: Instant::now(),
        }
    }

    fn wait(&mut self) {
        while self.at.elapsed() >= IDLE_WINDOW {
            let now = cpu_ticks();
            let share = match (self.last, now) {
                (Some((b0, i0)), Some((b1, i1))) if b1 + i1 > b0 + i0 => {
                    (i1 - i0) as f64 / ((b1 + i1) - (b0 + i0)) as f64
                }
                // No /proc/stat, or no tick passed: do not hold copies back.
                _ => 1.0,
            };
            self.last = now;
            self.at = Instant::now();
            if share >= MIN_IDLE {
                return;
            }
            std::thread::sleep(IDLE_WINDOW);
        }
    }
}

/// The machine's busy and idle CPU ticks so far (the `cpu` line of /proc/stat; iowait counts
/// as idle).
fn cpu_ticks() -> Option<(u64, u64)> {
    busy_idle(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// (busy, idle) from the text of /proc/stat: `cpu user nice system idle iowait irq softirq
/// steal guest guest_nice`, guest time being part of user time already.
fn busy_idle(stat: &str) -> Option<(u64, u64)> {
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(|t| t.parse().unwrap_or(0))
        .collect();
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((ticks.iter().sum::<u64>() - idle, idle))
}

/// Pulls one file from the holders the feed named; anything else is an error (the replicator
/// skips the file: a reader that needs it later locates it as usual).
struct FromHolders {
    cluster: Arc<ClusterSource>,
    copier: Arc<Puller>,
    holders: Vec<NodeId>,
    /// Bytes this source pulled (a reader may fill part of the file meanwhile).
    pulled: AtomicU64,
}

impl Source for FromHolders {
    fn read_at(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<Origin> {
        read_at_via_pieces(self, path, version, offset, buf)
    }

    fn read_into(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        len: u64,
        sink: FillSink<'_>,
    ) -> io::Result<Origin> {
        let pulled = self.cluster.pull_with(
            &*self.copier,
            path,
            version,
            &self.holders,
            (offset, len, Instant::now() + self.cluster.locator.timeout()),
            sink,
        )?;
        if !pulled {
            return Err(LocatorError::FeedHoldersFailed(path.to_string()).into());
        }
        self.pulled.fetch_add(len, Ordering::Relaxed);
        Ok(Origin::Peer)
    }
}

/// Starts the replicator thread of a node. `copier` pulls through the background UCX worker.
pub fn start_replicator(
    cluster: Arc<ClusterSource>,
    copier: Puller,
    cache: Arc<Cache>,
    stats: Arc<Stats>,
) {
    std::thread::Builder::new()
        .name("replicator".into())
        .spawn(move || {
            crate::sys::lower_thread_priority();
            Replicator {
                cluster,
                copier: Arc::new(copier),
                cache,
                stats,
                next: HashMap::new(),
                seen: HashSet::new(),
                gate: IdleGate::new(),
            }
            .run()
        })
        .expect("spawn replicator");
}

/// Files a replicator remembers having tried (about 100 bytes each).
const MAX_SEEN: usize = 1 << 20;

struct Replicator {
    cluster: Arc<ClusterSource>,
    copier: Arc<Puller>,
    cache: Arc<Cache>,
    stats: Arc<Stats>,
    /// Per global home, the position in its feed to ask from next.
    next: HashMap<NodeId, u64>,
    /// Files already copied or tried (a failed one is left to readers).
    seen: HashSet<Key>,
    gate: IdleGate,
}

impl Replicator {
    fn run(mut self) {
        let homes: Vec<NodeId> = self
            .cluster
            .locator
            .service
            .membership
            .members()
            .map(|m| m.id)
            .collect();
        let mut pause = POLL_FIRST;
        loop {
            let mut new = false;
            for &home in &homes {
                new |= self.poll(home);
            }
            if new {
                pause = POLL_FIRST;
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(POLL_LAST);
            }
        }
    }

    /// Copies what `home`'s feed lists after our position; `true` if it listed anything.
    fn poll(&mut self, home: NodeId) -> bool {
        let link = &self.cluster.locator;
        let locator = &link.service;
        let after = self.next.get(&home).copied().unwrap_or(0);
        let Some((next, copies)) = locator.gained(&link.runtime, home, after, FEED_BATCH) else {
            return false;
        };
        self.next.insert(home, next);
        let me = locator.me();
        for (key, holder) in &copies {
            // Produced files have their own life cycle (names, versions, the producer).
            // Bounded: forgetting what was tried costs a cache lookup per file, not a copy.
            if self.seen.len() >= MAX_SEEN {
                self.seen.clear();
            }
            if *holder == me || crate::core::names::is_object(&key.0) || self.seen.contains(key) {
                continue;
            }
            let limit = (self.cache.capacity() as f64 * FILL_LIMIT) as u64;
            if key.1.size > limit {
                // Never fits: skip it rather than wait for it.
                self.seen.insert(key.clone());
                continue;
            }
            if self.cache.used_bytes() + key.1.size > limit {
                // Full: leave the rest for later (our position is not advanced past it).
                self.next.insert(home, after);
                return false;
            }
            self.seen.insert(key.clone());
            self.gate.wait();
            if let Err(e) = self.copy(key, *holder) {
                tracing::debug!(path = %key.0, holder, error = %e, "not replicated");
            }
        }
        !copies.is_empty()
    }

    fn copy(&self, (path, version): &Key, holder: NodeId) -> Result<(), crate::fill::FillError> {
        if self
            .cache
            .lookup(path, *version)
            .is_some_and(|e| e.is_complete())
        {
            return Ok(());
        }
        let source = Arc::new(FromHolders {
            cluster: self.cluster.clone(),
            copier: self.copier.clone(),
            holders: vec![holder],
            pulled: AtomicU64::new(0),
        });
        let reader = Reader {
            cache: self.cache.clone(),
            stats: self.stats.clone(),
            source: source.clone(),
        };
        let entry = self.cache.entry_or_uncached(path, *version);
        entry.pin();
        // Chunks a reader is filling meanwhile are left to it.
        let r = reader.fill_ahead(&entry, 0..entry.chunk_count());
        entry.unpin();
        let pulled = source.pulled.load(Ordering::Relaxed);
        if pulled > 0 {
            self.stats.replicated_files.fetch_add(1, Ordering::Relaxed);
            self.stats
                .bytes_replicated
                .fetch_add(pulled, Ordering::Relaxed);
        }
        r.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_and_idle_ticks_come_from_the_cpu_line() {
        let stat = "cpu  100 5 20 300 7 1 2 3 50 0\ncpu0 50 2 10 150 3 0 1 1 25 0\n";
        assert_eq!(
            busy_idle(stat),
            Some((131, 307)),
            "guest time is not counted twice"
        );
        assert_eq!(busy_idle("intr 1 2\n"), None);
        assert_eq!(busy_idle(""), None);
        let (b, i) = cpu_ticks().expect("Linux has /proc/stat");
        assert!(b + i > 0);
    }
}
