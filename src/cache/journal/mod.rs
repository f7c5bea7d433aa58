//! The cache's headers live in one append-only log (`<ssd>/index.log`), not in a file per
//! entry: recording a new entry is one `write` to an open file instead of creating, writing and
//! renaming a second inode per cached file (which costs more than the data write for small
//! training samples). The last record for a path wins; dropping an entry appends a tombstone
//! before its data file is deleted. A torn record at the end (a crash mid-append) is ignored; a
//! corrupt one in the middle (a bad sector) is skipped, and reading resumes at the next byte
//! where a whole record with a valid checksum starts, so the entries after it are not lost. (A
//! skipped tombstone can only bring back an entry whose data file is checked before use.) The
//! log is rewritten with only the live headers at a start that finds a fifth of its records
//! dead or any of its bytes not a record, and whenever it has grown well past that size.
//!
//! Durability: neither the log nor the data files are fsynced. Everything cached is a copy of
//! the shared file system: after a power loss a header lost from the page cache only loses its
//! entry (refetched when read), and chunk bytes that did not reach the disk fail their crc32c
//! on first serve and are refetched. (Produced files, which exist only here, are synced when
//! the application calls fsync, as on a local file system.)
//!
//! Layout (little endian): magic `"DYADFSJ\0"` | format u32, then records `len u32 | kind u8 |
//! payload | crc32c(kind, payload) u32` with `len` counting kind, payload and crc; kind 1 = a
//! [`Header`](super::format::Header) (its own encoding), kind 2 = a dropped path (UTF-8), kind 3 =
//! a packed object: `segment u32 | page u32 |` its [`Header`](super::format::Header) (golden:
//! `fixtures/cache/packed-record-v1.bin`; see [`super::segments`]), kind 5 = the pages of one
//! partial chunk of a file whose header is in the log: `size u64 | mtime_ns i64 | chunk u32 | pages
//! u128 | crc32c u32 per page present | path_len u32 | path` (golden:
//! `fixtures/cache/pages-record-v2.bin`), so that a random reader's page fill appends tens of
//! bytes, not the file's whole header (which grows with the file and with its partial chunks). Kind
//! 4 was the same with `pages u32` when a page was a 32nd of a chunk: skipped whole (its pages are
//! refetched; its checksums cannot vouch for a 128th). Kind 6 = chunks a fill made present whole in
//! a file whose header is in the log: `size u64 | mtime_ns i64 | count u32 | (chunk u32 | crc32c
//! u32) per chunk | path_len u32 | path` (golden: `fixtures/cache/chunks-record-v1.bin`): a fill of
//! a file of thousands of chunks appends its chunks, not a header that grows with the file (a 16
//! GiB file read in order logged 320 MiB of headers, and the log grew with the square of a file's
//! size). A daemon older than a kind skips its records as corrupt: it forgets packed objects (its
//! sweep leaves their segments alone), the pages of kind 5 and the chunks of kind 6 (refetched when
//! read).

mod parallel;
mod record;
mod replay;
mod writer;

pub use parallel::{Batch, Replayed, replay_sharded};
pub use record::{MAGIC, Record};
pub use replay::decode;
pub use writer::Journal;

#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests;
#[cfg(test)]
mod tests;
