//! Reads of cached chunks for peers (the stored checksum travels with the chunk) and for
//! daemon-served reads: bytes that are not in the page cache are read with O_DIRECT, so that
//! serving them neither costs a page-cache copy nor pushes this node's own working set out.

use std::io;
use std::os::unix::fs::FileExt;

use super::Entry;
use super::chunks::Chunk;
use super::files::Mode;

impl Entry {
    /// The stored crc32c of the chunk that is exactly `[offset, offset + len)`, if present.
    pub fn chunk_crc(&self, offset: u64, len: u64) -> Option<u32> {
        let idx = offset / self.shared.chunk_size;
        if !offset.is_multiple_of(self.shared.chunk_size)
            || idx >= self.chunk_count()
            || self.chunk_len(idx) != len
        {
            return None;
        }
        match self.state.lock().chunks[idx as usize] {
            Chunk::Present { crc, .. } => Some(crc),
            _ => None,
        }
    }

    /// Reads `room[..len]` at `offset`, for a peer or for a daemon-served read of this mount.
    /// Bytes already in the page cache are copied from it; bytes that are not are read from
    /// the disk straight into `room` (O_DIRECT, where `room` is block-aligned and holds whole
    /// blocks), not through the page cache: on a node serving its cache to others, that copy
    /// costs as much CPU as the whole transfer (`perf` of `scripts/bench_cluster.sh`); a reader
    /// of this mount has the bytes kept in the mount's own page cache; and the pages would only
    /// push the node's working set out. `print`: also returns the data file's ctime print,
    /// taken before the read (see `Entry::note_verified`).
    pub(super) fn read_avoiding_page_cache(
        &self,
        offset: u64,
        room: &mut [u8],
        len: usize,
        print: bool,
    ) -> io::Result<Option<u32>> {
        // Where the bytes are in the data file (its region of a segment, if packed).
        let at = self.base() + offset;
        // A file of its own: its read-write descriptor if the LRU keeps it, looked up once (what
        // `Entry::file` would return first).
        let own = self.place().is_none();
        let kept = own
            .then(|| self.shared.files.cached(self.id, Mode::ReadWrite))
            .flatten();
        // A whole file of its own whose read-write descriptor is not kept (a reloaded entry's
        // first serve to a peer, or one the LRU let go): its O_DIRECT descriptor alone asks,
        // prints and reads, where the read-write one would be opened and kept for that (after
        // a restart a serve opened three files, `RESTART_A=1 scripts/bench_sample.sh`).
        if own
            && kept.is_none()
            && offset == 0
            && len as u64 == self.version.size
            && let Ok((direct, before)) = self.file_once_printed(Mode::Direct, print)
            && crate::sys::pages_cached(&direct, at, len) == Some(false)
            && read_direct_with(&direct, at, room, len)
        {
            return Ok(before);
        }
        let data = match kept {
            Some(f) => f,
            None => self.file(Mode::ReadWrite)?,
        };
        let before = print.then(|| super::entry::ctime_print(&data)).flatten();
        if crate::sys::pages_cached(&data, at, len) == Some(false)
            && self.read_direct(at, room, len)
        {
            return Ok(before);
        }
        data.read_exact_at(&mut room[..len], at)?;
        Ok(before)
    }

    /// Whether every byte of the data file is in the page cache (`None` where that cannot be
    /// told, see [`crate::sys::pages_cached`]).
    pub fn pages_cached(&self) -> Option<bool> {
        let data = self.file(Mode::ReadWrite).ok()?;
        crate::sys::pages_cached(&data, self.base(), self.version.size as usize)
    }

    /// Reads at least `room[..len]` at `offset` of the data file with O_DIRECT, rounded up to
    /// whole blocks; `false` where that is impossible (unaligned, refused) or failed: read
    /// another way.
    fn read_direct(&self, offset: u64, room: &mut [u8], len: usize) -> bool {
        if !aligned_for_direct(offset, room, len) {
            return false;
        }
        // Opened on demand and kept in the LRU while idle, unless this read is the whole file
        // (a small file pulled by a peer: its only read for an epoch); a refusal means read
        // another way.
        let whole = offset == self.base() && len as u64 == self.version.size;
        let direct = if whole {
            self.file_once(Mode::Direct)
        } else {
            self.file(Mode::Direct)
        };
        direct.is_ok_and(|d| read_direct_with(&d, offset, room, len))
    }
}

/// Whether `room[..len]` at `offset` can be read with O_DIRECT: block-aligned, with room for
/// the last block whole.
fn aligned_for_direct(offset: u64, room: &[u8], len: usize) -> bool {
    const BLOCK: usize = crate::core::source::DIRECT_ALIGN;
    offset.is_multiple_of(BLOCK as u64)
        && (room.as_ptr() as usize).is_multiple_of(BLOCK)
        && len.next_multiple_of(BLOCK) <= room.len()
}

/// Reads at least `room[..len]` at `offset` of `direct` (opened O_DIRECT), rounded up to whole
/// blocks; `false` if unaligned or failed.
fn read_direct_with(direct: &std::fs::File, offset: u64, room: &mut [u8], len: usize) -> bool {
    if !aligned_for_direct(offset, room, len) {
        return false;
    }
    let padded = len.next_multiple_of(crate::core::source::DIRECT_ALIGN);
    // A short count only at the end of the file, past `len`.
    matches!(
        crate::sys::read_at_least(direct, &mut room[..padded], offset, len),
        Ok(n) if n >= len
    )
}
