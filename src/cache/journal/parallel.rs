//! The log read back on several threads: a restart with millions of entries was mostly the
//! records' checksums and decoding, on one core (1.3 s of 1.7 for a million samples).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::record::{Record, record_at};
use super::replay::{Window, decode_rest, opening};

/// Bytes of the log framed and decoded at a time (small in tests: their logs cross many).
const BATCH: usize = if cfg!(test) { 1 << 16 } else { 16 << 20 };

/// Records the careful reader hands over at a time.
const BATCH_RECORDS: usize = if cfg!(test) { 1000 } else { 1 << 16 };

/// What a replay read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    /// The log's length (0: missing, or not a log this release reads).
    pub bytes: u64,
    /// Whole records read (retired kinds included).
    pub records: u64,
    /// Bytes skipped: corrupt records, a torn tail.
    pub skipped: u64,
}

impl Replayed {
    /// Whether the log is whole records from end to end (new ones may be appended to it).
    pub fn whole(&self) -> bool {
        self.bytes > 0 && self.skipped == 0
    }
}

/// A batch of records as [`replay_sharded`] hands it over: `batch[s]` is shard `s`'s, in the
/// log's order, in parts (one per decoding thread).
pub type Batch<T> = Vec<Vec<Vec<T>>>;

/// Hands over the whole records of the log at `path` without holding them all nor the log's
/// bytes (it is read a batch at a time), their checksums, their decoding and `prepare` spread
/// over `threads` threads. `prepare` makes each record a `T` and names its shard (of
/// `shards`); `each` gets every batch's records by shard, each shard's in the log's order, so
/// that the shards can be filled at once (records that must be applied in order, those of one
/// file, share a shard). From the first batch where a record the lengths frame is not a valid
/// one (a bad sector, a torn tail), the rest of the log is read one record at a time by the
/// careful reader (`replay.rs`), resynchronising past what it must skip.
pub fn replay_sharded<T: Send>(
    path: &Path,
    threads: usize,
    shards: usize,
    prepare: impl Fn(Record) -> (usize, T) + Sync,
    mut each: impl FnMut(Batch<T>),
) -> io::Result<Replayed> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Replayed::default()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    // The whole log is asked of the disk at once, read while the first batches decode.
    // SAFETY: an advice on a descriptor we own; no memory is involved.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
    let mut log = Window::new(file, len);
    if !opening(&mut log)? {
        return Ok(Replayed::default());
    }
    let mut done = Replayed {
        bytes: len,
        ..Replayed::default()
    };
    loop {
        log.want(BATCH)?;
        let rest = log.rest();
        if rest.is_empty() {
            return Ok(done);
        }
        let spans = frame(rest);
        let Some(end) = spans.last().map(|s| s.end) else {
            // A record longer than a batch (a file of very many chunks) is read whole; what
            // is no whole record is left to the careful reader below.
            let whole = rest
                .get(..4)
                .map(|l| 4 + u64::from(u32::from_le_bytes(l.try_into().unwrap())));
            match whole {
                Some(n) if n <= log.left() => {
                    log.want(n as usize)?;
                    continue;
                }
                _ => break,
            }
        };
        let Some(batch) = decode(rest, &spans, threads, shards, &prepare) else {
            break;
        };
        done.records += spans.len() as u64;
        each(batch);
        log.consume(end);
    }
    // Handed over a batch at a time, so that a log read this way is never held whole.
    let mut tail: Vec<Vec<T>> = (0..shards).map(|_| Vec::new()).collect();
    let mut held = 0;
    let skipped = decode_rest(log, |record| {
        done.records += 1;
        if let Some(r) = record {
            let (shard, t) = prepare(r);
            tail[shard].push(t);
            held += 1;
        }
        if held == BATCH_RECORDS {
            held = 0;
            each(tail.iter_mut().map(|t| vec![std::mem::take(t)]).collect());
        }
    })?;
    each(tail.into_iter().map(|t| vec![t]).collect());
    if skipped > 0 {
        tracing::warn!(
            log = %path.display(),
            skipped,
            "skipped corrupt bytes in the cache's header log; the records after them are kept"
        );
    }
    done.skipped = skipped as u64;
    Ok(done)
}

/// The records `bytes` holds whole as their lengths say, from its start.
fn frame(bytes: &[u8]) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut at = 0;
    while let Some(len) = bytes.get(at..at + 4) {
        let end = at + 4 + u32::from_le_bytes(len.try_into().unwrap()) as usize;
        if end > bytes.len() {
            break;
        }
        spans.push(at..end);
        at = end;
    }
    spans
}

/// What `prepare` makes of the records at `spans` of `bytes`, by shard, in order, decoded on up
/// to `threads` threads; `None` if one is not a valid record.
fn decode<T: Send>(
    bytes: &[u8],
    spans: &[Range<usize>],
    threads: usize,
    shards: usize,
    prepare: &(impl Fn(Record) -> (usize, T) + Sync),
) -> Option<Batch<T>> {
    let per = spans.len().div_ceil(threads.max(1));
    let parts: Vec<Option<Vec<Vec<T>>>> = std::thread::scope(|s| {
        let workers: Vec<_> = spans
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    let mut out: Vec<Vec<T>> = (0..shards)
                        .map(|_| Vec::with_capacity(part.len() / shards + 1))
                        .collect();
                    for span in part {
                        let (record, _) = record_at(&bytes[span.clone()])?;
                        if let Some(r) = record {
                            let (shard, t) = prepare(r);
                            out[shard].push(t);
                        }
                    }
                    Some(out)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a log decoder panicked"))
            .collect()
    });
    let mut batch: Batch<T> = (0..shards).map(|_| Vec::new()).collect();
    for part in parts {
        for (shard, records) in part?.into_iter().enumerate() {
            batch[shard].push(records);
        }
    }
    Some(batch)
}
