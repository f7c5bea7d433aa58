//! Reads of open files, and the work done off the request's thread: sequential readahead of
//! large files and background verification of files the kernel reads directly.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Files;
use crate::cache::{Entry, ReadBytes};
use crate::core::source::Source;
use crate::fill::{MAX_READAHEAD_CHUNKS, WHOLE_FILE_MAX};
use crate::fs::Error;
use crate::fs::handles::{CachedHandle, Handle};

impl<S: Source> Files<S> {
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<ReadBytes, Error> {
        let handle = self.tree.handles.get(fh)?;
        let handle = match &*handle {
            Handle::Cached(h) => h,
            Handle::Staged { staged, .. } => {
                let len = staged.file.metadata().map_err(Error::Write)?.len();
                let n = (u64::from(size)).min(len.saturating_sub(offset)) as usize;
                let mut buf = vec![0; n];
                staged
                    .file
                    .read_exact_at(&mut buf, offset)
                    .map_err(Error::Write)?;
                return Ok(ReadBytes::Owned(buf));
            }
        };
        let entry = &handle.entry;
        let large = entry.version.size > WHOLE_FILE_MAX;
        let map = large
            .then(|| handle.map.get_or_init(|| entry.map()).as_ref())
            .flatten();
        let data = self.reader.read_mapped(entry, offset, size, map)?;
        if large {
            self.read_ahead(handle, offset, data.len() as u64);
        }
        Ok(data)
    }

    /// On sequential reads of a large file, fills the next chunks in the background with a
    /// window that doubles per sequential read, once the reads have run in order for a whole
    /// chunk; a seek resets it. A random read of a few hundred KiB comes as several READs in
    /// order (the kernel splits it, and reads ahead of it itself): counted as a run, each would
    /// fill chunks nobody reads (HDF5 rows, LMDB records: issue 50).
    fn read_ahead(&self, handle: &CachedHandle, offset: u64, len: u64) {
        let entry = handle.entry.clone();
        let sequential = handle.next_offset.swap(offset + len, Ordering::Relaxed) == offset;
        if !sequential {
            handle.run_start.store(offset, Ordering::Relaxed);
        }
        let run = (offset + len).saturating_sub(handle.run_start.load(Ordering::Relaxed));
        let window = if sequential && run >= entry.chunk_len(0) {
            (handle.window.load(Ordering::Relaxed) * 2).clamp(1, MAX_READAHEAD_CHUNKS)
        } else {
            0
        };
        handle.window.store(window, Ordering::Relaxed);
        let start = entry.chunks_for(offset, len.max(1)).end;
        let end = (start + window).min(entry.chunk_count());
        if start >= end || entry.all_present(start..end) {
            return;
        }
        // One job per chunk: the readahead threads pull the window in parallel, so one
        // chunk's transfer overlaps another's disk write.
        for idx in start..end {
            let (reader, entry) = (self.reader.clone(), entry.clone());
            let _ = self.readahead.send(Box::new(move || {
                if let Err(e) = reader.fill_ahead(&entry, idx..idx + 1) {
                    tracing::debug!(path = %entry.path, error = %e, "readahead failed");
                }
            }));
        }
    }

    pub(super) fn verify_in_background(&self, entry: Arc<Entry>) {
        let cache = self.reader.cache.clone();
        let _ = self.readahead.send(Box::new(move || {
            // A failed chunk is dropped by verify and refetched on its next read.
            if let Err(e) = entry.verify(&cache, 0..entry.chunk_count()) {
                tracing::warn!(path = %entry.path, error = %e, "background verification failed");
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::backing::memory::MemShared;
    use crate::core::mem_source::MemSource;
    use crate::fs::inodes::ROOT_INO;
    use crate::fs::ops_tests::{MemNames, fs_over};

    /// Random reads of a few READs in order each (as the kernel splits a 192 KiB pread) fill
    /// only the pages they touch; a reader that goes on in order for a chunk gets the next
    /// chunks filled ahead of it, whole.
    #[test]
    fn only_reads_in_order_for_a_whole_chunk_read_ahead() {
        const CHUNK: u64 = 256 << 10; // the chunk size of `fs_over`'s cache
        const SIZE: u64 = 48 * CHUNK; // past the size fetched whole at open
        let dir = std::env::temp_dir().join(format!("dyadfs-readahead-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let shared = Arc::new(MemShared::default());
        shared.file("big.bin", SIZE, 9);
        let source = Arc::new(MemSource::default());
        let data: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
        let version = source.add_version("big.bin", data, 9);
        let names = Arc::new(MemNames::default());
        let fs = fs_over(
            &dir.join("ssd"),
            shared,
            source,
            names,
            (None, Duration::ZERO),
        );
        let ino = fs
            .lookup(
                ROOT_INO,
                OsStr::new("big.bin"),
                &crate::fs::caller::Unknown::ROOT,
            )
            .unwrap()
            .ino;
        let fh = fs.open(ino, false, false).unwrap().fh;
        let read = |off: u64| assert_eq!(fs.read(fh, off, 64 << 10).unwrap().len(), 64 << 10);
        for c in [3, 10, 17] {
            for k in 0..3 {
                read(c * CHUNK + k * (64 << 10));
            }
        }
        for k in 0..16 {
            read(24 * CHUNK + k * (64 << 10));
        }
        let entry = fs.cache().lookup("big.bin", version).unwrap();
        // The one readahead thread takes its jobs in order: once the scan's are done, any a
        // random read had queued would be too.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !entry.all_present(28..30) {
            assert!(
                Instant::now() < deadline,
                "nothing was read ahead of the scan"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        for c in [3, 10, 17] {
            assert!(entry.bytes_present(c * CHUNK, c * CHUNK + (192 << 10)));
            assert!(
                !entry.all_present(c..c + 1),
                "chunk {c} was filled whole for a random read of part of it"
            );
            assert!(
                !entry.bytes_present((c + 1) * CHUNK, (c + 1) * CHUNK + 1),
                "chunk {} was filled for a random read of chunk {c}",
                c + 1
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
