//! The store peers read this node's cache through ([`ChunkStore`]): only present, verified
//! chunks of the exact version, filled first for a file this node was told to fetch.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::backing::BackingStore;
use crate::cache::Cache;
use crate::core::Version;
use crate::fill::Reader;
use crate::locator::proto::{PAGE_MAP_WORDS, PageMap};
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

/// Which pages of `path` at `version` the cache has in the window of byte `offset`, for a peer
/// about to pull some (whether this node fills for its peers is the locator's to say).
pub fn page_map(cache: &Cache, path: &str, version: Version, offset: u64) -> Option<PageMap> {
    let entry = cache.lookup(path, version)?;
    let page = entry.page_size();
    let first = PageMap::window(offset, page);
    let masks = entry.held_pages(first, PAGE_MAP_WORDS as usize);
    Some(PageMap {
        page,
        first,
        masks,
        fills: false,
    })
}

/// A peer received a bad chunk of ours (at `offset`): it is checked again, and dropped if bad.
pub fn recheck_chunk(cache: &Cache, path: &str, version: Version, offset: u64) {
    if let Some(e) = cache.lookup(path, version) {
        match e.recheck(cache, e.chunks_for(offset, 1)) {
            Ok((_, dropped)) => {
                tracing::warn!(%path, offset, dropped, "a peer received a bad chunk")
            }
            Err(err) => tracing::warn!(%path, error = %err, "rechecking a chunk failed"),
        }
    }
}
