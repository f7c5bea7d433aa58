//! An entry's chunks filled: claims of whole chunks and of a large file's pages, their
//! completion and abandonment, the waits on other fillers, the bytes written, what is present,
//! and the records fills leave in the cache's header log (its whole header, or only the pages
//! or chunks a fill added since).

use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use super::marks::LOGGED;
use super::{Entry, ctime_print};
use crate::cache::chunks::{Chunk, Claim, FILL_WAIT, PAGES, PageClaim, PageMask};
use crate::cache::error::CacheError;
use crate::cache::files::Mode;
use crate::cache::format::{ChunkRecord, Header, PartialRecord};
use crate::cache::journal::Record;

/// How long a reader waits for a background copy's fill before it reads around it: a copy of
/// a healthy holder's batch takes milliseconds.
const COPY_WAIT: Duration = Duration::from_secs(1);

impl Entry {
    /// Claims every absent chunk of `range` for the caller to fill (partial ones are listed, to
    /// be completed page by page).
    pub fn claim(&self, range: Range<u64>) -> Claim {
        self.state.claim(range)
    }

    /// Claims the absent pages of `want` in chunk `idx` for the caller to fill.
    pub fn claim_pages(&self, idx: u64, want: PageMask) -> PageClaim {
        self.state.claim_pages(idx, want)
    }

    /// Marks claimed pages present with the checksums of the bytes just written (`crcs[p]` for
    /// page p); `false` if the entry left the cache meanwhile (the caller's reservation is void).
    pub fn complete_pages(&self, idx: u64, mine: PageMask, crcs: &[u32; PAGES as usize]) -> bool {
        let bytes = self.page_bytes(idx, mine);
        let kept = self
            .state
            .complete_pages(idx, mine, crcs, bytes, self.all_pages(idx), |p| {
                self.geometry().page_len(idx, p)
            });
        if kept {
            self.note_verified(None);
        }
        kept
    }

    /// Gives back claimed pages that could not be filled.
    pub fn abandon_pages(&self, idx: u64, mine: PageMask) {
        self.state.abandon_pages(idx, mine)
    }

    /// Waits (bounded) until no page of `want` in chunk `idx` is being filled by someone else:
    /// `Ok(false)` if a background copy still fills some after `COPY_WAIT` (read around it).
    pub fn wait_pages(&self, idx: u64, want: PageMask) -> Result<bool, CacheError> {
        self.wait_others(|limit| self.state.wait_pages(idx, want, limit))
    }

    /// Runs `wait` (which says whether the fills it waits for ended within the time it is
    /// given) for as long as a reader waits on others: [`FILL_WAIT`], or `COPY_WAIT` for a
    /// background copy, whose fills outlasting it are read around (`Ok(false)`).
    fn wait_others(&self, wait: impl FnOnce(Duration) -> bool) -> Result<bool, CacheError> {
        let copying = self.is_copying();
        match (wait(if copying { COPY_WAIT } else { FILL_WAIT }), copying) {
            (true, _) => Ok(true),
            (false, true) => Ok(false),
            (false, false) => Err(CacheError::FillTimeout(self.path.to_string())),
        }
    }

    /// Whether every byte of `[offset, end)` is present: its chunks whole or the pages it touches.
    pub fn bytes_present(&self, offset: u64, end: u64) -> bool {
        self.chunks_for(offset, end.saturating_sub(offset))
            .all(|idx| {
                self.state
                    .pages_present(idx, self.pages_for(idx, offset, end))
            })
    }

    /// Marks a claimed chunk present with the checksum of the bytes just written.
    /// Returns false if the entry left the cache meanwhile (the caller's reservation is void).
    /// The fill that completes the file remembers its data file as the writes left it (see
    /// [`Entry::is_verified`]).
    pub fn complete(&self, idx: u64, crc: u32) -> bool {
        let kept = self.state.complete(idx, crc, self.chunk_len(idx));
        if kept {
            self.note_verified(None);
        }
        kept
    }

    /// Gives back a claimed chunk that could not be filled; waiters retry it themselves.
    pub fn abandon(&self, idx: u64) {
        self.state.abandon(idx)
    }

    /// Waits (bounded) until no chunk of `range` is being filled by someone else: `Ok(false)`
    /// if a background copy (replication, [`Entry::set_copying`]) still fills some after
    /// `COPY_WAIT`: the reader reads around it instead, as the copy may be waiting out a
    /// frozen holder's timeout, at the lowest priority.
    pub fn wait_fills(&self, range: Range<u64>) -> Result<bool, CacheError> {
        self.wait_others(|limit| self.state.wait_fills(range, limit))
    }

    pub fn all_present(&self, range: Range<u64>) -> bool {
        self.state.all_present(range)
    }

    pub fn is_complete(&self) -> bool {
        self.all_present(0..self.chunk_count())
    }

    /// Writes chunk bytes at their offset in the data file (in its region of a segment, if
    /// packed: never past it).
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        if self.packed() && offset + bytes.len() as u64 > self.version.size {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let file = self.file(Mode::ReadWrite)?;
        if !self.has_guard() {
            return file.write_all_at(bytes, self.base() + offset);
        }
        // A file of many chunks is guarded by its print (see `Entry::guard_partial`): this
        // write moves its ctime, not someone else. No other write to it may come between the
        // prints around this one: its move would be taken for a change behind the daemon,
        // and every chunk checked again.
        let _alone = self.shared.write_lock(self.id);
        let before = ctime_print(&file);
        file.write_all_at(bytes, self.base() + offset)?;
        self.wrote_own(before, ctime_print(&file));
        Ok(())
    }

    /// Whether some chunk is partly present (pages a random reader filled).
    pub fn has_pages(&self) -> bool {
        let st = self.state.lock();
        st.chunks
            .pages()
            .is_some_and(|p| p.values().any(|p| p.present() != 0))
    }

    /// Which pages are present, a word per 32 pages (every page of a present chunk), for words
    /// `from..` (at most `max`): what a peer asks before pulling pages of a copy that may be
    /// partial.
    pub fn held_pages(&self, from: u64, max: usize) -> Vec<u32> {
        const WORDS: u64 = PAGES / 32;
        let end = (self.chunk_count() * WORDS).min(from.saturating_add(max as u64));
        let st = self.state.lock();
        (from.min(end)..end)
            .map(|w| {
                let i = w / WORDS;
                let mask = match st.chunks[i as usize] {
                    Chunk::Present { .. } => self.all_pages(i),
                    Chunk::Partial => st.chunks.page_set(i).map_or(0, |p| p.present()),
                    _ => 0,
                };
                (mask >> (w % WORDS * 32)) as u32
            })
            .collect()
    }

    pub fn is_evicted(&self) -> bool {
        self.state.lock().evicted
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
        self.marks.mark(LOGGED);
        Ok(())
    }

    /// Records the pages of chunk `idx` a fill just completed: the chunk's pages alone while it
    /// is partial and the log holds a whole header of the entry (a page fill of a large file
    /// appends tens of bytes, not the header, which grows with the file and its partial
    /// chunks), else the whole header.
    pub fn persist_pages(&self, idx: u64) -> Result<(), CacheError> {
        if !self.marks.has(LOGGED) {
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
        if !self.marks.has(LOGGED) {
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
