//! The fill engine: serve bytes of a file from its cache entry, filling absent chunks from a
//! [`Source`] first (single flight: one filler per chunk, other readers wait for it). The file
//! system's reads, its readahead and prefetch, and the cluster's replication use it; it knows
//! neither.
//!
//! It is generic over the source so unit tests drive it with an in-memory double, the
//! single-node daemon with the backing store, and the multi-node daemon with peers that fall
//! back to the backing store.

mod error;

pub use error::FillError;

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::cache::{Cache, Entry, Mapping, PAGES, PageMask, Pooled, ReadBytes};
use crate::core::source::{Origin, Piece, Source};
use crate::stats::Stats;

/// Files up to this size are fetched whole on their first read: a training sample is read
/// entirely anyway, and one fill costs one backing-store open instead of several.
pub const WHOLE_FILE_MAX: u64 = 8 << 20;
/// Sequential readahead of large files grows 1, 2, 4... chunks up to this many per read.
pub const MAX_READAHEAD_CHUNKS: u64 = 8;
/// A read retries after a checksum failure this many times before reporting EIO.
const VERIFY_ATTEMPTS: usize = 3;

pub struct Reader<S: ?Sized> {
    pub cache: Arc<Cache>,
    pub stats: Arc<Stats>,
    pub source: Arc<S>,
}

impl<S: ?Sized> Clone for Reader<S> {
    fn clone(&self) -> Self {
        Reader {
            cache: self.cache.clone(),
            stats: self.stats.clone(),
            source: self.source.clone(),
        }
    }
}

impl<S: Source + ?Sized> Reader<S> {
    /// Reads up to `len` bytes at `offset` (short only at end of file).
    pub fn read(&self, entry: &Arc<Entry>, offset: u64, len: u32) -> Result<ReadBytes, FillError> {
        self.read_mapped(entry, offset, len, None)
    }

    /// As [`Reader::read`], serving cached bytes from `map` (the entry's mapping) if given.
    pub fn read_mapped(
        &self,
        entry: &Arc<Entry>,
        offset: u64,
        len: u32,
        map: Option<&Arc<Mapping>>,
    ) -> Result<ReadBytes, FillError> {
        let size = entry.version.size;
        let end = (offset + u64::from(len)).min(size);
        if offset >= end {
            return Ok(ReadBytes::Owned(Vec::new()));
        }
        if size > WHOLE_FILE_MAX {
            // The pages the read touches of chunks not present, not the chunks whole (a random
            // read of a record or a row fetches about what it reads; the readahead of a
            // sequential reader fills whole chunks ahead of it).
            let fill = |kept: &mut Kept| {
                self.fill_range_pages(entry, offset, end, Some(kept))
                    .map(drop)
            };
            return self.read_through(entry, offset, end, map, fill, || {
                entry.verify_bytes(&self.cache, offset, end)
            });
        }
        // A file this small is fetched whole on its first read.
        let want = entry.chunks_for(offset, end - offset);
        let fill = |kept: &mut Kept| {
            self.fill_claimed(entry, 0..entry.chunk_count(), true, Some(kept))
                .map(drop)
        };
        self.read_through(entry, offset, end, map, fill, || {
            entry.verify(&self.cache, want.clone())
        })
    }

    /// Bytes `[offset, end)` once `fill` has cached them (or they are served uncached), their
    /// cached copy checked by `verify` (`false`: a chunk or page failed its checksum and was
    /// dropped, so it is fetched again).
    fn read_through(
        &self,
        entry: &Arc<Entry>,
        offset: u64,
        end: u64,
        map: Option<&Arc<Mapping>>,
        fill: impl Fn(&mut Kept) -> Result<(), FillError>,
        verify: impl Fn() -> Result<bool, crate::cache::CacheError>,
    ) -> Result<ReadBytes, FillError> {
        for _ in 0..VERIFY_ATTEMPTS {
            // The bytes this read fills itself are served from the fill's own buffer: reading
            // them back from the cache file would copy them once more.
            let mut kept = Kept::new(offset, end);
            fill(&mut kept)?;
            if let Some(buf) = kept.whole() {
                return Ok(self.served_locally(buf));
            }
            // Not cached: the cache is full of open files, or its file system could not take
            // the bytes (here or in another reader's fill of them, which gave up).
            if !entry.bytes_present(offset, end) {
                return self.read_uncached(entry, offset, end);
            }
            match self.read_cached(entry, offset, end, map, &verify) {
                Ok(Some(buf)) => return Ok(buf),
                // A chunk or page failed its checksum and was dropped: fetched again.
                Ok(None) => {}
                // The cached bytes cannot be read back (the entry left the cache meanwhile, or
                // the disk fails): the source still has them.
                Err(e) => {
                    self.cache.read_failed(entry, &e.into());
                    return self.read_uncached(entry, offset, end);
                }
            }
        }
        Err(FillError::Corrupt(entry.path.to_string()))
    }

    /// Fills the absent pages of `want` in chunk `idx` nobody else is filling, copying what
    /// `kept` asks for as they are cached, then waits (if `wait`) for those others fill.
    /// `Ok(false)`: not cached (no room, or the cache's file system failed a write, or a
    /// background copy holds some of them).
    fn fill_pages(
        &self,
        entry: &Arc<Entry>,
        idx: u64,
        want: PageMask,
        wait: bool,
        mut kept: Option<&mut Kept>,
    ) -> Result<bool, FillError> {
        let claim = entry.claim_pages(idx, want);
        if claim.whole {
            // The cache holds as many partly present chunks as it may.
            return self.fill_claimed(entry, idx..idx + 1, wait, kept);
        }
        let mut fill = PageFill {
            entry,
            cache: &self.cache,
            idx,
            pending: claim.mine,
            reserved: 0,
        };
        if claim.mine != 0 {
            let bytes = entry.page_bytes(idx, claim.mine);
            if entry.is_evicted() || !self.cache.takes_writes() || !self.cache.reserve(entry, bytes)
            {
                return Ok(false);
            }
            fill.reserved = bytes;
            let page = entry.page_size();
            let chunk_start = idx * entry.chunk_size();
            for run in page_runs(claim.mine) {
                let offset = chunk_start + u64::from(run.start) * page;
                let mask = (run.start..run.end).fold(0 as PageMask, |m, p| m | (1 << p));
                let len = entry.page_bytes(idx, mask);
                // Each page's crc32c, appended to piece by piece as the bytes go by in order.
                let mut crcs = [0u32; PAGES as usize];
                let mut at = offset;
                let mut write_error = None;
                let mut sink = |off: u64, bytes: &[u8], _crc: Option<u32>| {
                    if off != at {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "a source piece out of order",
                        ));
                    }
                    if let Err(e) = entry.write_at(off, bytes) {
                        let stop = same_error(&e);
                        write_error = Some(e);
                        return Err(stop);
                    }
                    if let Some(k) = kept.as_deref_mut() {
                        k.take(off, bytes);
                    }
                    let mut rest = bytes;
                    while !rest.is_empty() {
                        let p = ((at - chunk_start) / page) as usize;
                        let page_end = (chunk_start + (p as u64 + 1) * page).min(offset + len);
                        let n = ((page_end - at) as usize).min(rest.len());
                        crcs[p] = crc32c::crc32c_append(crcs[p], &rest[..n]);
                        (rest, at) = (&rest[n..], at + n as u64);
                    }
                    Ok(())
                };
                let started = std::time::Instant::now();
                let read =
                    self.source
                        .read_into(&entry.path, entry.version, offset, len, &mut sink);
                if let Some(e) = write_error {
                    self.cache.fill_failed(entry, &e);
                    return Ok(false);
                }
                let origin = read.map_err(FillError::Source)?;
                if at != offset + len {
                    return Err(FillError::BadSource("a short page fill"));
                }
                self.fetched(entry, origin, len, started);
                fill.complete(mask, &crcs);
            }
            self.cache.pages_filled(entry, idx);
        }
        // A background copy's pages are waited for a moment only: then read around, uncached.
        if claim.others && wait && !entry.wait_pages(idx, want)? {
            return Ok(false);
        }
        Ok(true)
    }

    /// The bytes `[offset, end)` from the cache once `verify` passes; `None` if a chunk or page
    /// failed its checksum (and was dropped).
    fn read_cached(
        &self,
        entry: &Arc<Entry>,
        offset: u64,
        end: u64,
        map: Option<&Arc<Mapping>>,
        verify: impl Fn() -> Result<bool, crate::cache::CacheError>,
    ) -> Result<Option<ReadBytes>, crate::cache::CacheError> {
        if !verify()? {
            return Ok(None);
        }
        let buf = entry.read_bytes(offset, (end - offset) as usize, map)?;
        Ok(Some(self.served_locally(buf)))
    }

    /// `buf`, counted as bytes this node's cache served (read back, or kept from their fill).
    fn served_locally(&self, buf: ReadBytes) -> ReadBytes {
        self.stats
            .bytes_from_local
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        buf
    }

    /// Makes chunks `range` present, filling the absent ones from the source and waiting for
    /// those another reader is filling. `Ok(false)`: this caller's chunks were not cached (the
    /// cache is full of open files, or its file system failed a write: the entry is then
    /// dropped).
    pub fn fill(&self, entry: &Arc<Entry>, range: Range<u64>) -> Result<bool, FillError> {
        self.fill_claimed(entry, range, true, None)
    }

    /// Makes bytes `[offset, end)` present for a peer waiting on this node's fetch of the
    /// file: the pages they touch of a large file (a random reader's record, not its chunks),
    /// the chunks of a small one.
    pub fn fill_for_peer(
        &self,
        entry: &Arc<Entry>,
        offset: u64,
        end: u64,
    ) -> Result<bool, FillError> {
        if entry.version.size <= WHOLE_FILE_MAX {
            return self.fill(entry, entry.chunks_for(offset, end.saturating_sub(offset)));
        }
        self.fill_range_pages(entry, offset, end, None)
    }

    /// Fills the pages bytes `[offset, end)` touch in every chunk, waiting for those others
    /// fill, copying what `kept` asks for; `Ok(false)` if some were not cached.
    fn fill_range_pages(
        &self,
        entry: &Arc<Entry>,
        offset: u64,
        end: u64,
        mut kept: Option<&mut Kept>,
    ) -> Result<bool, FillError> {
        let mut all = true;
        for idx in entry.chunks_for(offset, end.saturating_sub(offset)) {
            let want = entry.pages_for(idx, offset, end);
            all &= self.fill_pages(entry, idx, want, true, kept.as_deref_mut())?;
        }
        Ok(all)
    }

    /// Readahead: fills the absent chunks of `range` nobody else is filling, without waiting
    /// for the others (a reader that needs them waits; the readahead thread moves on).
    pub fn fill_ahead(&self, entry: &Arc<Entry>, range: Range<u64>) -> Result<bool, FillError> {
        self.fill_claimed(entry, range, false, None)
    }

    /// Readahead of several whole one-chunk files whose order is known (a prefetch list): the
    /// ones nobody is filling are claimed, their room reserved, and the source moves them as
    /// one batch ([`Source::read_batch`]); the others are left to their fillers. Returns how
    /// many it filled.
    pub fn fill_batch(&self, entries: &[Arc<Entry>]) -> usize {
        let mut fills: Vec<Fill> = Vec::new();
        for entry in entries {
            if entry.chunk_count() != 1 || entry.is_evicted() || !self.cache.takes_writes() {
                continue;
            }
            let mut fill = Fill {
                entry,
                cache: &self.cache,
                pending: entry.claim(0..1).mine,
                reserved: 0,
            };
            let size = entry.version.size;
            if fill.pending.is_empty() || !self.cache.reserve(entry, size) {
                continue;
            }
            fill.reserved = size;
            fills.push(fill);
        }
        if fills.is_empty() {
            return 0;
        }
        let pieces: Vec<Piece> = fills
            .iter()
            .map(|f| Piece {
                path: &f.entry.path,
                version: f.entry.version,
                len: f.entry.version.size,
            })
            .collect();
        let mut crcs: Vec<Option<u32>> = vec![None; fills.len()];
        let mut write_errors: Vec<Option<io::Error>> = (0..fills.len()).map(|_| None).collect();
        let entries: Vec<&Entry> = fills.iter().map(|f| f.entry).collect();
        let mut sink = |i: usize, off: u64, bytes: &[u8], crc: Option<u32>| {
            let entry = entries[i];
            if off != 0 || bytes.len() as u64 != entry.version.size {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a batch's file is not whole",
                ));
            }
            if let Err(e) = entry.write_at(0, bytes) {
                let stop = same_error(&e);
                write_errors[i] = Some(e);
                return Err(stop);
            }
            crcs[i] = Some(crc.unwrap_or_else(|| crc32c::crc32c(bytes)));
            Ok(())
        };
        let started = std::time::Instant::now();
        let results = self.source.read_batch(&pieces, &mut sink);
        let mut filled = 0;
        for (i, (fill, read)) in fills.iter_mut().zip(results).enumerate() {
            let entry = fill.entry;
            if let Some(e) = write_errors[i].take() {
                self.cache.fill_failed(entry, &e);
                continue;
            }
            let (Ok(origin), Some(crc)) = (read, crcs[i]) else {
                // Given back when `fill` is dropped: its next reader fills it.
                continue;
            };
            self.fetched(entry, origin, entry.version.size, started);
            fill.complete(0, crc);
            // Saved, and told to the publisher if it completed the copy.
            self.cache.filled(entry);
            if entry.is_complete() {
                filled += 1;
            }
        }
        filled
    }

    /// Fills the absent chunks of `range` nobody else is filling (waiting for the others if
    /// `wait`), copying the bytes of them that `kept` asks for as they are cached.
    fn fill_claimed(
        &self,
        entry: &Arc<Entry>,
        range: Range<u64>,
        wait: bool,
        mut kept: Option<&mut Kept>,
    ) -> Result<bool, FillError> {
        let claim = entry.claim(range.clone());
        let mut fill = Fill {
            entry,
            cache: &self.cache,
            pending: claim.mine.clone(),
            reserved: 0,
        };
        if !fill.pending.is_empty() {
            let bytes = fill.pending.iter().map(|&i| entry.chunk_len(i)).sum();
            // An entry that left the cache (or never had a data file) takes no more bytes, nor
            // does a cache whose file system just failed a write.
            if entry.is_evicted() || !self.cache.takes_writes() || !self.cache.reserve(entry, bytes)
            {
                return Ok(false);
            }
            fill.reserved = bytes;
            for run in runs(&claim.mine) {
                let offset = run.start * self.cache.chunk_size();
                let len: u64 = run.clone().map(|i| entry.chunk_len(i)).sum();
                let mut crcs: Vec<Option<u32>> = vec![None; (run.end - run.start) as usize];
                let mut write_error = None;
                let mut sink = |off: u64, bytes: &[u8], crc: Option<u32>| {
                    if let Err(e) = entry.write_at(off, bytes) {
                        let stop = same_error(&e);
                        write_error = Some(e);
                        return Err(stop);
                    }
                    if let Some(k) = kept.as_deref_mut() {
                        k.take(off, bytes);
                    }
                    record_crcs(entry, run.clone(), &mut crcs, off, bytes, crc)
                };
                let started = std::time::Instant::now();
                let span = tracing::debug_span!(
                    "fill",
                    path = %entry.path,
                    offset,
                    bytes = len,
                    source = tracing::field::Empty
                )
                .entered();
                let read =
                    self.source
                        .read_into(&entry.path, entry.version, offset, len, &mut sink);
                // The bytes came but the cache's file system did not take them (full whatever
                // the capacity says, over quota, read-only, failing): the read is served
                // uncached, the entry dropped with its partial bytes, then the claims given
                // back (so waiters find it gone and read uncached too).
                if let Some(e) = write_error {
                    self.cache.fill_failed(entry, &e);
                    return Ok(false);
                }
                let origin = read.map_err(FillError::Source)?;
                span.record("source", origin.name());
                drop(span);
                self.fetched(entry, origin, len, started);
                for (idx, crc) in run.zip(crcs) {
                    let crc = crc.ok_or(FillError::BadSource("skipped a chunk"))?;
                    fill.complete(idx, crc);
                }
            }
            self.cache.chunks_filled(entry, &claim.mine);
        }
        // Chunks a random read began: their absent pages only (the present ones stay).
        for &idx in &claim.partial {
            let all = entry.all_pages(idx);
            if !self.fill_pages(entry, idx, all, wait, kept.as_deref_mut())? {
                return Ok(false);
            }
        }
        // As in `fill_pages`: a background copy is waited for a moment only.
        if claim.others && wait && !entry.wait_fills(range)? {
            return Ok(false);
        }
        Ok(true)
    }

    /// Serves a read straight from the source, without caching (the cache is full).
    fn read_uncached(&self, entry: &Entry, offset: u64, end: u64) -> Result<ReadBytes, FillError> {
        let mut buf = vec![0; (end - offset) as usize];
        let origin = self
            .source
            .read_at(&entry.path, entry.version, offset, &mut buf)
            .map_err(FillError::Source)?;
        self.stats.uncached_reads.fetch_add(1, Ordering::Relaxed);
        self.count(entry, origin, buf.len() as u64);
        Ok(ReadBytes::Owned(buf))
    }

    /// Counts `bytes` of `entry` a fill fetched from `origin`, the fill having started at
    /// `started` (its latency).
    fn fetched(&self, entry: &Entry, origin: Origin, bytes: u64, started: std::time::Instant) {
        self.stats.latency.fill(origin.name(), started);
        self.count(entry, origin, bytes);
    }

    fn count(&self, entry: &Entry, origin: Origin, bytes: u64) {
        match origin {
            Origin::Peer => {
                if entry.mark_pulled() {
                    self.stats.peer_fetches.fetch_add(1, Ordering::Relaxed);
                }
                self.stats
                    .bytes_from_peers
                    .fetch_add(bytes, Ordering::Relaxed);
            }
            Origin::Backing => {
                if entry.mark_fetched() {
                    self.stats.backing_fetches.fetch_add(1, Ordering::Relaxed);
                }
                self.stats
                    .bytes_from_backing
                    .fetch_add(bytes, Ordering::Relaxed);
            }
        }
    }
}

/// The bytes `[offset, end)` of a read, copied from the pieces of a fill as they go by (in
/// order; a piece out of order or a range filled by someone else leaves them unwhole, and the
/// read then reads the cache).
struct Kept {
    offset: u64,
    end: u64,
    /// Bytes from `offset` copied so far.
    got: u64,
    buf: Option<Pooled>,
}

impl Kept {
    fn new(offset: u64, end: u64) -> Kept {
        Kept {
            offset,
            end,
            got: 0,
            buf: None,
        }
    }

    /// Copies what piece `bytes` (at file offset `off`) holds of the wanted range, if it
    /// continues what was copied so far.
    fn take(&mut self, off: u64, bytes: &[u8]) {
        let at = self.offset + self.got;
        let piece_end = off + bytes.len() as u64;
        if off > at || piece_end <= at || at >= self.end {
            return;
        }
        let until = piece_end.min(self.end);
        let len = (self.end - self.offset) as usize;
        let buf = self.buf.get_or_insert_with(|| Pooled::with_len(len));
        let (from, to) = ((at - off) as usize, (until - off) as usize);
        let dst = (at - self.offset) as usize;
        buf.bytes_mut()[dst..dst + (to - from)].copy_from_slice(&bytes[from..to]);
        self.got = until - self.offset;
    }

    /// The bytes, if every one of them was copied.
    fn whole(self) -> Option<ReadBytes> {
        let done = self.got == self.end - self.offset;
        self.buf.filter(|_| done).map(ReadBytes::Pooled)
    }
}

/// Chunks claimed by one filler. Whatever is not completed when it is dropped (an error, a
/// panic) is given back so waiting readers retry it, and its reservation is released.
struct Fill<'a> {
    entry: &'a Entry,
    cache: &'a Cache,
    pending: Vec<u64>,
    reserved: u64,
}

impl Fill<'_> {
    fn complete(&mut self, idx: u64, crc: u32) {
        self.pending.retain(|&i| i != idx);
        let len = self.entry.chunk_len(idx);
        self.reserved -= len;
        if !self.entry.complete(idx, crc) {
            // The entry left the cache while we filled it: nothing holds these bytes.
            self.cache.release(len);
        }
    }
}

impl Drop for Fill<'_> {
    fn drop(&mut self) {
        for &idx in &self.pending {
            self.entry.abandon(idx);
        }
        self.cache.release(self.reserved);
    }
}

/// Pages claimed by one filler in one chunk: given back if not completed (an error, a panic),
/// with their reservation.
struct PageFill<'a> {
    entry: &'a Entry,
    cache: &'a Cache,
    idx: u64,
    pending: PageMask,
    reserved: u64,
}

impl PageFill<'_> {
    fn complete(&mut self, pages: PageMask, crcs: &[u32; PAGES as usize]) {
        self.pending &= !pages;
        let len = self.entry.page_bytes(self.idx, pages);
        self.reserved -= len;
        if !self.entry.complete_pages(self.idx, pages, crcs) {
            // The entry left the cache while we filled it: nothing holds these bytes.
            self.cache.release(len);
        }
    }
}

impl Drop for PageFill<'_> {
    fn drop(&mut self) {
        if self.pending != 0 {
            self.entry.abandon_pages(self.idx, self.pending);
        }
        self.cache.release(self.reserved);
    }
}

/// Runs of contiguous pages in `pages` (a bit each), as page ranges.
fn page_runs(pages: PageMask) -> Vec<Range<u32>> {
    let mut out: Vec<Range<u32>> = Vec::new();
    for p in (0..PAGES as u32).filter(|p| pages & (1 << p) != 0) {
        match out.last_mut() {
            Some(r) if r.end == p => r.end += 1,
            _ => out.push(p..p + 1),
        }
    }
    out
}

/// Notes the crc32c of each chunk of `run` that the piece `bytes` at `off` covers (given when
/// the piece is one chunk whose crc the source checked, computed otherwise).
fn record_crcs(
    entry: &Entry,
    run: Range<u64>,
    crcs: &mut [Option<u32>],
    off: u64,
    bytes: &[u8],
    crc: Option<u32>,
) -> io::Result<()> {
    let not_whole = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a source piece is not whole chunks of the range",
        )
    };
    if !off.is_multiple_of(entry.chunk_size()) {
        return Err(not_whole());
    }
    let mut at = 0;
    for idx in off / entry.chunk_size().. {
        if at == bytes.len() {
            break;
        }
        let n = entry.chunk_len(idx) as usize;
        if !run.contains(&idx) || at + n > bytes.len() {
            return Err(not_whole());
        }
        crcs[(idx - run.start) as usize] = Some(match crc {
            Some(c) if n == bytes.len() => c,
            _ => crc32c::crc32c(&bytes[at..at + n]),
        });
        at += n;
    }
    Ok(())
}

/// Splits sorted chunk indices into contiguous runs, so each run is one source read.
fn runs(idx: &[u64]) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for &i in idx {
        match out.last_mut() {
            Some(r) if r.end == i => r.end += 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// An error like `e` (its errno, or its kind): what a sink that keeps `e` returns to its source.
fn same_error(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(errno) => io::Error::from_raw_os_error(errno),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

#[cfg(test)]
mod tests;
