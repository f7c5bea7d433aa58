//! An entry's chunks filled: claims of whole chunks and of a large file's pages, their
//! completion and abandonment, the waits on other fillers, the verification of what is present,
//! and the bytes written.

use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use super::{Entry, all_verified, ctime_print};
use crate::cache::chunks::{Claim, FILL_WAIT, PAGES, PageClaim, PageMask};
use crate::cache::error::CacheError;
use crate::cache::files::Mode;

impl Entry {
    /// Claims every absent chunk of `range` for the caller to fill (partial ones are listed, to
    /// be completed page by page).
    pub fn claim(&self, range: Range<u64>) -> Claim {
        self.state.claim(range)
    }

    /// The length of a page (a chunk's last page may be shorter): a 128th of a chunk.
    pub fn page_size(&self) -> u64 {
        self.shared.chunk_size / PAGES
    }

    fn page_len(&self, idx: u64, page: u32) -> u64 {
        let start = u64::from(page) * self.page_size();
        self.page_size()
            .min(self.chunk_len(idx).saturating_sub(start))
    }

    /// The pages chunk `idx` has (a bit each).
    pub fn all_pages(&self, idx: u64) -> PageMask {
        let n = self.chunk_len(idx).div_ceil(self.page_size());
        if n >= PAGES {
            PageMask::MAX
        } else {
            (1 << n) - 1
        }
    }

    /// The pages of chunk `idx` that bytes `[offset, end)` touch.
    pub fn pages_for(&self, idx: u64, offset: u64, end: u64) -> PageMask {
        let start = idx * self.shared.chunk_size;
        let (from, to) = (offset.max(start), end.min(start + self.chunk_len(idx)));
        if from >= to {
            return 0;
        }
        let (first, last) = (
            (from - start) / self.page_size(),
            (to - 1 - start) / self.page_size(),
        );
        (first..=last).fold(0, |m, p| m | (1 << p))
    }

    /// The bytes of pages `pages` of chunk `idx`.
    pub fn page_bytes(&self, idx: u64, pages: PageMask) -> u64 {
        (0..PAGES as u32)
            .filter(|p| pages & (1 << p) != 0)
            .map(|p| self.page_len(idx, p))
            .sum()
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
                self.page_len(idx, p)
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

    /// Waits (bounded) until no page of `want` in chunk `idx` is being filled by someone else.
    pub fn wait_pages(&self, idx: u64, want: PageMask) -> Result<(), CacheError> {
        if self.state.wait_pages(idx, want, FILL_WAIT) {
            Ok(())
        } else {
            Err(CacheError::FillTimeout(self.path.to_string()))
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

    /// Waits (bounded) until no chunk of `range` is being filled by someone else.
    pub fn wait_fills(&self, range: Range<u64>) -> Result<(), CacheError> {
        if self.state.wait_fills(range, FILL_WAIT) {
            Ok(())
        } else {
            Err(CacheError::FillTimeout(self.path.to_string()))
        }
    }

    pub fn all_present(&self, range: Range<u64>) -> bool {
        self.state.all_present(range)
    }

    pub fn is_complete(&self) -> bool {
        self.all_present(0..self.chunk_count())
    }

    /// Whether every chunk is present and verified in this daemon's lifetime, and the data file
    /// has not changed since (its ctime: any write, truncate or chmod by another process moves
    /// it). A changed file's chunks are marked unverified again, to be checked before use.
    /// A packed file's segment changes with every append to it too: its chunk is checked again
    /// once after one.
    pub fn is_verified(&self) -> bool {
        let seen = {
            let st = self.state.lock();
            if !all_verified(&st) {
                return false;
            }
            st.verified_ctime
        };
        // The print was taken when the last chunk was verified or written (`note_verified`):
        // another ctime now means someone changed the file behind the daemon, checked again
        // before it is served. None taken (its file could not be looked at then) is no
        // promise either: the file as it is now may be changed already.
        if seen != 0 && self.ctime_print() == Some(seen) {
            return true;
        }
        if seen != 0 && !self.packed() {
            tracing::warn!(path = %self.path, "cache data file changed behind the daemon: rechecking");
        }
        let mut st = self.state.lock();
        st.chunks.unverify();
        st.verified_ctime = 0;
        false
    }

    /// Whether every chunk is verified with the data file's print taken, without looking at the
    /// file again: for the open whose own fill just wrote and verified every chunk (the print
    /// was taken after that write, a moment ago; asking the file again would only tell the same
    /// at the cost of a `statx`). Any later open asks [`Entry::is_verified`].
    pub fn is_verified_as_filled(&self) -> bool {
        let st = self.state.lock();
        st.verified_ctime != 0 && all_verified(&st)
    }

    /// A fingerprint of the data file's ctime (never 0), if the file can be opened.
    pub(in crate::cache) fn ctime_print(&self) -> Option<u32> {
        ctime_print(&*self.file(Mode::ReadWrite).ok()?)
    }

    /// Remembers the data file's ctime (`before`: taken before the bytes just verified were
    /// read; else now, after the fill that wrote them) once every chunk is verified and none is
    /// remembered: an open that finds another one checks the file again ([`Entry::is_verified`]).
    /// Every way a chunk becomes verified ends here, so that the print is never first taken at
    /// an open, after a change it would then hide.
    pub(in crate::cache) fn note_verified(&self, before: Option<u32>) {
        {
            let st = self.state.lock();
            if st.verified_ctime != 0 || st.present_bytes != self.version.size || !all_verified(&st)
            {
                return;
            }
        }
        let print = before.or_else(|| self.ctime_print());
        let mut st = self.state.lock();
        if st.verified_ctime == 0 && all_verified(&st) {
            st.verified_ctime = print.unwrap_or(0);
        }
    }

    /// Writes chunk bytes at their offset in the data file (in its region of a segment, if
    /// packed: never past it).
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        if self.packed() && offset + bytes.len() as u64 > self.version.size {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let file = self.file(Mode::ReadWrite)?;
        // A partly cached file under guard: this write moves its ctime, not someone else.
        let before = self.guarded().then(|| ctime_print(&file)).flatten();
        file.write_all_at(bytes, self.base() + offset)?;
        if let Some(before) = before {
            self.wrote_own(before, ctime_print(&file));
        }
        Ok(())
    }
}
