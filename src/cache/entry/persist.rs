//! An entry's records in the cache's header log: its whole header, or only the pages or chunks a
//! fill added since.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Entry, LOGGED};
use crate::cache::chunks::Chunk;
use crate::cache::error::CacheError;
use crate::cache::files::Mode;
use crate::cache::format::{ChunkRecord, Header, PartialRecord};
use crate::cache::journal::Record;

impl Entry {
    /// The data file, for the kernel to read directly (passthrough): the kernel keeps its own
    /// reference, so the descriptor may close once the open is answered.
    pub fn data_file(&self) -> io::Result<Arc<File>> {
        if self.packed() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.file(Mode::ReadWrite)
    }

    /// The record of this entry's present chunks (and place); `None` once it left the cache.
    pub(in crate::cache) fn record(&self) -> Option<Record> {
        let st = self.state.lock();
        if st.evicted {
            return None;
        }
        let header = Header {
            chunk_size: self.shared.chunk_size as u32,
            version: self.version,
            path: self.path.to_string(),
            chunks: st
                .chunks
                .iter()
                .map(|c| match c {
                    Chunk::Present { crc, .. } => Some(*crc),
                    _ => None,
                })
                .collect::<Vec<ChunkRecord>>(),
            partial: st.chunks.partial_records(),
        };
        Some(match self.place() {
            Some(place) => Record::Packed(place, header),
            None => Record::Put(header),
        })
    }

    /// Records the present chunks in the cache's log, unless the entry left the cache.
    pub fn persist(&self) -> Result<(), CacheError> {
        self.shared.journal.put(|| self.record())?;
        self.mark(LOGGED);
        Ok(())
    }

    /// Records the pages of chunk `idx` a fill just completed: the chunk's pages alone while it
    /// is partial and the log holds a whole header of the entry (a page fill of a large file
    /// appends tens of bytes, not the header, which grows with the file and its partial
    /// chunks), else the whole header.
    pub fn persist_pages(&self, idx: u64) -> Result<(), CacheError> {
        if self.pins_marks.load(Ordering::Relaxed) & LOGGED == 0 {
            return self.persist();
        }
        let mut whole = false;
        self.shared.journal.put(|| {
            let st = self.state.lock();
            if st.evicted {
                return None;
            }
            let part = match (st.chunks[idx as usize], st.chunks.page_set(idx)) {
                (Chunk::Partial, Some(p)) if p.present() != 0 => PartialRecord {
                    chunk: idx as u32,
                    pages: p.present(),
                    crcs: p.crcs().to_vec(),
                },
                // Present whole now (or dropped): the header says so.
                _ => {
                    whole = true;
                    return None;
                }
            };
            Some(Record::Pages {
                path: self.path.to_string(),
                version: self.version,
                part,
            })
        })?;
        if whole {
            return self.persist_chunks(&[idx]);
        }
        Ok(())
    }

    /// Records chunks a fill just made present whole: those chunks alone once the log holds a
    /// whole header of the entry (a header grows with the file: rewriting it for each fill of
    /// a file of thousands of chunks made the log grow with the square of its size), else the
    /// whole header.
    pub fn persist_chunks(&self, chunks: &[u64]) -> Result<(), CacheError> {
        if self.pins_marks.load(Ordering::Relaxed) & LOGGED == 0 {
            return self.persist();
        }
        self.shared.journal.put(|| {
            let st = self.state.lock();
            if st.evicted {
                return None;
            }
            let present: Vec<(u32, u32)> = chunks
                .iter()
                .filter_map(|&i| match st.chunks[i as usize] {
                    Chunk::Present { crc, .. } => Some((i as u32, crc)),
                    _ => None,
                })
                .collect();
            (!present.is_empty()).then(|| Record::Chunks {
                path: self.path.to_string(),
                version: self.version,
                chunks: present,
            })
        })?;
        Ok(())
    }
}
