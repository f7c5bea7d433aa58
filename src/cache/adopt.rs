//! A finished file taken in whole: a produced file sealed at its close becomes a kept entry.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::Cache;
use super::chunks::Chunk;
use super::entry::Entry;
use super::error::CacheError;
use super::making::Making;
use crate::core::Version;

impl Cache {
    /// Takes a finished file (on the cache's file system) in as the complete, kept entry `path`:
    /// a produced file becomes an object peers pull like any cached file. Its bytes count
    /// against capacity, evicting others; a file the capacity cannot take fails with ENOSPC. On
    /// failure (the cache's file system full or read-only, say) nothing of it stays in the
    /// cache; the file itself is left to the caller unless it was moved already.
    pub fn adopt(
        &self,
        path: &str,
        version: Version,
        file: &Path,
    ) -> Result<Arc<Entry>, CacheError> {
        if version.size > self.room.capacity() {
            // Refused before anything is allocated for it or a byte of it read.
            return Err(io::Error::from_raw_os_error(libc::ENOSPC).into());
        }
        // A file of its own, whatever its size: it is renamed in.
        let entry =
            self.index
                .entry_made(path, version, Making::Adopted, &self.events, &self.writes)?;
        let adopted = self.adopt_into(&entry, file);
        if adopted.is_err() {
            // The empty entry, or the adopted one with the file's bytes: neither may stay (a
            // kept entry is never evicted, and nobody would name it).
            self.forget(path, version);
        }
        let adopted = adopted?;
        self.events.completed(&adopted);
        Ok(adopted)
    }

    /// [`Cache::adopt`]'s work once the empty entry `entry` is made. Room is reserved first
    /// (evicting as a fill would, never past the capacity): a file that cannot have it costs
    /// no pass over its bytes.
    fn adopt_into(&self, entry: &Arc<Entry>, file: &Path) -> Result<Arc<Entry>, CacheError> {
        let version = entry.version;
        if !self.reserve(entry, version.size) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC).into());
        }
        let crcs = match self.checksums(entry, file) {
            Ok(crcs) => crcs,
            Err(e) => {
                self.room.release(version.size);
                return Err(e);
            }
        };
        // The file becomes the entry's data file, and a new entry (a new id: its descriptor is
        // opened anew) replaces the empty one.
        if let Err(e) = fs::rename(file, entry.data_path()) {
            self.room.release(version.size);
            return Err(e.into());
        }
        entry.state.lock().evicted = true;
        self.shared.files.close(entry.id);
        let adopted = Arc::new(Entry::new(
            entry.path.clone(),
            version,
            self.index.next_id(),
            self.shared.clone(),
            crcs.into_iter()
                .map(|crc| Chunk::Present {
                    crc,
                    verified: true,
                })
                .collect::<Vec<_>>()
                .into(),
            self.shared.next_tick(),
        ));
        adopted.set_kept(true);
        // Checked as it was written: its file is remembered as it is now (see
        // `Entry::is_verified`), not at its first open, when it may have changed already.
        adopted.note_checked_now();
        self.index.lock().insert(adopted.clone());
        adopted.persist()?;
        Ok(adopted)
    }

    /// The crc32c of each chunk of `file` (`entry`'s bytes). Only its data is read: a chunk
    /// wholly in a hole is zeros, whose checksum is computed once, so a sparse file costs what
    /// it holds, not its size.
    fn checksums(&self, entry: &Entry, file: &Path) -> Result<Vec<u32>, CacheError> {
        let chunk_size = self.shared.chunk_size;
        let src = self.shared.files.open_retrying(|| File::open(file))?;
        // As large as a chunk of this file can be, not a whole chunk size: a small file's
        // close then reads (and faults in) what it holds, not 2 MiB.
        let mut buf = vec![0; chunk_size.min(entry.version.size) as usize];
        // The checksum of a whole chunk of zeros, made only for a file with a hole that size.
        let mut zeros = None;
        let mut crcs = Vec::with_capacity(entry.chunk_count() as usize);
        // The next run of data (its start, `None`: none left; and its end), asked again once
        // a chunk starts past it. Chunks before it are holes.
        let mut data = (Some(0), 0);
        for i in 0..entry.chunk_count() {
            let (start, len) = (i * chunk_size, entry.chunk_len(i));
            if data.0.is_some() && data.1 <= start {
                let next = crate::sys::seek_data(&src, start)?;
                let end = match next {
                    Some(d) => crate::sys::seek_hole(&src, d)?,
                    None => 0,
                };
                data = (next, end);
            }
            let hole = data.0.is_none_or(|d| d >= start + len);
            crcs.push(match hole {
                true if len == chunk_size => {
                    *zeros.get_or_insert_with(|| crc32c::crc32c(&vec![0; chunk_size as usize]))
                }
                true => crc32c::crc32c(&vec![0; len as usize]),
                false => {
                    let b = &mut buf[..len as usize];
                    src.read_exact_at(b, start)?;
                    crc32c::crc32c(b)
                }
            });
        }
        Ok(crcs)
    }
}
