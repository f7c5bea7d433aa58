//! The cache's headers live in one append-only log (`<ssd>/index.log`), not in a file per
//! entry: recording a new entry is one `write` to an open file instead of creating, writing and
//! renaming a second inode per cached file (which costs more than the data write for small
//! training samples). The last record for a path wins; dropping an entry appends a tombstone
//! before its data file is deleted. A torn record at the end (a crash mid-append) is ignored; a
//! corrupt one in the middle (a bad sector) is skipped, and reading resumes at the next byte
//! where a whole record with a valid checksum starts, so the entries after it are not lost. (A
//! skipped tombstone can only bring back an entry whose data file is checked before use.) The
//! log is rewritten with only the live headers at every start and whenever it has grown well
//! past that size.
//!
//! Durability: neither the log nor the data files are fsynced. Everything cached is a copy of
//! the shared file system: after a power loss a header lost from the page cache only loses its
//! entry (refetched when read), and chunk bytes that did not reach the disk fail their crc32c
//! on first serve and are refetched. (Produced files, which exist only here, are synced when
//! the application calls fsync, as on a local file system.)
//!
//! Layout (little endian): magic `"DYADFSJ\0"` | format u32, then records
//! `len u32 | kind u8 | payload | crc32c(kind, payload) u32` with `len` counting kind, payload
//! and crc; kind 1 = a [`Header`] (its own encoding), kind 2 = a dropped path (UTF-8), kind 3 =
//! a packed object: `segment u32 | page u32 |` its [`Header`] (golden:
//! `fixtures/cache/packed-record-v1.bin`; see [`super::segments`]), kind 5 = the pages of one
//! partial chunk of a file whose header is in the log: `size u64 | mtime_ns i64 | chunk u32 |
//! pages u128 | crc32c u32 per page present | path_len u32 | path` (golden:
//! `fixtures/cache/pages-record-v2.bin`), so that a random reader's page fill appends tens of
//! bytes, not the file's whole header (which grows with the file and with its partial chunks).
//! Kind 4 was the same with `pages u32` when a page was a 32nd of a chunk: skipped whole (its
//! pages are refetched; its checksums cannot vouch for a 128th). Kind 6 = chunks a fill made
//! present whole in a file whose header is in the log: `size u64 | mtime_ns i64 | count u32 |
//! (chunk u32 | crc32c u32) per chunk | path_len u32 | path` (golden:
//! `fixtures/cache/chunks-record-v1.bin`): a fill of a file of thousands of chunks appends its
//! chunks, not a header that grows with the file (a 16 GiB file read in order logged 320 MiB
//! of headers, and the log grew with the square of a file's size). A daemon older than a kind
//! skips its records as corrupt: it forgets packed objects (its sweep leaves their segments
//! alone), the pages of kind 5 and the chunks of kind 6 (refetched when read).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::CacheError;
use super::format::{FORMAT_V1, FORMAT_V2, FORMAT_VERSION, Header, PartialRecord};
use super::segments::Place;
use crate::core::Version;
use crate::core::sync::model::{Mutex, RwLock, lock};

pub const MAGIC: &[u8; 8] = b"DYADFSJ\0";
const PUT: u8 = 1;
const DROP: u8 = 2;
const PACKED: u8 = 3;
/// Pages of 32 per chunk (retired: skipped).
const PAGES_OF_32: u8 = 4;
const PAGES: u8 = 5;
const CHUNKS: u8 = 6;
/// The log is rewritten once it exceeds twice its size after the last rewrite plus this.
const SLACK: u64 = 16 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Put(Header),
    /// An object packed in a segment (see [`super::segments`]).
    Packed(Place, Header),
    Drop(String),
    /// The pages present now of one partial chunk of the file at `path`, `version`, whose
    /// header an earlier record holds (a header after it says all).
    Pages {
        path: String,
        version: Version,
        part: PartialRecord,
    },
    /// Chunks present whole now, with their crc32c, of the file at `path`, `version`, whose
    /// header an earlier record holds.
    Chunks {
        path: String,
        version: Version,
        chunks: Vec<(u32, u32)>,
    },
}

impl Record {
    /// The record's bytes in the log.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Record::Put(h) => encode(PUT, &h.encode()),
            Record::Packed(place, h) => {
                let mut payload = Vec::with_capacity(64 + h.path.len());
                payload.extend_from_slice(&place.segment.to_le_bytes());
                payload.extend_from_slice(&place.page.to_le_bytes());
                payload.extend_from_slice(&h.encode());
                encode(PACKED, &payload)
            }
            Record::Drop(path) => encode(DROP, path.as_bytes()),
            Record::Pages {
                path,
                version,
                part,
            } => encode(
                PAGES,
                &of_file(*version, path, |payload| {
                    payload.extend_from_slice(&part.chunk.to_le_bytes());
                    payload.extend_from_slice(&part.pages.to_le_bytes());
                    for crc in &part.crcs {
                        payload.extend_from_slice(&crc.to_le_bytes());
                    }
                }),
            ),
            Record::Chunks {
                path,
                version,
                chunks,
            } => encode(
                CHUNKS,
                &of_file(*version, path, |payload| {
                    payload.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
                    for (chunk, crc) in chunks {
                        payload.extend_from_slice(&chunk.to_le_bytes());
                        payload.extend_from_slice(&crc.to_le_bytes());
                    }
                }),
            ),
        }
    }
}

pub struct Journal {
    path: PathBuf,
    /// The open log. An append takes its place at the end under `log`, then writes there
    /// under this lock's read side, so that one append's `write` does not hold up the next
    /// one's (two readers storing samples met on the log's lock a quarter of the times a
    /// puller waited on a lock); a rewrite replaces the file under the write side, once no
    /// append is writing to the old one.
    file: RwLock<File>,
    log: Mutex<Log>,
    /// The log has grown past its rewrite size (asked at every new cache entry, without
    /// taking `log`).
    wants_rewrite: AtomicBool,
}

struct Log {
    /// The log's length, counting the places of appends still writing.
    len: u64,
    rewrite_at: u64,
    /// Growth allowed past twice the rewritten size ([`SLACK`]; smaller in tests).
    slack: u64,
}

fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 9);
    out.extend_from_slice(&(payload.len() as u32 + 5).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[4..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The whole records of the log at `path`; none if the file is missing or from another
/// format.
pub fn read(path: &Path) -> io::Result<Vec<Record>> {
    let mut out = Vec::new();
    replay(path, |r| out.push(r))?;
    Ok(out)
}

/// Hands each whole record of the log at `path` to `each`, in order, without holding them all
/// (a million headers would be hundreds of MiB at once) nor the log's bytes (71 MiB for a
/// million samples, held beside the headers replayed from them): it is read a window at a time.
pub fn replay(path: &Path, each: impl FnMut(Record)) -> io::Result<()> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let skipped = decode_each(Window::new(file, len), each)?;
    if skipped > 0 {
        tracing::warn!(
            log = %path.display(),
            skipped,
            "skipped corrupt bytes in the cache's header log; the records after them are kept"
        );
    }
    Ok(())
}

/// The whole records of a log's bytes (what [`replay`] reads).
pub fn decode(bytes: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    decode_each(Window::new(bytes, bytes.len() as u64), |r| out.push(r))
        .expect("reading a slice cannot fail");
    out
}

/// Hands each whole record to `each`; returns how many bytes it skipped (corrupt records, a
/// torn tail).
fn decode_each(mut log: Window<impl Read>, mut each: impl FnMut(Record)) -> io::Result<usize> {
    log.want(12)?;
    let start = log.rest();
    let version = start
        .get(8..12)
        .map(|v| u32::from_le_bytes(v.try_into().unwrap()));
    if start.len() < 12
        || &start[..8] != MAGIC
        || !matches!(version, Some(FORMAT_VERSION | FORMAT_V2 | FORMAT_V1))
    {
        return Ok(0);
    }
    log.consume(12);
    let mut skipped = 0;
    loop {
        log.want(4)?;
        let rest = log.rest();
        if rest.is_empty() {
            return Ok(skipped);
        }
        // The whole record the length claims, if the log holds that many bytes.
        if let Some(len) = rest.get(..4) {
            let len = u32::from_le_bytes(len.try_into().unwrap()) as u64;
            if 4 + len <= log.left() {
                log.want(4 + len as usize)?;
            }
        }
        match record_at(log.rest()) {
            Some((record, used)) => {
                record.map(&mut each);
                log.consume(used);
            }
            // Not a whole record here: resynchronise on the next byte where one starts (a
            // record's crc32c makes a false start about a 1-in-4-billion chance).
            None => {
                log.consume(1);
                skipped += 1;
            }
        }
    }
}

/// How much of the log is read at a time (a record longer than this is read whole).
const WINDOW: usize = 1 << 20;

/// The unconsumed bytes of a log of known length, read from `input` a window at a time.
struct Window<R> {
    input: R,
    buf: Vec<u8>,
    /// The first unconsumed byte of `buf`.
    at: usize,
    /// Bytes of the log not yet in `buf`.
    unread: u64,
}

impl<R: Read> Window<R> {
    fn new(input: R, len: u64) -> Window<R> {
        Window {
            input,
            buf: Vec::new(),
            at: 0,
            unread: len,
        }
    }

    fn rest(&self) -> &[u8] {
        &self.buf[self.at..]
    }

    /// Bytes of the log not consumed yet.
    fn left(&self) -> u64 {
        (self.buf.len() - self.at) as u64 + self.unread
    }

    fn consume(&mut self, n: usize) {
        self.at += n;
    }

    /// Makes `rest()` at least `n` bytes long, or all that is left of the log.
    fn want(&mut self, n: usize) -> io::Result<()> {
        if self.buf.len() - self.at >= n || self.unread == 0 {
            return Ok(());
        }
        self.buf.drain(..self.at);
        self.at = 0;
        let take = (n.max(WINDOW) - self.buf.len()).min(self.unread as usize);
        let old = self.buf.len();
        self.buf.resize(old + take, 0);
        let mut filled = old;
        while filled < self.buf.len() {
            match self.input.read(&mut self.buf[filled..]) {
                // The log is shorter than it was: what was read is all there is.
                Ok(0) => {
                    self.buf.truncate(filled);
                    self.unread = 0;
                    return Ok(());
                }
                Ok(k) => filled += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.unread -= take as u64;
        Ok(())
    }
}

/// The payload of a record about part of one file (kinds 5 and 6): `size u64 | mtime_ns i64 |`
/// what `body` writes `| path_len u32 | path`.
fn of_file(version: Version, path: &str, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut payload = Vec::with_capacity(64 + path.len());
    payload.extend_from_slice(&version.size.to_le_bytes());
    payload.extend_from_slice(&version.mtime_ns.to_le_bytes());
    body(&mut payload);
    payload.extend_from_slice(&(path.len() as u32).to_le_bytes());
    payload.extend_from_slice(path.as_bytes());
    payload
}

/// The little-endian u32 at `at` of `bytes`, if it holds one there.
fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The version a record of [`of_file`]'s shape starts with.
fn version_of(payload: &[u8]) -> Option<Version> {
    Some(Version {
        size: u64::from_le_bytes(payload.get(..8)?.try_into().ok()?),
        mtime_ns: i64::from_le_bytes(payload.get(8..16)?.try_into().ok()?),
    })
}

/// The path a record of [`of_file`]'s shape ends with, its length at `at`: only if it ends the
/// payload exactly.
fn path_at(payload: &[u8], at: usize) -> Option<String> {
    let len = u32_at(payload, at)? as usize;
    if payload.len() != at + 4 + len {
        return None;
    }
    String::from_utf8(payload[at + 4..].to_vec()).ok()
}

/// A kind 5 record's payload: a page set whose page count its crcs match.
fn pages_record(payload: &[u8]) -> Option<Record> {
    let version = version_of(payload)?;
    let chunk = u32_at(payload, 16)?;
    let pages = u128::from_le_bytes(payload.get(20..36)?.try_into().ok()?);
    if pages == 0 {
        return None;
    }
    let crcs: Vec<u32> = (0..pages.count_ones() as usize)
        .map(|i| u32_at(payload, 36 + 4 * i))
        .collect::<Option<_>>()?;
    Some(Record::Pages {
        path: path_at(payload, 36 + 4 * crcs.len())?,
        version,
        part: PartialRecord { chunk, pages, crcs },
    })
}

/// A kind 6 record's payload: at least one chunk, and the path's length matching the rest.
fn chunks_record(payload: &[u8]) -> Option<Record> {
    let version = version_of(payload)?;
    let count = u32_at(payload, 16)? as usize;
    if count == 0 || payload.len() < 20 + 8 * count {
        return None;
    }
    let chunks: Vec<(u32, u32)> = (0..count)
        .map(|i| Some((u32_at(payload, 20 + 8 * i)?, u32_at(payload, 24 + 8 * i)?)))
        .collect::<Option<_>>()?;
    Some(Record::Chunks {
        path: path_at(payload, 20 + 8 * count)?,
        version,
        chunks,
    })
}

/// The record at the start of `bytes` (`None` for one of a retired kind) and its length, if a
/// whole valid one starts there.
fn record_at(bytes: &[u8]) -> Option<(Option<Record>, usize)> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().unwrap()) as usize;
    if len < 5 || bytes.len() < 4 + len {
        return None;
    }
    let (body, crc) = bytes[4..4 + len].split_at(len - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return None;
    }
    let record = match body[0] {
        PUT => Header::decode(&body[1..]).ok().map(Record::Put),
        DROP => String::from_utf8(body[1..].to_vec()).ok().map(Record::Drop),
        PACKED if body.len() >= 9 => {
            let place = Place {
                segment: u32::from_le_bytes(body[1..5].try_into().unwrap()),
                page: u32::from_le_bytes(body[5..9].try_into().unwrap()),
            };
            Header::decode(&body[9..])
                .ok()
                .map(|h| Record::Packed(place, h))
        }
        PAGES => pages_record(&body[1..]),
        CHUNKS => chunks_record(&body[1..]),
        PAGES_OF_32 => return Some((None, 4 + len)),
        _ => None,
    }?;
    Some((Some(record), 4 + len))
}

impl Journal {
    /// Starts a fresh log at `path` holding `headers` (written aside, then renamed over the old
    /// log, so a crash leaves one or the other).
    pub fn create(
        path: &Path,
        headers: impl IntoIterator<Item = Record>,
    ) -> Result<Journal, CacheError> {
        let (file, log) = write_log(path, headers, SLACK)?;
        Ok(Journal {
            path: path.to_path_buf(),
            file: RwLock::new(file),
            log: Mutex::new(log),
            wants_rewrite: AtomicBool::new(false),
        })
    }

    /// Appends the header record `make` returns (`None`: the entry left the cache, record
    /// nothing). `make` runs under the log's lock, where the record takes its place, so an
    /// entry's records are appended in the order its states were taken, and a tombstone is
    /// never followed by a stale header.
    pub fn put(&self, make: impl FnOnce() -> Option<Record>) -> io::Result<()> {
        let file = self.file.read().unwrap_or_else(|e| e.into_inner());
        let (record, at) = {
            let mut log = lock(&self.log);
            let Some(record) = make() else { return Ok(()) };
            let record = record.encode();
            let at = self.place(&mut log, record.len());
            (record, at)
        };
        self.write_at(&file, &record, at)
    }

    /// Records that `path` left the cache (before its data file is deleted).
    pub fn drop_path(&self, path: &str) -> io::Result<()> {
        self.put(|| Some(Record::Drop(path.to_string())))
    }

    pub fn wants_rewrite(&self) -> bool {
        self.wants_rewrite.load(Ordering::Relaxed)
    }

    /// The offset where a record of `len` bytes goes: the log's end, which it moves past.
    fn place(&self, log: &mut Log, len: usize) -> u64 {
        let at = log.len;
        log.len += len as u64;
        if log.len > log.rewrite_at {
            self.wants_rewrite.store(true, Ordering::Relaxed);
        }
        at
    }

    /// Writes `record` at its place `at`. If that fails and no append took a place after it,
    /// the place is given back (a full disk does not grow the log's length); otherwise it
    /// stays a gap, skipped when the log is read like a torn record.
    fn write_at(&self, file: &File, record: &[u8], at: u64) -> io::Result<()> {
        let written = file.write_all_at(record, at);
        if written.is_err() {
            let mut log = lock(&self.log);
            if log.len == at + record.len() as u64 {
                log.len = at;
            }
        }
        written
    }

    /// Replaces the log by one holding only the headers `live` yields (nothing is appended to
    /// the old log meanwhile: appends wait for the log's file). They are written as they come:
    /// a million headers collected first were 40 MiB of small allocations, freed at once into
    /// one thread's heap, which held them (RSS) ever after.
    pub fn rewrite<I: IntoIterator<Item = Record>>(
        &self,
        live: impl FnOnce() -> I,
    ) -> Result<(), CacheError> {
        let mut file = self.file.write().unwrap_or_else(|e| e.into_inner());
        let mut log = lock(&self.log);
        self.wants_rewrite.store(false, Ordering::Relaxed);
        let slack = log.slack;
        match write_log(&self.path, live(), slack) {
            Ok((new_file, new)) => (*file, *log) = (new_file, new),
            Err(e) => {
                // Not tried again at every new entry (a full disk would be written over and
                // over): once the log has grown by the slack again.
                log.rewrite_at = log.len + slack;
                return Err(e);
            }
        }
        Ok(())
    }
}

/// Tests: rewrite once the log is `slack` bytes past twice its rewritten size.
#[cfg(test)]
impl Journal {
    pub fn set_slack(&self, slack: u64) {
        let mut log = lock(&self.log);
        log.slack = slack;
        log.rewrite_at = log.len + slack;
        self.wants_rewrite.store(false, Ordering::Relaxed);
    }

    pub fn bytes(&self) -> u64 {
        lock(&self.log).len
    }
}

fn write_log(
    path: &Path,
    headers: impl IntoIterator<Item = Record>,
    slack: u64,
) -> Result<(File, Log), CacheError> {
    let tmp = path.with_extension("log.tmp");
    let written = (|| -> io::Result<u64> {
        // Streamed: a million headers are tens of MiB, never held in memory at once.
        let mut out = io::BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        out.write_all(MAGIC)?;
        // The log's own framing has not changed since format 1: a release that reads only
        // format 1 reads it, skipping the records it cannot decode.
        out.write_all(&FORMAT_V1.to_le_bytes())?;
        let mut len = (MAGIC.len() + 4) as u64;
        for h in headers {
            let record = h.encode();
            out.write_all(&record)?;
            len += record.len() as u64;
        }
        out.into_inner().map_err(|e| e.into_error())?;
        fs::rename(&tmp, path)?;
        Ok(len)
    })();
    // A full disk keeps no half-written copy.
    let len = written.inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })?;
    // Not O_APPEND: appends write at the places they took (Linux's pwrite appends at the end
    // on such a file, whatever the offset).
    let file = OpenOptions::new().write(true).open(path)?;
    let log = Log {
        len,
        rewrite_at: 2 * len + slack,
        slack,
    };
    Ok((file, log))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Version;

    pub(super) fn header(path: &str, crc: u32) -> Header {
        Header {
            chunk_size: 1 << 20,
            version: Version {
                size: 10,
                mtime_ns: 7,
            },
            path: path.into(),
            chunks: vec![Some(crc)],
            partial: Vec::new(),
        }
    }

    #[test]
    fn records_come_back_in_order_a_torn_tail_is_ignored_and_a_corrupt_one_skipped() {
        let dir = std::env::temp_dir().join(format!("dyadfs-journal-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("index.log");
        let j = Journal::create(&path, [Record::Put(header("a", 1))]).unwrap();
        j.put(|| Some(Record::Put(header("b", 2)))).unwrap();
        j.put(|| None).unwrap();
        j.drop_path("a").unwrap();
        j.put(|| Some(Record::Put(header("b", 3)))).unwrap();
        let want = vec![
            Record::Put(header("a", 1)),
            Record::Put(header("b", 2)),
            Record::Drop("a".into()),
            Record::Put(header("b", 3)),
        ];
        assert_eq!(read(&path).unwrap(), want);
        // Every cut inside the last record (a crash mid-append) keeps exactly the others.
        let bytes = fs::read(&path).unwrap();
        let last = encode(PUT, &header("b", 3).encode()).len();
        for cut in 1..last {
            assert_eq!(decode(&bytes[..bytes.len() - cut]), want[..3]);
        }
        // A flipped byte in a record (in its length, its payload or its checksum) loses that
        // record only: the ones after it are found again.
        let first = encode(PUT, &header("a", 1).encode()).len();
        for at in [12, 12 + 2, 12 + 9, 12 + first - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x41;
            assert_eq!(decode(&bad), want[1..], "byte {at} flipped");
        }
        let second = 12 + first;
        let mut bad = bytes.clone();
        bad[second + 6] ^= 1;
        assert_eq!(
            decode(&bad),
            [want[0].clone(), want[2].clone(), want[3].clone()]
        );
        j.rewrite(|| vec![Record::Put(header("b", 3))]).unwrap();
        j.drop_path("b").unwrap();
        assert_eq!(
            read(&path).unwrap(),
            vec![Record::Put(header("b", 3)), Record::Drop("b".into())]
        );
        assert_eq!(read(&dir.join("missing")).unwrap(), vec![]);
        let _ = fs::remove_dir_all(dir);
    }

    /// Appends write outside the log's lock at the places they took, and rewrites come between
    /// them: every record reaches the log it was placed in, in the order they were made.
    #[test]
    fn appends_from_many_threads_and_rewrites_between_them_keep_every_record_in_order() {
        let dir = std::env::temp_dir().join(format!("dyadfs-journal-t-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("index.log");
        let j = Journal::create(&path, []).unwrap();
        j.set_slack(1024);
        // The latest record made of each path: what a rewrite keeps.
        let latest = Mutex::new(std::collections::BTreeMap::new());
        const EACH: u32 = 2000;
        std::thread::scope(|s| {
            for t in 0..4 {
                let (j, latest) = (&j, &latest);
                s.spawn(move || {
                    let name = format!("dir/t{t}");
                    for i in 1..=EACH {
                        j.put(|| {
                            let r = Record::Put(header(&name, i));
                            lock(latest).insert(name.clone(), r.clone());
                            Some(r)
                        })
                        .unwrap();
                        if j.wants_rewrite() {
                            j.rewrite(|| lock(latest).values().cloned().collect::<Vec<_>>())
                                .unwrap();
                        }
                    }
                });
            }
        });
        let mut seen = std::collections::BTreeMap::<String, Vec<u32>>::new();
        for r in read(&path).unwrap() {
            let Record::Put(h) = r else { panic!("{r:?}") };
            seen.entry(h.path).or_default().push(h.chunks[0].unwrap());
        }
        assert_eq!(seen.len(), 4);
        // The last rewrite kept each path's latest record, and every one made after it follows.
        for (name, crcs) in &seen {
            let first = crcs[0];
            assert_eq!(*crcs, (first..=EACH).collect::<Vec<_>>(), "{name}");
        }
        // It was rewritten along the way (else the test shows nothing about rewrites).
        let appended = 4 * EACH as u64 * Record::Put(header("dir/t0", 1)).encode().len() as u64;
        assert!(
            j.bytes() < appended / 4,
            "{} of {appended} bytes",
            j.bytes()
        );
        assert_eq!(fs::metadata(&path).unwrap().len(), j.bytes());
        let _ = fs::remove_dir_all(dir);
    }

    /// An append whose write fails gives its place back when it was the last one taken, so a
    /// full disk leaves no gap and does not grow the log's length.
    #[test]
    fn a_failed_append_gives_its_place_back() {
        let dir = std::env::temp_dir().join(format!("dyadfs-journal-f-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("index.log");
        let j = Journal::create(&path, [Record::Put(header("a", 1))]).unwrap();
        let before = j.bytes();
        // The log's file read-only: every write fails (EBADF), as on a full disk (ENOSPC).
        let writable = std::mem::replace(&mut *j.file.write().unwrap(), File::open(&path).unwrap());
        assert!(j.put(|| Some(Record::Put(header("b", 2)))).is_err());
        assert!(j.drop_path("a").is_err());
        assert_eq!(j.bytes(), before);
        *j.file.write().unwrap() = writable;
        j.put(|| Some(Record::Put(header("c", 3)))).unwrap();
        assert_eq!(
            read(&path).unwrap(),
            [Record::Put(header("a", 1)), Record::Put(header("c", 3))]
        );
        assert_eq!(fs::metadata(&path).unwrap().len(), j.bytes());
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn a_log_longer_than_the_window_is_replayed_whole_across_its_boundaries() {
        let dir = std::env::temp_dir().join(format!("dyadfs-journal-w-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("index.log");
        // Small records that straddle every window boundary, and one record longer than a
        // window (a file of 400,000 chunks).
        let mut want: Vec<Record> = (0..40_000)
            .map(|i| Record::Put(header(&format!("dir/{i:06}.bin"), i)))
            .collect();
        let mut big = header("big", 0);
        big.chunks = (0..400_000).map(Some).collect();
        want.insert(20_000, Record::Put(big));
        Journal::create(&path, want.clone()).unwrap();
        assert!(fs::metadata(&path).unwrap().len() > 3 * WINDOW as u64);
        assert_eq!(read(&path).unwrap(), want);
        // A corrupt byte just before the second window loses only its record.
        let mut bytes = fs::read(&path).unwrap();
        let (i, at) = want
            .iter()
            .scan(12usize, |at, r| {
                let start = *at;
                *at += r.encode().len();
                Some(start)
            })
            .enumerate()
            .find(|(_, start)| *start + 60 > WINDOW)
            .unwrap();
        bytes[at + 8] ^= 0x41;
        fs::write(&path, &bytes).unwrap();
        let mut lost = want.clone();
        lost.remove(i);
        assert_eq!(read(&path).unwrap(), lost);
        let _ = fs::remove_dir_all(dir);
    }

    fn packed() -> Record {
        Record::Packed(
            Place {
                segment: 0x0102_0304,
                page: 0x0a0b_0c0d,
            },
            header("train/00001.bin", 0xdead_beef),
        )
    }

    fn pages() -> Record {
        Record::Pages {
            path: "train/rows.h5".into(),
            version: Version {
                size: 5 << 30,
                mtime_ns: 1_700_000_000_123_456_789,
            },
            part: PartialRecord {
                chunk: 0x0102,
                pages: 1 << 100 | 0b0110,
                crcs: vec![0xdead_beef, 0x0bad_f00d, 0x1234_5678],
            },
        }
    }

    /// A log of format 1's framing (as this release starts one) holding `golden`, then `then`.
    fn log_of(golden: &[u8], then: &[Record]) -> Vec<u8> {
        let mut log = MAGIC.to_vec();
        log.extend_from_slice(&FORMAT_V1.to_le_bytes());
        log.extend_from_slice(golden);
        for r in then {
            log.extend_from_slice(&r.encode());
        }
        log
    }

    /// `record` encodes to `golden`, the bytes of `fixtures/cache/<name>` (rewritten from it
    /// first under DYADFS_REGENERATE_FIXTURES); in a log before a packed record, both read back;
    /// torn anywhere, it is never taken.
    fn golden_record(name: &str, golden: &[u8], record: Record) {
        if std::env::var_os("DYADFS_REGENERATE_FIXTURES").is_some() {
            let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/cache");
            fs::write(file.join(name), record.encode()).unwrap();
        }
        assert_eq!(
            record.encode(),
            golden,
            "the journal's record {name} changed: bump FORMAT_VERSION and regenerate the fixture"
        );
        assert_eq!(decode(&log_of(golden, &[packed()])), vec![record, packed()]);
        let log = log_of(golden, &[]);
        for cut in 1..golden.len() {
            assert_eq!(decode(&log[..log.len() - cut]), vec![]);
        }
    }

    #[test]
    fn pages_record_golden_bytes() {
        let golden = include_bytes!("../../fixtures/cache/pages-record-v2.bin");
        golden_record("pages-record-v2.bin", golden, pages());
        // A page count its crcs do not match is no record.
        let Record::Pages { mut part, .. } = pages() else {
            unreachable!()
        };
        part.pages |= 1;
        let bad = Record::Pages {
            path: "train/rows.h5".into(),
            version: Version {
                size: 1,
                mtime_ns: 1,
            },
            part,
        };
        assert_eq!(decode(&log_of(&bad.encode(), &[])), vec![]);
    }

    /// The pages record of 32 pages per chunk (kind 4) is skipped whole, and what follows it
    /// read: its checksums cannot vouch for this release's smaller pages.
    #[test]
    fn a_retired_pages_record_is_skipped_whole() {
        let mut log = MAGIC.to_vec();
        log.extend_from_slice(&FORMAT_V1.to_le_bytes());
        log.extend_from_slice(include_bytes!("../../fixtures/cache/pages-record-v1.bin"));
        log.extend_from_slice(&packed().encode());
        let mut n = 0;
        let skipped = decode_each(Window::new(&log[..], log.len() as u64), |r| {
            assert_eq!(r, packed());
            n += 1;
        })
        .unwrap();
        assert_eq!((n, skipped), (1, 0));
    }

    fn chunks() -> Record {
        Record::Chunks {
            path: "train/rows.h5".into(),
            version: Version {
                size: 5 << 30,
                mtime_ns: 1_700_000_000_123_456_789,
            },
            chunks: vec![(0x0102, 0xdead_beef), (0x0103, 0x0bad_f00d)],
        }
    }

    #[test]
    fn chunks_record_golden_bytes() {
        let golden = include_bytes!("../../fixtures/cache/chunks-record-v1.bin");
        golden_record("chunks-record-v1.bin", golden, chunks());
        // A count its pairs do not fill is no record.
        let mut body = golden[4..golden.len() - 4].to_vec();
        body[17..21].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(decode(&log_of(&encode(body[0], &body[1..]), &[])), vec![]);
    }

    #[test]
    fn packed_record_golden_bytes() {
        let golden = include_bytes!("../../fixtures/cache/packed-record-v1.bin");
        golden_record("packed-record-v1.bin", golden, packed());
        // Also in a log of the header format's number.
        let mut log = MAGIC.to_vec();
        log.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        log.extend_from_slice(golden);
        assert_eq!(decode(&log), vec![packed()]);
    }
}

/// Appends and a rewrite interleaved by shuttle's randomized scheduler (`cargo test --features
/// shuttle --lib cache::journal::shuttle_tests`; scripts/test.sh runs it): an append writes
/// outside the log's lock, and a rewrite must not replace the file between an append's place
/// and its write.
#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicU64;

    use shuttle::sync::Arc;
    use shuttle::thread;

    use super::tests::header;
    use super::*;

    #[test]
    fn a_rewrite_between_appends_loses_none_and_keeps_their_order() {
        static RUN: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir().join(format!("dyadfs-journal-s-{}", std::process::id()));
        const EACH: u32 = 3;
        shuttle::check_random(
            {
                let base = base.clone();
                move || {
                    let run = RUN.fetch_add(1, Ordering::Relaxed);
                    let dir = base.join(run.to_string());
                    fs::create_dir_all(&dir).unwrap();
                    let path = dir.join("index.log");
                    let j = Arc::new(Journal::create(&path, []).unwrap());
                    // What a rewrite keeps: the latest record made of each path.
                    let latest = Arc::new(Mutex::new(BTreeMap::new()));
                    let mut threads: Vec<_> = (0..2)
                        .map(|t| {
                            let (j, latest) = (j.clone(), latest.clone());
                            thread::spawn(move || {
                                let name = format!("t{t}");
                                for i in 1..=EACH {
                                    j.put(|| {
                                        let r = Record::Put(header(&name, i));
                                        lock(&latest).insert(name.clone(), r.clone());
                                        Some(r)
                                    })
                                    .unwrap();
                                }
                            })
                        })
                        .collect();
                    threads.push({
                        let (j, latest) = (j.clone(), latest.clone());
                        thread::spawn(move || {
                            j.rewrite(|| lock(&latest).values().cloned().collect::<Vec<_>>())
                                .unwrap();
                        })
                    });
                    for t in threads {
                        t.join().unwrap();
                    }
                    let mut seen = BTreeMap::<String, Vec<u32>>::new();
                    for r in read(&path).unwrap() {
                        let Record::Put(h) = r else { panic!("{r:?}") };
                        seen.entry(h.path).or_default().push(h.chunks[0].unwrap());
                    }
                    // Each path's record kept by the rewrite (if it had one then), and all after it.
                    for t in ["t0", "t1"] {
                        let got = seen.get(t).cloned().unwrap_or_default();
                        let first = got.first().copied().unwrap_or(0);
                        assert_eq!(got, (first.max(1)..=EACH).collect::<Vec<_>>(), "{t}");
                    }
                    fs::remove_dir_all(&dir).unwrap();
                }
            },
            1000,
        );
        let _ = fs::remove_dir_all(base);
    }
}
