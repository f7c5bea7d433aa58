//! The cache's open data files: a bounded LRU of descriptors, opened on demand. A node caches
//! millions of files under a descriptor limit of a few thousand (often 1,024), so no entry owns
//! a descriptor; a reader takes the file from here (an `Arc<File>`: eviction from the LRU only
//! closes it once the last reader lets go). Running out of descriptors anywhere in the process
//! sheds the idle ones and retries instead of failing the read.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lru::LruCache;

use crate::core::sync::lock;

/// How a data file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Read and write through the page cache: fills, local reads, mappings, passthrough.
    ReadWrite,
    /// Read-only with O_DIRECT: cold chunks read for peers and daemon-served reads (see
    /// `Entry::read_avoiding_page_cache`).
    Direct,
}

pub struct DataFiles {
    /// (entry id, mode) -> open file, least recently used first out. Keyed by the entry's id,
    /// never by its path: a slot's next entry must not be handed the previous entry's
    /// (unlinked) file. An exact LRU under one lock: a file past the budget is let go as the
    /// next one is kept. (moka, used before, evicted lazily, ran tens of descriptors past the
    /// budget unless told to catch up, and its look and keep took 2.4% of a pulling node's
    /// CPU samples over 64 KiB pulls; these take 0.2%.)
    open: Mutex<LruCache<(u64, Mode), Arc<File>>>,
    budget: usize,
}

/// How often an open that ran out of descriptors is retried (after shedding idle ones).
const RETRIES: u32 = 5;

impl DataFiles {
    /// Keeps at most `budget` descriptors open while idle.
    pub fn new(budget: u64) -> DataFiles {
        DataFiles {
            // Unbounded, the budget kept by `keep`: a bounded one allocates its whole budget
            // (half the descriptor limit, which may be millions) up front.
            open: Mutex::new(LruCache::unbounded()),
            budget: usize::try_from(budget).unwrap_or(usize::MAX).max(1),
        }
    }

    /// The data file of entry `id` if open as `mode`.
    pub fn cached(&self, id: u64, mode: Mode) -> Option<Arc<File>> {
        lock(&self.open).get(&(id, mode)).cloned()
    }

    /// Opens the data file of entry `id` at `path` as `mode` and keeps it open while idle.
    pub fn open(&self, id: u64, path: &Path, mode: Mode) -> io::Result<Arc<File>> {
        Ok(self.insert(id, mode, self.open_unkept(path, mode)?))
    }

    /// Opens the data file at `path` as `mode` for one caller, not kept (see
    /// `Entry::file_once`; [`DataFiles::open`] keeps what this opens).
    pub fn open_unkept(&self, path: &Path, mode: Mode) -> io::Result<File> {
        self.open_retrying(|| open(path, mode))
    }

    /// Keeps `file`, just opened as `mode` for entry `id`; returns it as kept.
    pub fn insert(&self, id: u64, mode: Mode, file: File) -> Arc<File> {
        let file = Arc::new(file);
        self.keep((id, mode), file.clone());
        file
    }

    /// Keeps a file in the LRU; the least recently used past the budget are let go (closed
    /// once no reader holds them), after the lock: a close may take a while.
    fn keep(&self, key: (u64, Mode), file: Arc<File>) {
        let mut out = Vec::new();
        {
            let mut lru = lock(&self.open);
            out.extend(lru.put(key, file));
            while lru.len() > self.budget {
                out.extend(lru.pop_lru().map(|(_, f)| f));
            }
        }
        drop(out);
    }

    /// Runs `open` (any call that makes a descriptor), shedding idle data files and retrying
    /// while the process or the system is out of descriptors.
    pub fn open_retrying<T>(&self, mut open: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        let mut tries = 0;
        loop {
            match open() {
                Err(e) if is_out_of_descriptors(&e) && tries < RETRIES => {
                    tries += 1;
                    tracing::warn!(
                        open = self.open_count(),
                        "out of file descriptors: closing idle cache files and retrying"
                    );
                    self.shed();
                    // Descriptors held by readers in flight come back within moments.
                    std::thread::sleep(Duration::from_millis(1 << tries));
                }
                r => return r,
            }
        }
    }

    /// Closes the files of an entry that left the cache (readers in flight keep theirs), now:
    /// an unlinked file's blocks are held while a descriptor is, and the capacity no longer
    /// counts them (on a small cache disk read by 4 processes, 1-5 such files held it full).
    pub fn close(&self, id: u64) {
        let out = {
            let mut lru = lock(&self.open);
            [
                lru.pop(&(id, Mode::ReadWrite)),
                lru.pop(&(id, Mode::Direct)),
            ]
        };
        drop(out);
    }

    /// Closes every idle descriptor.
    pub fn shed(&self) {
        let all = std::mem::replace(&mut *lock(&self.open), LruCache::unbounded());
        drop(all);
    }

    /// Descriptors held by the LRU while idle.
    pub fn open_count(&self) -> u64 {
        lock(&self.open).len() as u64
    }
}

fn open(path: &Path, mode: Mode) -> io::Result<File> {
    match mode {
        Mode::ReadWrite => OpenOptions::new().read(true).write(true).open(path),
        Mode::Direct => OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path),
    }
}

pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// A new file for this daemon alone (0600), read and written.
pub(super) fn private_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// A new file at `path` made by `create` (a `create_new` open), never one an old copy's open
/// handles may still read: a leftover of another run is unlinked first and `create` tried
/// again. Usually there is none, so one name lookup, not two.
pub(super) fn create_fresh(path: &Path, create: impl Fn() -> io::Result<File>) -> io::Result<File> {
    match create() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(path)?;
            create()
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files kept by several threads at once stay within the budget, exactly: counted as the
    /// process's open descriptors on them.
    #[test]
    fn concurrent_keeps_stay_within_the_budget() {
        let dir = std::env::temp_dir().join(format!("dyadfs-files-c-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = Arc::new(DataFiles::new(16));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (files, dir) = (files.clone(), dir.clone());
                std::thread::spawn(move || {
                    for i in 0..300u64 {
                        let p = dir.join(format!("{t}-{i}"));
                        std::fs::write(&p, b"x").unwrap();
                        files.open(t * 1000 + i, &p, Mode::ReadWrite).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let open = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(&dir)))
            .count();
        assert!(open <= 16, "{open} descriptors open under a budget of 16");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn idle_files_are_bounded_and_a_new_id_gets_a_new_file() {
        let dir = std::env::temp_dir().join(format!("dyadfs-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = DataFiles::new(4);
        for i in 0..50u64 {
            let p = dir.join(format!("{i}"));
            std::fs::write(&p, i.to_le_bytes()).unwrap();
            files.open(i, &p, Mode::ReadWrite).unwrap();
            // Evictions are applied as files are kept, not only when the LRU gets round to it.
            assert!(files.open_count() <= 4, "{} open", files.open_count());
        }
        // Same path, another entry: the file is opened anew (the old one was replaced).
        let p = dir.join("0");
        let old = files.open(1000, &p, Mode::ReadWrite).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"new").unwrap();
        let new = files.open(1001, &p, Mode::ReadWrite).unwrap();
        assert!(files.cached(1001, Mode::ReadWrite).is_some());
        assert_eq!(new.metadata().unwrap().len(), 3);
        assert_eq!(old.metadata().unwrap().len(), 8);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// An entry's close and a shed let go of the LRU's files at once; a reader's keeps working.
    #[test]
    fn close_and_shed_let_go_at_once_and_readers_keep_theirs() {
        use std::os::unix::fs::FileExt;
        let dir = std::env::temp_dir().join(format!("dyadfs-files-s-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = DataFiles::new(8);
        for i in 0..4u64 {
            let p = dir.join(format!("{i}"));
            std::fs::write(&p, i.to_le_bytes()).unwrap();
            files.open(i, &p, Mode::ReadWrite).unwrap();
        }
        let held = files.cached(0, Mode::ReadWrite).unwrap();
        files.close(0);
        assert!(files.cached(0, Mode::ReadWrite).is_none());
        assert_eq!(files.open_count(), 3);
        let mut buf = [0u8; 8];
        held.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(u64::from_le_bytes(buf), 0);
        files.shed();
        assert_eq!(files.open_count(), 0);
        assert!(files.cached(1, Mode::ReadWrite).is_none());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn running_out_of_descriptors_is_retried_after_shedding() {
        let files = DataFiles::new(16);
        let mut calls = 0;
        let r = files.open_retrying(|| {
            calls += 1;
            if calls < 3 {
                Err(io::Error::from_raw_os_error(libc::EMFILE))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);
        let r: io::Result<()> =
            files.open_retrying(|| Err(io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(is_out_of_descriptors(&r.unwrap_err()));
    }
}
