//! An entry's chunks checked against their checksums: what fails is dropped (its bytes released
//! to the cache, the failure counted) and refetched by its next reader.

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use super::Cache;
use super::chunks::{Chunk, PAGES};
use super::entry::{Entry, ctime_print};
use super::error::CacheError;
use super::files::Mode;

impl Entry {
    /// Verifies every present chunk of `range` not yet verified in this daemon's lifetime.
    /// A chunk whose bytes do not match its checksum is dropped (its bytes released) so the
    /// caller refetches it. Returns whether the whole range is present and verified.
    /// Checks the present chunks of `range` against their checksums again, even those already
    /// verified (a scrub, or a peer that received a chunk that failed its checksum); drops the
    /// bad ones (they are refetched when next read). Returns (chunks checked, chunks dropped).
    pub fn recheck(&self, cache: &Cache, range: Range<u64>) -> Result<(u64, u64), CacheError> {
        let mut checked = 0;
        {
            let mut st = self.state.lock();
            for idx in range.clone() {
                if let Chunk::Present { crc, .. } = st.chunks[idx as usize] {
                    st.chunks[idx as usize] = Chunk::Present {
                        crc,
                        verified: false,
                    };
                    checked += 1;
                }
            }
        }
        let before = cache.stats.checksum_failures.load(Ordering::Relaxed);
        self.verify(cache, range)?;
        let dropped = cache.stats.checksum_failures.load(Ordering::Relaxed) - before;
        Ok((checked, dropped.min(checked)))
    }

    pub fn verify(&self, cache: &Cache, range: Range<u64>) -> Result<bool, CacheError> {
        let mut all_good = true;
        let mut dropped = false;
        let mut buf = Vec::new();
        let mut data = None;
        // The file's print before its bytes are read: a change while they are read moves it.
        let mut before = None;
        for idx in range {
            let crc = match self.state.lock().chunks[idx as usize] {
                Chunk::Present { verified: true, .. } => continue,
                Chunk::Present {
                    crc,
                    verified: false,
                } => crc,
                _ => {
                    all_good = false;
                    continue;
                }
            };
            let len = self.chunk_len(idx) as usize;
            buf.resize(len, 0);
            if data.is_none() {
                let file = self.file(Mode::ReadWrite)?;
                before = ctime_print(&file);
                data = Some(file);
            }
            let data = data.as_ref().expect("opened above");
            data.read_exact_at(&mut buf, self.base() + idx * self.shared.chunk_size)?;
            if !self.judge(cache, idx, crc, &buf) {
                all_good = false;
                dropped = true;
            }
        }
        // Only a dropped chunk changes the header: an absent one (another reader's fill gave
        // up) is no reason to append to the log, which may be on a full disk.
        if dropped {
            self.persist_or_report(cache);
        }
        // Every chunk verified now: remember the file as it was read (see `is_verified`).
        if all_good {
            self.note_verified(before);
        }
        Ok(all_good)
    }

    /// Whether every byte of `[offset, end)` is present and verified: its whole chunks as
    /// [`Entry::verify`] checks them, and in partial chunks the pages it touches, each against
    /// its own checksum (a page that fails is dropped alone, refetched by its next reader).
    pub fn verify_bytes(&self, cache: &Cache, offset: u64, end: u64) -> Result<bool, CacheError> {
        let mut all_good = true;
        let mut dropped = false;
        for idx in self.chunks_for(offset, end.saturating_sub(offset)) {
            let want = self.pages_for(idx, offset, end);
            let unverified: Option<Vec<(u32, u32)>> = {
                let st = self.state.lock();
                match st.chunks[idx as usize] {
                    Chunk::Present { .. } => None,
                    Chunk::Partial => {
                        let p = st.chunks.pages().and_then(|t| t.get(&(idx as u32)));
                        let p = p.filter(|p| p.present & want == want);
                        let Some(p) = p else { return Ok(false) };
                        Some(
                            (0..PAGES as u32)
                                .filter(|&i| want & !p.verified & (1 << i) != 0)
                                .map(|i| (i, p.crcs[i as usize]))
                                .collect(),
                        )
                    }
                    Chunk::Absent | Chunk::Filling => return Ok(false),
                }
            };
            let Some(unverified) = unverified else {
                all_good &= self.verify(cache, idx..idx + 1)?;
                continue;
            };
            if unverified.is_empty() {
                continue;
            }
            let data = self.file(Mode::ReadWrite)?;
            let mut buf = Vec::new();
            for (page, crc) in unverified {
                let at = idx * self.shared.chunk_size + u64::from(page) * self.page_size();
                buf.resize(self.page_bytes(idx, 1 << page) as usize, 0);
                data.read_exact_at(&mut buf, self.base() + at)?;
                if !self.judge_page(cache, idx, page, crc, &buf) {
                    (all_good, dropped) = (false, true);
                }
            }
        }
        if dropped {
            self.persist_or_report(cache);
        }
        Ok(all_good)
    }

    /// Marks page `page` of chunk `idx` verified if `bytes` match its checksum `crc`, or drops
    /// it alone (its bytes released).
    fn judge_page(&self, cache: &Cache, idx: u64, page: u32, crc: u32, bytes: &[u8]) -> bool {
        let mut st = self.state.lock();
        // Whole (or gone) since the page was read: checked as a chunk, if at all.
        if st.chunks[idx as usize] != Chunk::Partial {
            return matches!(
                st.chunks[idx as usize],
                Chunk::Present { verified: true, .. }
            );
        }
        let bit = 1 << page;
        let good = crc32c::crc32c(bytes) == crc;
        let Some(p) = st.chunks.pages_mut(idx) else {
            return false;
        };
        // Only act if nobody changed the page while we read it.
        if p.present & bit == 0 || p.crcs[page as usize] != crc {
            return false;
        }
        if good {
            p.verified |= bit;
            return true;
        }
        (p.present, p.verified) = (p.present & !bit, p.verified & !bit);
        if p.present == 0 && p.filling == 0 {
            st.chunks.drop_pages(idx);
            st.chunks[idx as usize] = Chunk::Absent;
        }
        tracing::warn!(path = %self.path, chunk = idx, page, "page checksum mismatch, refetching");
        cache
            .stats
            .checksum_failures
            .fetch_add(1, Ordering::Relaxed);
        st.present_bytes -= bytes.len() as u64;
        cache.release(bytes.len() as u64);
        false
    }

    /// Records the header after a chunk was dropped; a log that cannot be written is reported
    /// and the read goes on (after a restart the chunk is logged present, fails its checksum
    /// and is dropped again).
    fn persist_or_report(&self, cache: &Cache) {
        if let Err(e) = self.persist() {
            cache.write_failed(&self.path, &e.into());
        }
    }

    /// Marks chunk `idx` verified if `bytes` (just read from the data file) match the checksum
    /// `crc` it had when read, or drops it (bytes released, refetched by its next reader).
    fn judge(&self, cache: &Cache, idx: u64, crc: u32, bytes: &[u8]) -> bool {
        let mut st = self.state.lock();
        let unverified = Chunk::Present {
            crc,
            verified: false,
        };
        // Only act if nobody changed the chunk while we read it.
        if st.chunks[idx as usize] != unverified {
            return matches!(st.chunks[idx as usize], Chunk::Present { .. });
        }
        if crc32c::crc32c(bytes) == crc {
            st.chunks[idx as usize] = Chunk::Present {
                crc,
                verified: true,
            };
            return true;
        }
        tracing::warn!(path = %self.path, chunk = idx, "checksum mismatch, refetching");
        cache
            .stats
            .checksum_failures
            .fetch_add(1, Ordering::Relaxed);
        st.chunks[idx as usize] = Chunk::Absent;
        st.present_bytes -= bytes.len() as u64;
        cache.release(bytes.len() as u64);
        false
    }

    /// Reads whole present chunks at `offset` for a peer into `room[..len]`, verifying those
    /// not yet verified from the same bytes: one read instead of two after a restart.
    /// `Ok(false)`: a chunk is absent or failed its checksum (then dropped). `room` may be
    /// written past `len` (a direct read rounds up to whole disk blocks).
    pub fn read_verified(
        &self,
        cache: &Cache,
        offset: u64,
        room: &mut [u8],
        len: usize,
    ) -> Result<bool, CacheError> {
        let range = self.chunks_for(offset, len as u64);
        let whole = offset.is_multiple_of(self.shared.chunk_size)
            && range.clone().map(|i| self.chunk_len(i)).sum::<u64>() == len as u64;
        if !whole {
            // Partial chunks cannot be checked from their own bytes.
            if !self.all_present(range.clone()) || !self.verify(cache, range)? {
                return Ok(false);
            }
            self.file(Mode::ReadWrite)?
                .read_exact_at(&mut room[..len], self.base() + offset)?;
            return Ok(true);
        }
        let expected: Vec<Chunk> = {
            let st = self.state.lock();
            range.clone().map(|i| st.chunks[i as usize]).collect()
        };
        if !expected.iter().all(|c| matches!(c, Chunk::Present { .. })) {
            return Ok(false);
        }
        let checks = expected.iter().any(|c| {
            matches!(
                c,
                Chunk::Present {
                    verified: false,
                    ..
                }
            )
        });
        let before = if checks { self.ctime_print() } else { None };
        self.read_avoiding_page_cache(offset, room, len)?;
        let buf = &room[..len];
        let mut all_good = true;
        let mut at = 0;
        for (idx, chunk) in range.zip(expected) {
            let len = self.chunk_len(idx) as usize;
            if let Chunk::Present {
                crc,
                verified: false,
            } = chunk
            {
                all_good &= self.judge(cache, idx, crc, &buf[at..at + len]);
            }
            at += len;
        }
        if !all_good {
            self.persist_or_report(cache);
        } else if checks {
            self.note_verified(before);
        }
        Ok(all_good)
    }
}
