//! Replication (`dyadfs mount --replicate`): a background thread copies into this node's cache
//! the files other nodes fetched, so a later epoch that gives this node another shard of the
//! dataset finds it local instead of pulling it file by file while the training waits.
//!
//! The thread reads each global home's feed of copies racks gained (`Message::Gained`) and
//! pulls what this node lacks from the holder named there: never from the backing store, never
//! evicting (it stops while the cache is fuller than its limit: `--replicate auto` half the
//! capacity, `on` 90%). Whole small files come in batches from each holder (one connection,
//! the requests in one write, the replies streamed back, stored by the batch fill as a
//! prefetch list's are); larger files chunk by chunk. Copies use the CPU a cold epoch
//! leaves idle while the shared file system is the bottleneck: the thread, the holder's serving
//! thread and both UCX progress threads (a background worker on each node) run at the lowest
//! priority, and copies pause while the machine has been busy ([`IdleGate`]). Each node then
//! moves the whole dataset once over the network; without replication each epoch moves most
//! of a shard.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::source::{ClusterSource, Locate, read_at_via_pieces};
use crate::cache::{Cache, Entry};
use crate::core::Version;
use crate::core::source::{BatchSink, FillSink, Origin, Piece, Source};
use crate::fill::Reader;
use crate::locator::error::LocatorError;
use crate::locator::membership::NodeId;
use crate::locator::tiers::Key;
use crate::stats::Stats;
use crate::transport::TransportError;
use crate::transport::pull::{Puller, Want};

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
/// The longest a copy waits for idle CPU: on a machine the readers keep busy, copies still go
/// on, a batch at least this often, instead of starving.
const MAX_HOLD: Duration = Duration::from_secs(1);

/// Waits, before each copy, until the machine's CPUs have been idle enough lately (at most
/// [`MAX_HOLD`]).
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
        let started = Instant::now();
        while self.at.elapsed() >= IDLE_WINDOW && started.elapsed() < MAX_HOLD {
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

/// Pulls from the holder the feed named: one file at a time, or whole small files in batches
/// (one connection, the requests in one write, the replies streamed back). Anything else is an
/// error (the replicator skips the file: a reader that needs it later locates it as usual).
struct FromHolder {
    cluster: Arc<ClusterSource>,
    copier: Arc<Puller>,
    holder: NodeId,
    /// Bytes this source pulled (a reader may fill part of a file meanwhile).
    pulled: AtomicU64,
}

impl Source for FromHolder {
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
            &[self.holder],
            (offset, len, Instant::now() + self.cluster.locator.timeout()),
            sink,
        )?;
        if !pulled {
            return Err(LocatorError::FeedHoldersFailed(path.to_string()).into());
        }
        self.pulled.fetch_add(len, Ordering::Relaxed);
        Ok(Origin::Peer)
    }

    fn read_batch(&self, files: &[Piece<'_>], sink: BatchSink<'_>) -> Vec<io::Result<Origin>> {
        let all = |e: &dyn std::fmt::Display| -> Vec<io::Result<Origin>> {
            files
                .iter()
                .map(|_| Err(io::Error::other(e.to_string())))
                .collect()
        };
        let link = &self.cluster.locator;
        let Some(addr) = link.membership().member(self.holder).map(|m| m.addr) else {
            return all(&"the holder left the cluster");
        };
        let wants: Vec<Want> = files
            .iter()
            .map(|f| Want::whole(f.path, f.version, f.len))
            .collect();
        let mut each = |k: usize, bytes: &[u8], crc: u32| sink(k, 0, bytes, Some(crc));
        match self
            .copier
            .pull_batch(addr, &wants, &mut each, link.timeout())
        {
            Ok(outcomes) => outcomes
                .into_iter()
                .zip(files)
                .map(|(r, f)| match r {
                    Ok(()) => {
                        self.pulled.fetch_add(f.len, Ordering::Relaxed);
                        let stats = &self.cluster.stats;
                        stats.batched_pulls.fetch_add(1, Ordering::Relaxed);
                        Ok(Origin::Peer)
                    }
                    Err(TransportError::Sink(e)) => Err(e),
                    Err(e) => Err(io::Error::other(e.to_string())),
                })
                .collect(),
            Err(e) => {
                // The connection failed (the holder died, froze or restarted): reported once,
                // so that readers try it last; its files are left to them.
                if let Some(f) = files.first() {
                    link.pull_failed(f.path, f.version, self.holder, &e);
                }
                all(&e)
            }
        }
    }
}

/// Starts the replicator thread of a node, which copies while the cache is under `fill_limit`
/// of its capacity. `copier` pulls through the background UCX worker.
pub fn start_replicator(
    cluster: Arc<ClusterSource>,
    copier: Puller,
    cache: Arc<Cache>,
    stats: Arc<Stats>,
    fill_limit: f64,
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
                fill_limit,
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
/// Most files, and bytes, in one batch from one holder.
const BATCH_FILES: usize = 64;
const BATCH_BYTES: u64 = 8 << 20;

struct Replicator {
    cluster: Arc<ClusterSource>,
    copier: Arc<Puller>,
    cache: Arc<Cache>,
    stats: Arc<Stats>,
    /// Copies stop while the cache holds more than this share of its capacity.
    fill_limit: f64,
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

    /// The bytes copies may fill the cache up to.
    fn limit(&self) -> u64 {
        (self.cache.capacity() as f64 * self.fill_limit) as u64
    }

    /// Copies what `home`'s feed lists after our position, holder by holder, small files in
    /// batches; `true` if our position in it moved (more may follow at once).
    ///
    /// A cache at its limit asks nothing: a full page would be asked again and again, and
    /// with it every home of the cluster, as fast as the polls go (in the chaos soak, caches
    /// full of the nodes' own reads made replication by default cost 30% of the reads).
    fn poll(&mut self, home: NodeId) -> bool {
        let link = &self.cluster.locator;
        let locator = &link.service;
        let after = self.next.get(&home).copied().unwrap_or(0);
        if self.cache.used_bytes() >= self.limit() {
            return false;
        }
        let Some((next, copies)) = locator.gained(&link.runtime, home, after, FEED_BATCH) else {
            return false;
        };
        self.next.insert(home, next);
        let me = locator.me();
        let limit = self.limit();
        // What to copy, by holder, in the feed's order; the bytes planned so far.
        let mut plan: BTreeMap<NodeId, Vec<Key>> = BTreeMap::new();
        let mut planned = 0u64;
        for (key, holder) in &copies {
            // Bounded: forgetting what was tried costs a cache lookup per file, not a copy.
            if self.seen.len() >= MAX_SEEN {
                self.seen.clear();
            }
            // Produced files have their own life cycle (names, versions, the producer).
            if *holder == me || crate::core::names::is_object(&key.0) || self.seen.contains(key) {
                continue;
            }
            if key.1.size > limit {
                // Never fits: skip it rather than wait for it.
                self.seen.insert(key.clone());
                continue;
            }
            if self.cache.used_bytes() + planned + key.1.size > limit {
                // Full: the rest waits for room (our position goes back to this page; what was
                // copied is remembered).
                self.next.insert(home, after);
                break;
            }
            self.seen.insert(key.clone());
            planned += key.1.size;
            plan.entry(*holder).or_default().push(key.clone());
        }
        for (holder, keys) in plan {
            if !self.cluster.locator.is_down(holder) {
                self.copy_from(holder, &keys);
            }
        }
        self.next.get(&home) != Some(&after)
    }

    /// Copies `keys` from `holder`: whole small files in batches, the others one by one. A
    /// holder that fails a batch is left alone for the rest of this poll.
    fn copy_from(&mut self, holder: NodeId, keys: &[Key]) {
        let source = Arc::new(FromHolder {
            cluster: self.cluster.clone(),
            copier: self.copier.clone(),
            holder,
            pulled: AtomicU64::new(0),
        });
        let reader = Reader {
            cache: self.cache.clone(),
            stats: self.stats.clone(),
            source: source.clone(),
        };
        let cfg = &self.copier.cfg;
        let small = u64::from(cfg.chunk.min(cfg.eager_max.max(1)));
        let mut batch: Vec<Arc<Entry>> = Vec::new();
        let mut bytes = 0;
        for key in keys {
            let Some(entry) = self.wanted(key) else {
                continue;
            };
            if entry.chunk_count() == 1 && entry.version.size <= small {
                if batch.len() == BATCH_FILES || bytes + entry.version.size > BATCH_BYTES {
                    bytes = 0;
                    if !self.copy_batch(&reader, &source, std::mem::take(&mut batch)) {
                        done(&entry);
                        return;
                    }
                }
                bytes += entry.version.size;
                batch.push(entry);
            } else {
                self.gate.wait();
                let before = source.pulled.load(Ordering::Relaxed);
                // Chunks a reader is filling meanwhile are left to it.
                let r = reader.fill_ahead(&entry, 0..entry.chunk_count());
                done(&entry);
                let pulled = source.pulled.load(Ordering::Relaxed) - before;
                self.count(1, pulled);
                if let Err(e) = r {
                    tracing::debug!(path = %entry.path, holder, error = %e, "not replicated");
                }
            }
        }
        self.copy_batch(&reader, &source, batch);
    }

    /// The cache entry to copy `key` into, pinned and marked as being copied (readers wait for
    /// its fills a moment only), unless it is cached whole already.
    fn wanted(&self, (path, version): &Key) -> Option<Arc<Entry>> {
        if self
            .cache
            .lookup(path, *version)
            .is_some_and(|e| e.is_complete())
        {
            return None;
        }
        let entry = self.cache.entry_or_uncached(path, *version);
        entry.pin();
        entry.set_copying(true);
        Some(entry)
    }

    /// Copies a batch of whole small files (pinned; unpinned here); `false` if the holder
    /// failed it.
    fn copy_batch(
        &mut self,
        reader: &Reader<FromHolder>,
        source: &FromHolder,
        batch: Vec<Arc<Entry>>,
    ) -> bool {
        if batch.is_empty() {
            return true;
        }
        self.gate.wait();
        let before = source.pulled.load(Ordering::Relaxed);
        let filled = reader.fill_batch(&batch);
        for entry in &batch {
            done(entry);
        }
        let pulled = source.pulled.load(Ordering::Relaxed) - before;
        self.count(filled, pulled);
        if pulled == 0 {
            tracing::debug!(
                holder = source.holder,
                files = batch.len(),
                "batch not replicated"
            );
        }
        pulled > 0 || filled == batch.len()
    }

    fn count(&self, files: usize, pulled: u64) {
        if pulled > 0 {
            self.stats
                .replicated_files
                .fetch_add(files as u64, Ordering::Relaxed);
            self.stats
                .bytes_replicated
                .fetch_add(pulled, Ordering::Relaxed);
        }
    }
}

/// Lets go of an entry [`Replicator::wanted`] gave: unmarked, unpinned.
fn done(entry: &Entry) {
    entry.set_copying(false);
    entry.unpin();
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
