//! The log read back by the careful reader: its records handed over in order, a window of its
//! bytes at a time, corrupt ones skipped and a torn tail ignored. A restart reads through
//! [`super::replay_sharded`], which hands the rest of a log to this reader from its first record
//! that is not whole and valid.

use std::io::{self, Read};

use super::record::{MAGIC, Record, record_at};
use crate::cache::format::{FORMAT_V1, FORMAT_V2, FORMAT_VERSION};

/// The whole records of the log at `path`, read by the careful reader alone, a window at a
/// time (the tests' measure of [`super::replay_sharded`]); none if the file is missing or from
/// another format.
#[cfg(test)]
pub(super) fn read(path: &std::path::Path) -> io::Result<Vec<Record>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let mut out = Vec::new();
    decode_each(Window::new(file, len), |r| out.push(r))?;
    Ok(out)
}

/// The whole records of a log's bytes, read by the careful reader alone.
pub fn decode(bytes: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    decode_each(Window::new(bytes, bytes.len() as u64), |r| out.push(r))
        .expect("reading a slice cannot fail");
    out
}

/// Hands each whole record to `each`; returns how many bytes it skipped (corrupt records, a
/// torn tail).
pub(super) fn decode_each(
    mut log: Window<impl Read>,
    mut each: impl FnMut(Record),
) -> io::Result<usize> {
    if !opening(&mut log)? {
        return Ok(0);
    }
    decode_rest(log, |record| {
        if let Some(r) = record {
            each(r);
        }
    })
}

/// Reads the log's magic and format, true if they are a log's this release reads.
pub(super) fn opening(log: &mut Window<impl Read>) -> io::Result<bool> {
    log.want(12)?;
    let start = log.rest();
    let version = start
        .get(8..12)
        .map(|v| u32::from_le_bytes(v.try_into().unwrap()));
    if start.len() < 12
        || &start[..8] != MAGIC
        || !matches!(version, Some(FORMAT_VERSION | FORMAT_V2 | FORMAT_V1))
    {
        return Ok(false);
    }
    log.consume(12);
    Ok(true)
}

/// [`decode_each`] past the log's opening, handing over every whole record (`None`: one of a
/// retired kind).
pub(super) fn decode_rest(
    mut log: Window<impl Read>,
    mut each: impl FnMut(Option<Record>),
) -> io::Result<usize> {
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
                each(record);
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
pub(super) const WINDOW: usize = 1 << 20;

/// The unconsumed bytes of a log of known length, read from `input` a window at a time.
pub(super) struct Window<R> {
    input: R,
    buf: Vec<u8>,
    /// The first unconsumed byte of `buf`.
    at: usize,
    /// Bytes of the log not yet in `buf`.
    unread: u64,
}

impl<R: Read> Window<R> {
    pub(super) fn new(input: R, len: u64) -> Window<R> {
        Window {
            input,
            buf: Vec::new(),
            at: 0,
            unread: len,
        }
    }

    pub(super) fn rest(&self) -> &[u8] {
        &self.buf[self.at..]
    }

    /// Bytes of the log not consumed yet.
    pub(super) fn left(&self) -> u64 {
        (self.buf.len() - self.at) as u64 + self.unread
    }

    pub(super) fn consume(&mut self, n: usize) {
        self.at += n;
    }

    /// Makes `rest()` at least `n` bytes long, or all that is left of the log.
    pub(super) fn want(&mut self, n: usize) -> io::Result<()> {
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
