//! The multi-node glue: a read-path [`Source`] that asks the locator where a file is and pulls
//! it from a peer, waits (bounded) while another node fetches it, or reads the backing store;
//! the [`ChunkStore`] through which peers read this node's cache; and the task that publishes
//! completed files and unpublishes dropped ones.
//!
//! The fetch logic reaches the locator through [`Locate`] and peers through [`Pull`], so its
//! choices (holder order, failed-holder fallback, coordinated waits, the backing fallback) are
//! unit-tested with in-memory doubles (`source_tests.rs`); the daemon plugs in the RPC service
//! ([`ServiceLink`]) and the UCX [`Puller`].

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backing::BackingStore;
use crate::cache::{Cache, CacheEvent};
use crate::core::Version;
use crate::core::source::{BatchSink, FillSink, Origin, Piece, Source};
use crate::core::sync::lock;
use crate::fill::{Reader, WHOLE_FILE_MAX};
use crate::locator::error::LocatorError;
use crate::locator::membership::{Membership, NodeId};
use crate::locator::proto::{Msg, PageMap};
use crate::locator::service::LocatorService;
use crate::locator::tiers::{Reply, pick_holder};
use crate::stats::Stats;
use crate::transport::TransportError;
use crate::transport::pull::{self, Puller, Sink, Want};
use crate::transport::server::ChunkStore;

/// A suspect holder is waited for at most this fraction of the peer timeout.
const SUSPECT_WAIT_DIVISOR: u32 = 4;

/// What the fetch logic asks of the locator.
pub trait Locate: Send + Sync + 'static {
    fn me(&self) -> NodeId;
    fn membership(&self) -> &Membership;
    /// Bound on waiting for another node's fetch.
    fn timeout(&self) -> Duration;
    /// What this node should do about a file it misses, asking for at most `within`.
    fn locate(&self, path: &str, version: Version, within: Duration) -> Reply;
    /// This node was told to fetch and could not read the backing store.
    fn fetch_failed(&self, path: &str, version: Version);
    /// Nodes that failed recently: tried last as holders.
    fn suspects(&self) -> Vec<NodeId>;
    /// A pull from `holder` failed: it is no holder of this version; unless it answered (it
    /// said it has not got the bytes) it is suspect; a chunk that failed its checksum is
    /// reported to it.
    fn pull_failed(&self, path: &str, version: Version, holder: NodeId, error: &TransportError);
    /// Whether the cluster declared `node` down: it is never tried.
    fn is_down(&self, node: NodeId) -> bool;
    /// Which pages `holder` has of `path` at `version` in the window of byte `offset`:
    /// `Some(None)` if it holds no copy, `None` if it did not say (see
    /// [`LocatorService::pages_of`]). By default nobody says.
    fn pages_of(
        &self,
        _holder: NodeId,
        _file: (&str, Version, u64),
        _within: Duration,
    ) -> Option<Option<PageMap>> {
        None
    }
}

/// Pulls a byte range from the holder at an address, waiting at most `within` for each answer.
pub trait Pull: Send + Sync + 'static {
    fn pull(
        &self,
        peer: SocketAddr,
        want: &Want,
        sink: Sink<'_>,
        within: Duration,
    ) -> Result<u64, TransportError>;

    /// Pulls several whole small files from one holder at once (see [`Puller::pull_batch`]);
    /// by default it cannot, and the caller pulls them one by one.
    fn pull_batch(
        &self,
        _peer: SocketAddr,
        _wants: &[Want],
        _sink: pull::BatchSink<'_>,
        _within: Duration,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        Err(TransportError::Local("no batched pulls".into()))
    }
}

impl Pull for Puller {
    fn pull(
        &self,
        peer: SocketAddr,
        want: &Want,
        sink: Sink<'_>,
        within: Duration,
    ) -> Result<u64, TransportError> {
        Puller::pull_within(self, peer, want, sink, within)
    }

    fn pull_batch(
        &self,
        peer: SocketAddr,
        wants: &[Want],
        sink: pull::BatchSink<'_>,
        within: Duration,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        Puller::pull_batch(self, peer, wants, sink, within)
    }
}

/// The daemon's locator: the RPC service, its blocking calls answered on `runtime` when this
/// node is the addressee.
pub struct ServiceLink {
    pub service: Arc<LocatorService>,
    pub runtime: tokio::runtime::Handle,
}

impl Locate for ServiceLink {
    fn me(&self) -> NodeId {
        self.service.me()
    }

    fn membership(&self) -> &Membership {
        &self.service.membership
    }

    fn timeout(&self) -> Duration {
        self.service.timeout
    }

    fn locate(&self, path: &str, version: Version, within: Duration) -> Reply {
        self.service.locate(&self.runtime, path, version, within)
    }

    fn fetch_failed(&self, path: &str, version: Version) {
        self.runtime
            .block_on(self.service.fetch_failed(path, version));
    }

    fn suspects(&self) -> Vec<NodeId> {
        self.service.suspects()
    }

    fn pull_failed(&self, path: &str, version: Version, holder: NodeId, error: &TransportError) {
        self.service
            .node
            .holder_failed(&(path.to_string(), version), holder);
        match error {
            TransportError::Remote { .. } | TransportError::Forged { .. } => {}
            TransportError::Checksum { offset, .. } => {
                let msg = Msg::BadChunk {
                    path: path.to_string(),
                    version,
                    offset: *offset,
                };
                let service = self.service.clone();
                self.runtime.spawn(async move {
                    service.call(holder, msg).await;
                });
            }
            _ => self.service.failed(holder, error),
        }
    }

    fn is_down(&self, node: NodeId) -> bool {
        self.service.liveness.is_down(node)
    }

    fn pages_of(
        &self,
        holder: NodeId,
        file: (&str, Version, u64),
        within: Duration,
    ) -> Option<Option<PageMap>> {
        self.service.pages_of(&self.runtime, holder, file, within)
    }
}

/// A [`Source`] over the cluster: locate, then pull from a holder, wait for a fetcher, or read
/// `backing` (the shared file system).
pub struct ClusterSource<L = ServiceLink, P = Puller, B = BackingStore> {
    pub locator: L,
    pub puller: P,
    pub backing: B,
    pub stats: Arc<Stats>,
    /// What holders said they have of large files (their page maps: see `holders_with`).
    pub maps: Mutex<PageMaps>,
}

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

impl<L: Locate, P: Pull, B: Source> Source for ClusterSource<L, P, B> {
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
        self.read_located(path, version, (offset, len), None, sink)
    }

    /// Moves files by holder: each is located, those whose first holder holds others of the
    /// batch too come in one pull from it ([`Pull::pull_batch`]); the rest, and any a batch
    /// did not bring, are read one by one (with the answer they had).
    fn read_batch(&self, files: &[Piece<'_>], sink: BatchSink<'_>) -> Vec<io::Result<Origin>> {
        let deadline = Instant::now() + self.locator.timeout();
        let mut replies: Vec<Option<Reply>> = Vec::with_capacity(files.len());
        let mut out: Vec<Option<io::Result<Origin>>> = (0..files.len()).map(|_| None).collect();
        let mut by_holder: std::collections::BTreeMap<NodeId, Vec<usize>> = Default::default();
        for (i, f) in files.iter().enumerate() {
            let within = deadline.saturating_duration_since(Instant::now());
            let reply = self.locator.locate(f.path, f.version, within);
            if let Reply::Holders(h) = &reply
                && let Some(first) = self.first_holder(f.path, h)
            {
                by_holder.entry(first).or_default().push(i);
            }
            replies.push(Some(reply));
        }
        let suspects = self.locator.suspects();
        for (holder, batch) in by_holder.into_iter().filter(|(_, b)| b.len() > 1) {
            let left = deadline.saturating_duration_since(Instant::now());
            let within = self.pull_wait(holder, left, &suspects);
            let Some(addr) = self.locator.membership().member(holder).map(|m| m.addr) else {
                continue;
            };
            let wants: Vec<Want> = batch
                .iter()
                .map(|&i| Want {
                    path: files[i].path.to_string(),
                    version: files[i].version,
                    offset: 0,
                    len: files[i].len,
                })
                .collect();
            let mut each = |k: usize, bytes: &[u8], crc: u32| sink(batch[k], 0, bytes, Some(crc));
            let span = tracing::debug_span!("pull_batch", holder, files = batch.len());
            let r = span.in_scope(|| self.puller.pull_batch(addr, &wants, &mut each, within));
            match r {
                Ok(outcomes) => {
                    for (k, r) in outcomes.into_iter().enumerate() {
                        let (i, f) = (batch[k], &files[batch[k]]);
                        match r {
                            Ok(()) => {
                                self.stats.batched_pulls.fetch_add(1, Ordering::Relaxed);
                                out[i] = Some(Ok(Origin::Peer));
                            }
                            Err(TransportError::Sink(e)) => out[i] = Some(Err(e)),
                            // Pulled one by one below, located again (the holder is reported).
                            Err(e) => {
                                self.locator.pull_failed(f.path, f.version, holder, &e);
                                replies[i] = None;
                            }
                        }
                    }
                }
                Err(e @ (TransportError::Local(_) | TransportError::NoSlot(_))) => {
                    tracing::debug!(holder, error = %e, "no batch here; one by one");
                }
                Err(e) => {
                    tracing::info!(holder, error = %e, "batched pull failed; one by one");
                    let f = &files[batch[0]];
                    self.locator.pull_failed(f.path, f.version, holder, &e);
                    for &i in &batch {
                        replies[i] = None;
                    }
                }
            }
        }
        files
            .iter()
            .enumerate()
            .map(|(i, f)| match out[i].take() {
                Some(r) => r,
                None => {
                    let mut one =
                        |off: u64, bytes: &[u8], crc: Option<u32>| sink(i, off, bytes, crc);
                    self.read_located(f.path, f.version, (0, f.len), replies[i].take(), &mut one)
                }
            })
            .collect()
    }
}

impl<L: Locate, P: Pull, B: Source> ClusterSource<L, P, B> {
    /// [`Source::read_into`], acting first on `reply` if the file was located already.
    fn read_located(
        &self,
        path: &str,
        version: Version,
        (offset, len): (u64, u64),
        mut reply: Option<Reply>,
        sink: FillSink<'_>,
    ) -> io::Result<Origin> {
        // One peer timeout for the whole read: locating, pulling from each holder in turn and
        // waiting for another node's fetch all come out of it, so peers that stopped answering
        // (and are not known to be down yet) cost a read at most that before the shared file
        // system serves it.
        let deadline = Instant::now() + self.locator.timeout();
        let range = (offset, len, deadline);
        let mut pause = Duration::from_millis(10);
        let mut waited = false;
        // Holders already tried: a file located again is pulled only from others.
        let mut tried: Option<Vec<NodeId>> = None;
        loop {
            let within = deadline.saturating_duration_since(Instant::now());
            if within.is_zero() {
                return self.read_backing(path, version, offset, len, sink);
            }
            let reply = match reply.take() {
                Some(r) => r,
                None => self.locator.locate(path, version, within),
            };
            match reply {
                Reply::Holders(mut h) => {
                    if let Some(before) = &tried {
                        h.retain(|n| !before.contains(n));
                    }
                    // Those that have the bytes, or fill them: none, and the shared file
                    // system serves them.
                    let h = self.holders_with(path, version, &h, range);
                    if h.is_empty() {
                        return self.read_backing(path, version, offset, len, sink);
                    }
                    if self.pull_with(&self.puller, path, version, &h, range, sink)? {
                        return Ok(Origin::Peer);
                    }
                    // The node tier's holders (a hint from a feed, an answer kept a while) may
                    // have dropped the file: they are forgotten now, and the file is located
                    // once more, for other holders, before the shared file system is read.
                    if tried.is_none() {
                        tried = Some(h);
                        continue;
                    }
                    return self.read_backing(path, version, offset, len, sink);
                }
                Reply::Fetch => {
                    let r = self.read_backing(path, version, offset, len, sink);
                    if r.is_err() {
                        self.locator.fetch_failed(path, version);
                    }
                    return r;
                }
                Reply::WaitFor(f) if f != self.locator.me() => {
                    if !waited {
                        waited = true;
                        self.stats.coordinated_waits.fetch_add(1, Ordering::Relaxed);
                    }
                    // The fetcher serves what it has and fills the rest for us, as it arrives
                    // from the shared file system: each chunk is read there once.
                    if self.pull_with(&self.puller, path, version, &[f], range, sink)? {
                        return Ok(Origin::Peer);
                    }
                    // It could not (it died, or gave up): ask again shortly; the fetch is
                    // handed to a waiter once the fetcher is known to be down.
                    std::thread::sleep(
                        pause.min(deadline.saturating_duration_since(Instant::now())),
                    );
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Reply::WaitFor(_) => return self.read_backing(path, version, offset, len, sink),
            }
        }
    }
}

/// Peers read this node's cache: only present, verified chunks of the exact version.
pub struct CacheStore {
    pub cache: Arc<Cache>,
    pub stats: Arc<Stats>,
    /// Set in a cluster: for a file this node was told to fetch, chunks a waiting peer asks
    /// for that are not here yet are filled first (from the shared file system, single flight
    /// with this node's own readers), so the peer never reads them there too.
    pub fetcher: Option<Fetcher>,
}

pub struct Fetcher {
    pub locator: Arc<LocatorService>,
    pub reader: Reader<BackingStore>,
}

impl ChunkStore for CacheStore {
    fn read_at(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        room: &mut [u8],
        len: usize,
    ) -> io::Result<Option<u32>> {
        let v: Version = version;
        let missing = || io::Error::new(io::ErrorKind::NotFound, "not in this node's cache");
        let fetcher = self
            .fetcher
            .as_ref()
            .filter(|f| f.locator.is_fetching(path, v));
        let entry = match (self.cache.lookup(path, v), fetcher) {
            (Some(e), _) => e,
            (None, Some(_)) => self.cache.entry_or_uncached(path, v),
            (None, None) => return Err(missing()),
        };
        if let Some(f) = fetcher {
            entry.pin();
            let filled = f.reader.fill_for_peer(&entry, offset, offset + len as u64);
            entry.unpin();
            filled.map_err(io::Error::other)?;
        }
        if !entry
            .read_verified(&self.cache, offset, room, len)
            .map_err(io::Error::other)?
        {
            return Err(missing());
        }
        self.stats
            .bytes_served_to_peers
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(entry.chunk_crc(offset, len as u64))
    }
}

/// Publishes every complete copy (`from_cache`: the cache's events, those held at start first),
/// unpublishes dropped ones.
/// Changes queued together go out together (one RPC per rack home). A change its home did not
/// acknowledge (the home is down or not up yet) is retried every second for up to ten minutes.
pub fn start_publisher(
    from_cache: crossbeam_channel::Receiver<CacheEvent>,
    locator: Arc<LocatorService>,
    runtime: &tokio::runtime::Handle,
) {
    const RETRY_EVERY: Duration = Duration::from_secs(1);
    const GIVE_UP_AFTER: Duration = Duration::from_secs(600);
    /// Most changes sent in one round.
    const MAX_BATCH: usize = 512;
    /// How long a round waits for more changes after its first (the publish delay it adds to
    /// a change that comes alone).
    const LINGER: Duration = Duration::from_millis(10);
    /// While changes keep coming (an epoch's pulls: a few per linger on each node), a round
    /// goes on gathering them a linger at a time, up to this long: each round costs an RPC
    /// per home and both sides their wake-ups, and at 10 ms a round carried about 3 copies
    /// (an epoch's publisher and runtime: 81-123 -> 63-66 us per 64 KiB sample of a
    /// DataLoader, docs/BENCHMARKS.md).
    const MOST_LINGER: Duration = Duration::from_millis(50);
    let rt = runtime.clone();
    std::thread::Builder::new()
        .name("publisher".into())
        .spawn(move || {
            let mut retry: Vec<((String, Version, bool), Instant)> = Vec::new();
            let mut last_retry = Instant::now();
            loop {
                let first = match from_cache.recv_timeout(RETRY_EVERY) {
                    Ok(ev) => Some(ev),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                };
                let now = Instant::now();
                // Copies completing close together (a training epoch's pulls) go out together:
                // one RPC per home instead of one per file, which costs both sides a few
                // thread wake-ups per file. The thread sleeps through the linger rather than
                // waking for each change that arrives in it.
                let mut events: Vec<CacheEvent> = first.into_iter().collect();
                if !events.is_empty() {
                    loop {
                        std::thread::sleep(LINGER);
                        let before = events.len();
                        let room = MAX_BATCH.saturating_sub(before);
                        events.extend(from_cache.try_iter().take(room));
                        let quiet = events.len() == before;
                        if quiet || events.len() >= MAX_BATCH || now.elapsed() >= MOST_LINGER {
                            break;
                        }
                    }
                }
                for ev in &events {
                    // Complete here (or dropped): nothing is left to fill for waiting peers. A
                    // partial copy's fetcher goes on filling what they ask of it.
                    if let CacheEvent::Complete { path, version }
                    | CacheEvent::Dropped { path, version } = ev
                    {
                        locator.fetched(path, *version);
                    }
                }
                // A partial copy is published by the file's designated fetcher, which fills what
                // its peers ask that it lacks: a copy another node began while a fetch is under
                // way would end the fetch at the homes (it is a holder), and the others would
                // read the shared file system for what it lacks. One held at start is published.
                events.retain(|ev| match ev {
                    CacheEvent::Partial {
                        path,
                        version,
                        reloaded: false,
                    } => locator.is_fetching(path, *version),
                    _ => true,
                });
                let mut round: Vec<((String, Version, bool), Instant)> = events
                    .into_iter()
                    .map(|ev| match ev {
                        CacheEvent::Complete { path, version }
                        | CacheEvent::Partial { path, version, .. } => ((path, version, true), now),
                        CacheEvent::Dropped { path, version } => ((path, version, false), now),
                    })
                    .collect();
                if last_retry.elapsed() >= RETRY_EVERY {
                    last_retry = now;
                    round.append(&mut retry);
                }
                if round.is_empty() {
                    continue;
                }
                let changes: Vec<(String, Version, bool)> =
                    round.iter().map(|(c, _)| c.clone()).collect();
                let acked = rt.block_on(locator.publish(&changes));
                for ((change, since), ok) in round.into_iter().zip(acked) {
                    if !ok && since.elapsed() < GIVE_UP_AFTER {
                        retry.push((change, since));
                    }
                }
            }
        })
        .expect("spawn publisher");
}

#[cfg(test)]
#[path = "source_tests.rs"]
mod tests;
