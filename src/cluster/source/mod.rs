//! The multi-node glue: a read-path [`Source`] that asks the locator where a file is and pulls
//! it from a peer, waits (bounded) while another node fetches it, or reads the backing store;
//! the [`ChunkStore`](crate::transport::server::ChunkStore) through which peers read this node's
//! cache; and the task that publishes completed files and unpublishes dropped ones.
//!
//! The fetch logic reaches the locator through [`Locate`] and peers through [`Pull`], so its
//! choices (holder order, failed-holder fallback, coordinated waits, the backing fallback) are
//! unit-tested with in-memory doubles (`tests.rs`); the daemon plugs in the RPC service
//! ([`ServiceLink`]) and the UCX [`Puller`].
//!
//! Its parts: the ports and the daemon's adapters to them (`ports`), a read's path through the
//! locator's answers (`read`), the store peers read this node's cache through (`store`), and the
//! publisher of this node's copies (`publisher`).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backing::BackingStore;
use crate::core::Version;
use crate::core::source::{FillSink, Origin, Source};
use crate::core::sync::lock;
use crate::fill::WHOLE_FILE_MAX;
use crate::locator::error::LocatorError;
use crate::locator::membership::NodeId;
use crate::locator::proto::PageMap;
use crate::locator::tiers::pick_holder;
use crate::stats::Stats;
use crate::transport::TransportError;
use crate::transport::pull::{Puller, Want};

mod ports;
mod publisher;
mod read;
mod store;

pub use ports::{Locate, Pull, ServiceLink};
pub use publisher::start_publisher;
pub use store::{CacheStore, Fetcher, page_map, recheck_chunk};

/// A suspect holder is waited for at most this fraction of the peer timeout.
const SUSPECT_WAIT_DIVISOR: u32 = 4;

/// A [`Source`] over the cluster: locate, then pull from a holder, wait for a fetcher, or read
/// `backing` (the shared file system).
pub struct ClusterSource<L = ServiceLink, P = Puller, B = BackingStore> {
    pub locator: L,
    pub puller: P,
    pub backing: B,
    pub stats: Arc<Stats>,
    /// What holders said they have of large files (their page maps: see `holders_with`).
    pub maps: Mutex<PageMaps>,
    /// Files a read spent its whole peer timeout on lately, and when (see `peer_budget`).
    pub spent: Mutex<Spent>,
}

/// Files (by path hash and version) whose read spent its whole peer timeout, and when.
pub type Spent = HashMap<(u64, Version), Instant>;
/// Files remembered in [`Spent`] before those older than a timeout are forgotten.
const SPENT_KEPT: usize = 1024;

/// Holders' page maps, by file and holder, with when each was asked: `None` if the holder
/// said it has no copy.
pub type PageMaps = HashMap<(String, Version, NodeId), (Instant, Option<PageMap>)>;

/// How long a page map that lacks the bytes a read wants is believed: a holder reading the
/// file at random gains pages all the time (a reader then asks again at most this often).
const MAP_FRESH: Duration = Duration::from_secs(1);
/// Page maps kept (up to 16 KiB each; they are forgotten all at once past this and asked
/// again).
const MAPS_KEPT: usize = 256;

impl<L: Locate, P: Pull, B: Source> ClusterSource<L, P, B> {
    /// The source of last resort: the backing store, or for a produced object (which the
    /// backing store never has) its producer, named in the object's key.
    fn read_backing(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        len: u64,
        sink: FillSink<'_>,
    ) -> io::Result<Origin> {
        if let Some(producer) = crate::core::names::producer_of(path) {
            let deadline = Instant::now() + self.locator.timeout();
            return match self.pull_with(
                &self.puller,
                path,
                version,
                &[producer],
                (offset, len, deadline),
                sink,
            )? {
                true => Ok(Origin::Peer),
                false => Err(LocatorError::ProducerUnreachable {
                    producer,
                    path: path.to_string(),
                }
                .into()),
            };
        }
        self.backing.read_into(path, version, offset, len, sink)
    }

    /// Of `holders`, those to pull bytes `[offset, offset + len)` of `path` from, this node
    /// left out. A copy of a large file may be partial (the pages a random reader filled), so
    /// each holder's page map is asked, kept, and asked again when it lacks the bytes and is
    /// older than [`MAP_FRESH`] (or a pull it promised failed). The holders that have the
    /// bytes, else those that fill what they lack for their peers (the file's designated
    /// fetcher: each byte is read from the shared file system once), else none: the read goes
    /// to the shared file system without a pull that would be refused. A holder that does not
    /// say is kept (pulling finds out). Small files are held whole or not at all.
    fn holders_with(
        &self,
        path: &str,
        version: Version,
        holders: &[NodeId],
        (offset, len, deadline): (u64, u64, Instant),
    ) -> Vec<NodeId> {
        let me = self.locator.me();
        let others: Vec<NodeId> = holders.iter().copied().filter(|&h| h != me).collect();
        if version.size <= WHOLE_FILE_MAX {
            return others;
        }
        let end = offset + len;
        let said: Vec<(NodeId, Option<bool>, bool)> = others
            .into_iter()
            .map(|h| {
                let (has, fills) = self.holder_pages(h, path, version, (offset, end), deadline);
                (h, has, fills)
            })
            .collect();
        let pick = |keep: &dyn Fn(Option<bool>, bool) -> bool| -> Vec<NodeId> {
            said.iter()
                .filter(|&&(_, has, fills)| keep(has, fills))
                .map(|&(h, ..)| h)
                .collect()
        };
        let with = pick(&|has, _| has != Some(false));
        if with.is_empty() {
            pick(&|_, fills| fills)
        } else {
            with
        }
    }

    /// Whether holder `h` has bytes `[offset, end)` of `path` (`None`: it did not say) and
    /// fills what it lacks for its peers, from its page map (kept, or asked now).
    fn holder_pages(
        &self,
        h: NodeId,
        path: &str,
        version: Version,
        (offset, end): (u64, u64),
        deadline: Instant,
    ) -> (Option<bool>, bool) {
        let key = (path.to_string(), version, h);
        let now = Instant::now();
        if let Some((asked, map)) = lock(&self.maps).get(&key) {
            let fresh = now.saturating_duration_since(*asked) < MAP_FRESH;
            let fills = map.as_ref().is_some_and(|m| m.fills);
            match map.as_ref().map(|m| m.covers(offset, end)) {
                Some(Some(true)) => return (Some(true), fills),
                Some(Some(false)) | None if fresh => return (Some(false), fills),
                // Outside the map's window, or believed too long: asked again.
                _ => {}
            }
        }
        let within = deadline.saturating_duration_since(now);
        let Some(map) = self.locator.pages_of(h, (path, version, offset), within) else {
            return (None, false);
        };
        let has = map
            .as_ref()
            .is_some_and(|m| m.covers(offset, end) == Some(true));
        let fills = map.as_ref().is_some_and(|m| m.fills);
        let mut maps = lock(&self.maps);
        if maps.len() >= MAPS_KEPT {
            maps.clear();
        }
        maps.insert(key, (now, map));
        (Some(has), fills)
    }

    /// The peer timeout a read of `path` may spend before the shared file system serves it:
    /// none if a read of the file spent a whole one less than a timeout ago. Every READ of a
    /// large file has a budget of its own: when its holders froze together (not suspect, not
    /// known to be down yet), each wave of READs met them again, and a 24 MiB read took 3.2 s
    /// in the chaos soak's double freezes. A holder that went away costs a file one timeout.
    fn peer_budget(&self, path: &str, version: Version) -> Duration {
        let timeout = self.locator.timeout();
        let spent = lock(&self.spent);
        match spent.get(&(crate::core::path_hash(path), version)) {
            Some(at) if at.elapsed() < timeout => Duration::ZERO,
            _ => timeout,
        }
    }

    /// Remembers that a read of `path` spent its whole peer timeout now.
    fn spent_timeout(&self, path: &str, version: Version) {
        let timeout = self.locator.timeout();
        let mut spent = lock(&self.spent);
        if spent.len() >= SPENT_KEPT {
            spent.retain(|_, at| at.elapsed() < timeout);
        }
        if spent.len() < SPENT_KEPT {
            spent.insert((crate::core::path_hash(path), version), Instant::now());
        }
    }

    /// How long a pull from `holder` may wait of the `left` of its read's deadline. A suspect
    /// (it just failed a call or a pull) gets a short wait: frozen, it would cost each request
    /// of a large read a whole peer timeout again (every READ has its own: the soak's reads of
    /// 24 MiB took two, 4.2 s, when their only holder froze); busy but live, it still answers
    /// in that time.
    fn pull_wait(&self, holder: NodeId, left: Duration, suspects: &[NodeId]) -> Duration {
        if suspects.contains(&holder) {
            left.min(self.locator.timeout() / SUSPECT_WAIT_DIVISOR)
        } else {
            left
        }
    }

    /// The holder [`ClusterSource::pull_with`] would try first for `path` (not this node).
    fn first_holder(&self, path: &str, holders: &[NodeId]) -> Option<NodeId> {
        let live: Vec<NodeId> = holders
            .iter()
            .copied()
            .filter(|&h| !self.locator.is_down(h))
            .collect();
        let salt = crate::core::path_hash(path) ^ u64::from(self.locator.me());
        let avoid = self.locator.suspects();
        pick_holder(self.locator.membership(), &live, &avoid, salt)
            .filter(|&h| h != self.locator.me())
    }

    /// Tries the holders in preference order with `puller` (the replicator has a background
    /// one) for the range `(offset, len)`, until `deadline`; `false` if none served it in time.
    /// An error is the sink's: it refused bytes a holder sent (the cache could not store them),
    /// which says nothing of the holder, so nobody else is tried.
    pub(crate) fn pull_with(
        &self,
        puller: &impl Pull,
        path: &str,
        version: Version,
        holders: &[NodeId],
        (offset, len, deadline): (u64, u64, Instant),
        sink: FillSink<'_>,
    ) -> io::Result<bool> {
        // A holder known to be down is not tried at all: with no other, the caller reads the
        // shared file system at once instead of waiting a timeout on it.
        let live: Vec<NodeId> = holders
            .iter()
            .copied()
            .filter(|&h| !self.locator.is_down(h))
            .collect();
        let holders = &live[..];
        let suspects = self.locator.suspects();
        let mut tried = Vec::new();
        let salt = crate::core::path_hash(path) ^ u64::from(self.locator.me());
        let membership = self.locator.membership();
        loop {
            // Suspect holders come last; each holder is tried once.
            let avoid: Vec<u32> = tried.iter().chain(&suspects).copied().collect();
            let Some(h) = pick_holder(membership, holders, &avoid, salt) else {
                return Ok(false);
            };
            if tried.contains(&h) {
                return Ok(false);
            }
            tried.push(h);
            if h == self.locator.me() {
                continue;
            }
            // The read's one peer timeout is spent: the caller reads the shared file system.
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let within = self.pull_wait(h, left, &suspects);
            let Some(addr) = membership.member(h).map(|m| m.addr) else {
                return Ok(false);
            };
            let want = Want {
                path: path.to_string(),
                version,
                offset,
                len,
            };
            let mut pulled = |off: u64, bytes: &[u8], crc: u32| sink(off, bytes, Some(crc));
            let span = tracing::debug_span!("pull", path, holder = h, offset, bytes = len);
            let r = span.in_scope(|| puller.pull(addr, &want, &mut pulled, within));
            match r {
                Ok(_) => return Ok(true),
                Err(TransportError::Sink(e)) => return Err(e),
                // This node's own data plane failed: the holder is not blamed for it.
                Err(e @ (TransportError::Local(_) | TransportError::NoSlot(_))) => {
                    tracing::info!(holder = h, error = %e, "pull failed here; next holder");
                }
                Err(e) => {
                    if matches!(e, TransportError::Remote { .. }) {
                        self.stats.pulls_refused.fetch_add(1, Ordering::Relaxed);
                    }
                    if matches!(e, TransportError::Forged { .. }) {
                        self.stats.forged_chunks.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(holder = h, error = %e, "a forged chunk was dropped");
                    } else {
                        tracing::info!(holder = h, error = %e, "pull failed; trying the next holder");
                    }
                    self.locator.pull_failed(path, version, h, &e);
                    lock(&self.maps).remove(&(path.to_string(), version, h));
                }
            }
        }
    }
}

/// `Source::read_at` of a source whose bytes arrive in pieces through `read_into`.
pub(crate) fn read_at_via_pieces(
    source: &impl Source,
    path: &str,
    version: Version,
    offset: u64,
    buf: &mut [u8],
) -> io::Result<Origin> {
    let len = buf.len() as u64;
    let mut copy = |off: u64, bytes: &[u8], _crc: Option<u32>| {
        let at = (off - offset) as usize;
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        Ok(())
    };
    source.read_into(path, version, offset, len, &mut copy)
}

#[cfg(test)]
mod tests;
