//! An entry's chunks checked against their checksums: what fails is dropped (its bytes released
//! to the cache, the failure counted) and refetched by its next reader; whether an entry is
//! verified, and the print of its data file that keeps it so.

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use super::Cache;
use super::chunks::{Chunk, PAGES, PageMask};
use super::entry::{Entry, all_verified, ctime_print};
use super::error::CacheError;
use super::files::Mode;

impl Entry {
    /// Checks the present chunks of `range` against their checksums again, even those already
    /// verified (a scrub, or a peer that received a chunk that failed its checksum), and the
    /// present pages of its partial chunks; drops the bad ones (they are refetched when next
    /// read). Returns (chunks checked, chunks dropped), a partial chunk counting as one, and as
    /// dropped if one of its pages was.
    pub fn recheck(&self, cache: &Cache, range: Range<u64>) -> Result<(u64, u64), CacheError> {
        let mut checked = 0;
        let mut partial = Vec::new();
        {
            let mut st = self.state.lock();
            for idx in range.clone() {
                match st.chunks[idx as usize] {
                    Chunk::Present { crc, .. } => {
                        st.chunks[idx as usize] = Chunk::Present {
                            crc,
                            verified: false,
                        };
                        checked += 1;
                    }
                    Chunk::Partial => {
                        if let Some(p) = st.chunks.pages_mut(idx).filter(|p| p.present() != 0) {
                            p.verified = 0;
                            partial.push((idx, p.present()));
                            checked += 1;
                        }
                    }
                    Chunk::Absent | Chunk::Filling => {}
                }
            }
        }
        let before = cache.stats.checksum_failures.load(Ordering::Relaxed);
        self.verify(cache, range)?;
        let mut pages_dropped = 0;
        for (idx, present) in partial {
            if let Some((_, dropped)) = self.check_pages(cache, idx, present)? {
                pages_dropped += u64::from(dropped);
            }
        }
        if pages_dropped > 0 {
            self.persist_or_report(cache);
        }
        let dropped = cache.stats.checksum_failures.load(Ordering::Relaxed) - before;
        Ok((checked, dropped.min(checked)))
    }

    /// Verifies every present chunk of `range` not yet verified in this daemon's lifetime.
    /// A chunk whose bytes do not match its checksum is dropped (its bytes released) so the
    /// caller refetches it. Returns whether the whole range is present and verified.
    ///
    /// The chunks it skips were verified earlier: the guard ([`Entry::guard_partial`]) first
    /// asks whether the file changed since, else this call could find every chunk verified
    /// and remember the file as changed afterwards (it did: a byte changed in a chunk verified
    /// by one open's reads was served by the next open's, once the background verification
    /// of the rest had taken the file's print after the change).
    pub fn verify(&self, cache: &Cache, range: Range<u64>) -> Result<bool, CacheError> {
        self.guard_partial()?;
        self.verify_guarded(cache, range)
    }

    /// [`Entry::verify`] under a guard its caller has just checked.
    fn verify_guarded(&self, cache: &Cache, range: Range<u64>) -> Result<bool, CacheError> {
        let mut all_good = true;
        let mut dropped = false;
        let mut buf = Vec::new();
        let mut data = None;
        // The file's print before its bytes are read (a change while they are read moves it),
        // for a file of one chunk: one of many chunks has its guard's (`note_verified`).
        let printed = !self.has_guard();
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
                before = printed.then(|| ctime_print(&file)).flatten();
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
        self.guard_partial()?;
        let mut all_good = true;
        let mut dropped = false;
        for idx in self.chunks_for(offset, end.saturating_sub(offset)) {
            if matches!(
                self.state.lock().chunks[idx as usize],
                Chunk::Present { .. }
            ) {
                all_good &= self.verify_guarded(cache, idx..idx + 1)?;
                continue;
            }
            match self.check_pages(cache, idx, self.pages_for(idx, offset, end))? {
                Some((good, bad)) => {
                    all_good &= good;
                    dropped |= bad;
                }
                None => return Ok(false),
            }
        }
        if dropped {
            self.persist_or_report(cache);
        }
        Ok(all_good)
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

    /// Remembers the data file's print once every chunk is verified and none is remembered:
    /// an open that finds another one checks the file again ([`Entry::is_verified`]). The print
    /// must be no later than the check of any chunk it vouches for. A file of many chunks has
    /// its guard's, asked once more now ([`Entry::guard_partial`]: the file as it was when the
    /// earliest of its checks was made, carried on by the daemon's own writes; a change since
    /// makes every chunk checked again instead). A file of one chunk has `before` (taken
    /// before the bytes just verified were read), else the print now (after the fill that
    /// wrote them). Every way a chunk becomes verified ends here, so that the print is never
    /// first taken at an open, after a change it would then hide.
    pub(in crate::cache) fn note_verified(&self, before: Option<u32>) {
        let guarded = {
            let mut st = self.state.lock();
            if st.verified_ctime != 0 || st.present_bytes != self.version.size || !all_verified(&st)
            {
                return;
            }
            st.chunks.print_mut().is_some()
        };
        if guarded {
            // A file that cannot be looked at now makes no promise: checked at the next open.
            if self.guard_partial().is_ok() {
                let mut st = self.state.lock();
                let seen = st.chunks.print_mut().map_or(0, |seen| *seen);
                if st.verified_ctime == 0 && all_verified(&st) {
                    st.verified_ctime = seen;
                }
            }
            return;
        }
        let print = before.or_else(|| self.ctime_print());
        let mut st = self.state.lock();
        if st.verified_ctime == 0 && all_verified(&st) {
            st.verified_ctime = print.unwrap_or(0);
        }
    }

    /// [`Entry::note_verified`] for a file whose every chunk was checked as it was written (an
    /// adopted one): the file as it is now is the file as checked, its guard's print as well.
    pub(in crate::cache) fn note_checked_now(&self) {
        let print = self.ctime_print();
        if let Some(seen) = self.state.lock().chunks.print_mut() {
            *seen = print.unwrap_or(0);
        }
        self.note_verified(print);
    }

    /// The guard of a partly cached file against changes behind the daemon (a complete one,
    /// every chunk verified, has the print of [`Entry::is_verified`] at each open instead): its
    /// pages and chunks are verified once each, so a byte changed on the cache disk after that
    /// would be served as it is. The data file's ctime print is kept from one check to the
    /// next; a print that moved since (another process wrote the file; the daemon's own writes
    /// move it forward with them, see [`Entry::wrote_own`]) makes every page and chunk
    /// unverified, each checked against its crc before it is next served. The first check of
    /// an entry arms the guard the same way (as does its first write while it holds nothing).
    /// It holds until the whole-file print takes over: a file completed with some chunks
    /// unverified (a repair, after this guard unverified them) keeps it, else its verified
    /// chunks would be trusted under no print at all.
    fn guard_partial(&self) -> Result<(), CacheError> {
        {
            // A one-chunk file has no pages, and is checked whole (`verify`) before it is served.
            let mut st = self.state.lock();
            if st.chunks.print_mut().is_none() || (st.verified_ctime != 0 && all_verified(&st)) {
                return Ok(());
            }
        }
        let file = self.file(Mode::ReadWrite)?;
        let same = |now: u32| {
            let mut st = self.state.lock();
            st.chunks
                .print_mut()
                .is_none_or(|seen| *seen == now && now != 0)
        };
        if same(ctime_print(&file).unwrap_or(0)) {
            return Ok(());
        }
        // Asked again with no write of the daemon's under way: one between this print and the
        // kept one (which it moves) is no change behind the daemon.
        let _alone = self.shared.write_lock(self.id);
        let now = ctime_print(&file).unwrap_or(0);
        let mut st = self.state.lock();
        let Some(seen) = st.chunks.print_mut() else {
            return Ok(());
        };
        if *seen == now && now != 0 {
            return Ok(());
        }
        if *seen != 0 {
            tracing::warn!(path = %self.path, "partly cached data file changed behind the daemon: rechecking");
        }
        *seen = now;
        st.chunks.unverify();
        Ok(())
    }

    /// Whether the entry has the guard of [`Entry::guard_partial`] (a file of many chunks):
    /// its writes must carry the print on.
    pub(super) fn has_guard(&self) -> bool {
        self.state.lock().chunks.print_mut().is_some()
    }

    /// After the daemon's own write to the data file: its print moves from `before` (taken
    /// just before the write) to `after`, unless the file had moved already (then the kept
    /// print stays, and the next check finds the change). The first write to an entry that
    /// holds nothing yet arms the guard: no check vouches for bytes written before it.
    pub(super) fn wrote_own(&self, before: Option<u32>, after: Option<u32>) {
        let mut st = self.state.lock();
        let empty = st.present_bytes == 0;
        if let Some(seen) = st.chunks.print_mut()
            && (Some(*seen) == before && *seen != 0 || *seen == 0 && empty)
        {
            *seen = after.unwrap_or(0);
        }
    }

    /// Checks the pages `want` of partial chunk `idx` not yet verified against their checksums,
    /// dropping the bad ones alone: `Some((all good, any dropped))`, or `None` if the chunk is
    /// not partial or lacks one of them.
    fn check_pages(
        &self,
        cache: &Cache,
        idx: u64,
        want: PageMask,
    ) -> Result<Option<(bool, bool)>, CacheError> {
        let unverified: Vec<(u32, u32)> = {
            let st = self.state.lock();
            let pages = match st.chunks[idx as usize] {
                Chunk::Partial => st.chunks.page_set(idx),
                _ => None,
            };
            let Some(p) = pages.filter(|p| p.present() & want == want) else {
                return Ok(None);
            };
            (0..PAGES as u32)
                .filter(|&i| want & !p.verified & (1 << i) != 0)
                .filter_map(|i| Some((i, p.crc(i)?)))
                .collect()
        };
        let (mut good, mut dropped) = (true, false);
        if unverified.is_empty() {
            return Ok(Some((good, dropped)));
        }
        let data = self.file(Mode::ReadWrite)?;
        let mut buf = Vec::new();
        for (page, crc) in unverified {
            let at = idx * self.shared.chunk_size + u64::from(page) * self.page_size();
            buf.resize(self.page_bytes(idx, 1 << page) as usize, 0);
            data.read_exact_at(&mut buf, self.base() + at)?;
            if !self.judge_page(cache, idx, page, crc, &buf) {
                (good, dropped) = (false, true);
            }
        }
        Ok(Some((good, dropped)))
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
        if p.crc(page) != Some(crc) {
            return false;
        }
        if good {
            p.verified |= bit;
            return true;
        }
        p.remove(bit);
        if p.present() == 0 && p.filling == 0 {
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

    /// Reads present chunks (or pages) at `offset` for a peer into `room[..len]`, verifying
    /// whole chunks not yet verified from the same bytes: one read instead of two after a
    /// restart. `Ok(false)`: a chunk or page is absent or failed its checksum (then dropped).
    /// `room` may be written past `len` (a direct read rounds up to whole disk blocks).
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
            // Part of a chunk (pages of a random reader's copy): checked by chunk or by page
            // before it is read.
            let end = offset + len as u64;
            if !self.bytes_present(offset, end) || !self.verify_bytes(cache, offset, end)? {
                return Ok(false);
            }
            self.file(Mode::ReadWrite)?
                .read_exact_at(&mut room[..len], self.base() + offset)?;
            return Ok(true);
        }
        // Chunks verified earlier are trusted only while the file is as it was then.
        self.guard_partial()?;
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
        // (A file of many chunks has its guard's print instead: see `note_verified`.)
        let before =
            self.read_avoiding_page_cache(offset, room, len, checks && !self.has_guard())?;
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
