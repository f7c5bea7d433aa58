//! A record's bytes in the log: its kinds, its framing (`len | kind | payload | crc32c`), and
//! the record at the start of some bytes, if a whole valid one starts there.

use crate::cache::format::{Header, PartialRecord};
use crate::cache::segments::Place;
use crate::core::Version;

pub const MAGIC: &[u8; 8] = b"DYADFSJ\0";
pub(super) const PUT: u8 = 1;
const DROP: u8 = 2;
const PACKED: u8 = 3;
/// Pages of 32 per chunk (retired: skipped).
const PAGES_OF_32: u8 = 4;
const PAGES: u8 = 5;
const CHUNKS: u8 = 6;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Put(Header),
    /// An object packed in a segment (see [`crate::cache::segments`]).
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

pub(super) fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 9);
    out.extend_from_slice(&(payload.len() as u32 + 5).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[4..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out
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
pub(super) fn record_at(bytes: &[u8]) -> Option<(Option<Record>, usize)> {
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
