//! A read through the cluster: the locator asked, then a holder pulled from, a fetcher waited
//! for, or the backing store read; one file's or a batch's.

use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{ClusterSource, Locate, Pull, read_at_via_pieces};
use crate::core::Version;
use crate::core::source::{BatchSink, FillSink, Origin, Piece, Source};
use crate::locator::membership::NodeId;
use crate::locator::tiers::Reply;
use crate::transport::TransportError;
use crate::transport::pull::Want;

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
                .map(|&i| Want::whole(files[i].path, files[i].version, files[i].len))
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
        // system serves it; and a file at most one (`peer_budget`).
        let budget = self.peer_budget(path, version);
        let deadline = Instant::now() + budget;
        let range = (offset, len, deadline);
        let mut pause = Duration::from_millis(10);
        let mut waited = false;
        // Holders already tried: a file located again is pulled only from others.
        let mut tried: Option<Vec<NodeId>> = None;
        loop {
            let within = deadline.saturating_duration_since(Instant::now());
            if within.is_zero() {
                if !budget.is_zero() {
                    self.spent_timeout(path, version);
                }
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
