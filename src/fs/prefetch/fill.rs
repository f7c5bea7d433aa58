//! Filling the files of prefetch lists into the cache, by a few threads of their own, for the
//! lists' owners and only where they may read them: one component of
//! [`DyadFs`](crate::fs::DyadFs).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Item, Prefetcher, read_list};
use crate::core::source::Source;
use crate::fill::Reader;
use crate::fs::caller::Credentials;
use crate::fs::found::Found;
use crate::fs::tree::Tree;
use crate::fs::workers::spawn_worker;
use crate::fs::{Attr, Error};

/// Files a prefetch thread takes at once (one batch pull by holder).
const BATCH: usize = 16;

pub struct Filler<S: Source> {
    tree: Arc<Tree>,
    reader: Reader<S>,
    prefetcher: Arc<Prefetcher>,
    /// Threads filling the files (`FsConfig::prefetch_threads`).
    threads: usize,
}

impl<S: Source> Filler<S> {
    pub(in crate::fs) fn new(
        tree: Arc<Tree>,
        reader: Reader<S>,
        prefetcher: Arc<Prefetcher>,
        threads: usize,
    ) -> Self {
        Filler {
            tree,
            reader,
            prefetcher,
            threads,
        }
    }

    /// Starts the prefetch threads; they hold the filler weakly and end with it.
    pub(in crate::fs) fn start(fs: &Arc<Filler<S>>) -> std::io::Result<()> {
        for i in 0..fs.threads {
            let (queue, prefetcher) = (fs.prefetcher.clone(), fs.prefetcher.clone());
            // (`take` waits for a file however long: the thread finds the file system gone
            // when it takes its next file.)
            spawn_worker(
                fs,
                format!("prefetch-{i}"),
                move |_| Some(queue.take_batch(BATCH)),
                move |fs, items: Vec<Item>| {
                    let sizes = fs.prefetch_batch(&items);
                    for (item, size) in items.into_iter().zip(sizes) {
                        prefetcher.done(item, size);
                    }
                },
            )?;
        }
        Ok(())
    }

    /// A prefetch request (a getxattr of the root by `who`): queues the list's files.
    pub(in crate::fs) fn request(
        &self,
        stream: &str,
        list: &Path,
        who: Credentials,
    ) -> Result<Vec<u8>, Error> {
        let uid = who.uid;
        // Its turn first: a user's second list is refused before it is read.
        let reading = self.prefetcher.begin(uid, stream)?;
        let (paths, skipped) = read_list(list, uid, reading.budget, reading.keys())?;
        let files = reading.set(Arc::new(who), paths);
        tracing::info!(uid, stream, files, skipped, "prefetch list queued");
        Ok(format!("{{\"files\":{files},\"skipped\":{skipped}}}").into_bytes())
    }

    /// Fills listed files into the cache for their owner, the way their first reads would
    /// (never waiting for a producer, never making an inode), each only if its owner may read
    /// it (files being written, directories and the like are left alone): the whole one-chunk
    /// ones nobody is filling move as one batch (by holder, from peers), the others one by
    /// one. Returns the bytes each holds in the cache.
    fn prefetch_batch(&self, items: &[Item]) -> Vec<u64> {
        let mut sizes = vec![0; items.len()];
        // (item, its entry) of the files a batch may fill.
        let mut batch: Vec<(usize, Arc<crate::cache::Entry>)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match self.prefetch_entry(&item.path, &item.who) {
                Ok(Some(entry)) if entry.is_complete() => sizes[i] = entry.version.size,
                Ok(Some(entry)) if entry.chunk_count() == 1 && items.len() > 1 => {
                    entry.pin();
                    batch.push((i, entry));
                }
                Ok(Some(entry)) => sizes[i] = self.prefetch_fill(&entry),
                Ok(None) => {}
                Err(e) => tracing::debug!(path = %item.path, error = %e, "prefetch failed"),
            }
        }
        let entries: Vec<_> = batch.iter().map(|(_, e)| e.clone()).collect();
        self.reader.fill_batch(&entries);
        for (i, entry) in batch {
            // Those the batch did not bring (another filler had them, or it failed): alone.
            sizes[i] = if entry.is_complete() {
                self.count_prefetched(entry.version.size);
                entry.version.size
            } else {
                self.prefetch_fill(&entry)
            };
            entry.unpin();
        }
        sizes
    }

    /// The cache entry of a listed file if `who` may read it and it is a file (`None`: nothing
    /// to fill, or the cache's file system cannot take it).
    fn prefetch_entry(
        &self,
        path: &str,
        who: &Credentials,
    ) -> Result<Option<Arc<crate::cache::Entry>>, Error> {
        let found = match self.tree.resolve(path, Duration::ZERO) {
            Err(Error::NotFound) => {
                // Listed but not there (a typo, a file removed since): said in the stats.
                self.tree
                    .stats
                    .prefetch_missing
                    .fetch_add(1, Ordering::Relaxed);
                return Err(Error::NotFound);
            }
            r => r?,
        };
        if let Err(e) = self.readable_by(path, &found, who) {
            self.tree
                .stats
                .prefetch_denied
                .fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        let (key, version) = match found {
            Found::Backing(meta) if meta.is_file() => (path.to_string(), meta.version()),
            Found::Produced(n) if n.is_file() => {
                let version = Attr::from_name(0, &n).version;
                (n.object, version)
            }
            _ => return Ok(None),
        };
        let entry = self.reader.cache.entry_or_uncached(&key, version);
        // Evicted: the cache's file system cannot take it (counted and logged).
        Ok((!entry.is_evicted()).then_some(entry))
    }

    /// Fills one entry of a list alone; the bytes it holds in the cache.
    fn prefetch_fill(&self, entry: &Arc<crate::cache::Entry>) -> u64 {
        match self.reader.fill_ahead(entry, 0..entry.chunk_count()) {
            Ok(true) if entry.is_complete() => self.count_prefetched(entry.version.size),
            Ok(_) => {}
            Err(e) => tracing::debug!(path = %entry.path, error = %e, "prefetch failed"),
        }
        entry.version.size
    }

    fn count_prefetched(&self, size: u64) {
        let stats = &self.tree.stats;
        stats.prefetched_files.fetch_add(1, Ordering::Relaxed);
        stats.prefetched_bytes.fetch_add(size, Ordering::Relaxed);
    }

    /// Whether `who` may read `path` (which resolved to `found`) through the mount: search on
    /// every directory above it and read on the file, judged on the attributes the mount
    /// presents, as the kernel judges an open. The daemon fills as root: unchecked, a user
    /// could stage files it cannot read and learn their sizes and timing. (Checked when the
    /// file's turn comes, not when the list arrives: rights change.)
    fn readable_by(&self, path: &str, found: &Found, who: &Credentials) -> Result<(), Error> {
        if who.uid == 0 {
            return Ok(());
        }
        let above = std::iter::once("").chain(path.match_indices('/').map(|(i, _)| &path[..i]));
        for dir in above {
            if !self
                .tree
                .resolve(dir, Duration::ZERO)?
                .attr(0)?
                .allows(who, 1)
            {
                return Err(Error::Denied);
            }
        }
        if !found.attr(0)?.allows(who, 4) {
            return Err(Error::Denied);
        }
        Ok(())
    }

    /// Files of prefetch lists waiting for a thread.
    pub(in crate::fs) fn pending(&self) -> u64 {
        self.prefetcher.pending()
    }
}
