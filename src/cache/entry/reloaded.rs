//! A logged header as loading replays it, and the entry it becomes.

use std::sync::Arc;

use super::Entry;
use super::geometry::Geometry;
use super::marks::LOGGED;
use crate::cache::chunks::{Chunk, Chunks, PAGES, PageMask};
use crate::cache::error::CacheError;
use crate::cache::format::{Header, PartialRecord};
use crate::cache::journal::Record;
use crate::cache::segments::Place;
use crate::cache::shared::Shared;
use crate::core::Version;

/// A logged header as loading replays it: the path as the entry will hold it and the chunks in
/// the entry's form (inline when one), so that a million reloaded entries leave no freed chunk
/// list between them on the heap (RSS kept those, about 40 bytes an entry).
pub(in crate::cache) struct Reloaded {
    pub(in crate::cache) path: Box<str>,
    /// Where it lives, if packed.
    pub(in crate::cache) place: Option<Place>,
    version: Version,
    chunk_size: u32,
    /// Present as logged but unverified, or absent.
    chunks: Chunks,
}

impl From<Header> for Reloaded {
    fn from(h: Header) -> Reloaded {
        let chunks: Vec<Chunk> = h
            .chunks
            .iter()
            .map(|c| match c {
                Some(crc) => Chunk::Present {
                    crc: *crc,
                    verified: false,
                },
                None => Chunk::Absent,
            })
            .collect();
        Reloaded {
            path: h.path.into_boxed_str(),
            place: None,
            version: h.version,
            chunk_size: h.chunk_size,
            chunks: Chunks::with_partial(chunks.into(), &h.partial),
        }
    }
}

impl Reloaded {
    /// Sets the pages of partial chunk `part.chunk` as a later record logged them, unless the
    /// header says the chunk is present whole (or has no such chunk).
    pub(in crate::cache) fn set_pages(&mut self, part: PartialRecord) {
        let idx = part.chunk as usize;
        if idx >= self.chunks.len() || matches!(self.chunks[idx], Chunk::Present { .. }) {
            return;
        }
        let chunks = std::mem::replace(&mut self.chunks, Chunks::One([Chunk::Absent]));
        self.chunks = Chunks::with_partial(chunks, &[part]);
    }

    /// Marks chunks present whole as a later record logged them (`(chunk, crc)`), their pages
    /// if any forgotten; chunks the file does not have are ignored.
    pub(in crate::cache) fn set_chunks(&mut self, chunks: &[(u32, u32)]) {
        for &(idx, crc) in chunks {
            let i = idx as usize;
            if i < self.chunks.len() {
                self.chunks.drop_pages(u64::from(idx));
                self.chunks[i] = Chunk::Present {
                    crc,
                    verified: false,
                };
            }
        }
    }

    /// A packed object's logged header.
    pub(in crate::cache) fn packed(place: Place, h: Header) -> Reloaded {
        Reloaded {
            place: Some(place),
            ..Reloaded::from(h)
        }
    }

    pub(in crate::cache) fn size(&self) -> u64 {
        self.version.size
    }

    pub(in crate::cache) fn version(&self) -> Version {
        self.version
    }

    /// Whether it fits a cache of `chunk_size` chunks.
    pub(in crate::cache) fn check(&self, chunk_size: u64) -> Result<(), CacheError> {
        if u64::from(self.chunk_size) != chunk_size {
            return Err(CacheError::Corrupt(format!(
                "chunk size {} differs from the configured {chunk_size}",
                self.chunk_size
            )));
        }
        if self.chunks.len() as u64 != self.version.size.div_ceil(chunk_size) {
            return Err(CacheError::Corrupt(
                "chunk count does not match size".into(),
            ));
        }
        if self.place.is_some() && self.chunks.len() != 1 {
            return Err(CacheError::Corrupt("a packed object is one chunk".into()));
        }
        // Pages only where the chunk has them (its last chunk may have fewer).
        let page = chunk_size / PAGES;
        for (&idx, p) in self.chunks.pages().into_iter().flatten() {
            let len = Geometry::new(self.version.size, chunk_size).chunk_len(u64::from(idx));
            if u64::from(PageMask::BITS - p.present().leading_zeros()) > len.div_ceil(page) {
                return Err(CacheError::Corrupt("a page past its chunk".into()));
            }
        }
        Ok(())
    }

    /// The record it was read from (the log is rewritten from these).
    pub(in crate::cache) fn record(&self) -> Record {
        let header = Header {
            chunk_size: self.chunk_size,
            version: self.version,
            path: self.path.to_string(),
            chunks: self
                .chunks
                .iter()
                .map(|c| match c {
                    Chunk::Present { crc, .. } => Some(*crc),
                    _ => None,
                })
                .collect(),
            partial: self.chunks.partial_records(),
        };
        match self.place {
            Some(place) => Record::Packed(place, header),
            None => Record::Put(header),
        }
    }

    /// The entry, its data file unchecked until first opened (a packed object's segment was
    /// checked at load); `id` is used unless it is packed (its place is its id).
    pub(in crate::cache) fn into_entry(self, id: u64, shared: Arc<Shared>) -> Entry {
        let id = self.place.map_or(id, Place::id);
        let packed = self.place.is_some();
        let entry = Entry::new(self.path, self.version, id, shared, self.chunks, 0);
        entry.state.lock().unchecked = !packed;
        // The log is rewritten from the headers loaded: this one's is in it.
        entry.marks.mark(LOGGED);
        entry
    }
}
