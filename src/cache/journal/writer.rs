//! The log's writer: appends that take their place under a lock and write outside it, and the
//! rewrite (compaction) that replaces the log by one holding only the live headers.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::record::{MAGIC, Record};
use crate::cache::error::CacheError;
use crate::cache::format::FORMAT_V1;
use crate::core::sync::model::{Mutex, RwLock, lock};

/// The log is rewritten once it exceeds twice its size after the last rewrite plus this.
const SLACK: u64 = 16 << 20;

pub struct Journal {
    path: PathBuf,
    /// The open log. An append takes its place at the end under `log`, then writes there
    /// under this lock's read side, so that one append's `write` does not hold up the next
    /// one's (two readers storing samples met on the log's lock a quarter of the times a
    /// puller waited on a lock); a rewrite replaces the file under the write side, once no
    /// append is writing to the old one.
    pub(super) file: RwLock<File>,
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

    /// Opens the log at `path`, `len` bytes of whole records, to append to it as it is.
    pub fn append_to(path: &Path, len: u64) -> Result<Journal, CacheError> {
        // Not O_APPEND: see `write_log`. Cut to `len` in case it grew since it was read.
        let file = OpenOptions::new().write(true).open(path)?;
        file.set_len(len)?;
        Ok(Journal {
            path: path.to_path_buf(),
            file: RwLock::new(file),
            log: Mutex::new(Log {
                len,
                rewrite_at: 2 * len + SLACK,
                slack: SLACK,
            }),
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
