//! The port missing chunks come from: the backing store on a single node, peers falling back
//! to the backing store in a cluster, an in-memory double in tests. The filesystem's read path
//! fills the cache through it and knows nothing of what is behind it.

use std::io;

use super::Version;

/// Where a source found the bytes it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Backing,
    /// Pulled from another node's cache.
    Peer,
}

/// Where a source hands the bytes of a range: `sink(offset, bytes, crc)`, pieces starting at
/// chunk boundaries, `crc` the crc32c of `bytes` when the source already checked it (a peer's).
pub type FillSink<'a> = &'a mut (dyn FnMut(u64, &[u8], Option<u32>) -> io::Result<()> + Send);

/// Where missing chunks come from.
pub trait Source: Send + Sync + 'static {
    /// Reads exactly `buf.len()` bytes of `path` at `offset`; fails (ESTALE) if the file is no
    /// longer at `version`.
    fn read_at(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<Origin>;

    /// Hands `len` bytes of `path` at `offset` (a chunk boundary) to `sink`. A source whose
    /// bytes arrive in buffers of their own (pulled chunks) overrides this to skip a copy.
    fn read_into(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        len: u64,
        sink: FillSink<'_>,
    ) -> io::Result<Origin> {
        let mut buf = vec![0; len as usize];
        let origin = self.read_at(path, version, offset, &mut buf)?;
        sink(offset, &buf, None)?;
        Ok(origin)
    }
}
