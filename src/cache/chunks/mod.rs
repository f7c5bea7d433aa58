//! The chunks' state machine of one cached file: Absent -> Filling (claimed by one filler:
//! single flight) -> Present, and back to Absent when a filler gives up or the entry left the
//! cache. A chunk of a large file read at random is filled a page at a time instead: Absent ->
//! Partial (its pages each absent, being filled by one filler, or present with their own
//! checksums) -> Present once its last page lands; a whole-chunk fill (readahead) that finds it
//! partial fills its absent pages, never the present ones again.
//! Readers that find a chunk or page being filled wait for it (bounded). The lock and condition
//! variable come from [`crate::core::sync::model`], so `--features shuttle` explores the
//! interleavings of claims, fills and waits (tests below).
//!
//! Its parts: one chunk's state and a file's list of them (`chunk`), a partial chunk's pages
//! (`pages`), and the list behind its lock with the claims, completions and waits made on it
//! (`states`).

mod chunk;
mod pages;
mod states;

pub use super::format::PageMask;
pub(super) use chunk::{Chunk, Chunks};
pub use pages::PAGES;
pub(super) use pages::PageTables;
pub(super) use states::{ChunkStates, FILL_WAIT, State};
pub use states::{Claim, PageClaim};

#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests;
