//! The store peers read this node's cache through ([`ChunkStore`]): only present, verified
//! chunks of the exact version, filled first for a file this node was told to fetch.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::backing::BackingStore;
use crate::cache::Cache;
use crate::core::Version;
use crate::fill::Reader;
use crate::locator::service::LocatorService;
use crate::stats::Stats;
use crate::transport::server::ChunkStore;

/// Peers read this node's cache: only present, verified chunks of the exact version.
pub struct CacheStore {
    pub cache: Arc<Cache>,
    pub stats: Arc<Stats>,
    /// Set in a cluster: for a file this node was told to fetch, chunks a waiting peer asks
    /// for that are not here yet are filled first (from the shared file system, single flight
    /// with this node's own readers), so the peer never reads them there too.
    pub fetcher: Option<Fetcher>,
}

pub struct Fetcher {
    pub locator: Arc<LocatorService>,
    pub reader: Reader<BackingStore>,
}

impl ChunkStore for CacheStore {
    fn read_at(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        room: &mut [u8],
        len: usize,
    ) -> io::Result<Option<u32>> {
        let v: Version = version;
        let missing = || io::Error::new(io::ErrorKind::NotFound, "not in this node's cache");
        let fetcher = self
            .fetcher
            .as_ref()
            .filter(|f| f.locator.is_fetching(path, v));
        let entry = match (self.cache.lookup(path, v), fetcher) {
            (Some(e), _) => e,
            (None, Some(_)) => self.cache.entry_or_uncached(path, v),
            (None, None) => return Err(missing()),
        };
        if let Some(f) = fetcher {
            entry.pin();
            let filled = f.reader.fill_for_peer(&entry, offset, offset + len as u64);
            entry.unpin();
            filled.map_err(io::Error::other)?;
        }
        if !entry
            .read_verified(&self.cache, offset, room, len)
            .map_err(io::Error::other)?
        {
            return Err(missing());
        }
        self.stats
            .bytes_served_to_peers
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(entry.chunk_crc(offset, len as u64))
    }
}
