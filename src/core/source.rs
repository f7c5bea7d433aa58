//! The port missing chunks come from: the backing store on a single node, peers falling back
//! to the backing store in a cluster, an in-memory double in tests. The filesystem's read path
//! fills the cache through it and knows nothing of what is behind it.

use std::io;

use super::ids::Version;

/// Where a source found the bytes it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Backing,
    /// Pulled from another node's cache.
    Peer,
}

impl Origin {
    /// Its name in metrics and traces.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Peer => "peer",
            Origin::Backing => "shared_fs",
        }
    }
}

/// Where a source hands the bytes of a range: `sink(offset, bytes, crc)`, pieces starting at
/// chunk boundaries, `crc` the crc32c of `bytes` when the source already checked it (a peer's).
pub type FillSink<'a> = &'a mut (dyn FnMut(u64, &[u8], Option<u32>) -> io::Result<()> + Send);

/// One file of a batch ([`Source::read_batch`]), read whole: `len` is its size.
pub struct Piece<'a> {
    pub path: &'a str,
    pub version: Version,
    pub len: u64,
}

/// Where a batch's bytes go: `sink(i, offset, bytes, crc)` for file `i` of the batch, as
/// [`FillSink`] for one file.
pub type BatchSink<'a> =
    &'a mut (dyn FnMut(usize, u64, &[u8], Option<u32>) -> io::Result<()> + Send);

/// Where missing chunks come from.
pub trait Source: Send + Sync + 'static {
    /// Reads exactly `buf.len()` bytes of `path` at `offset`, overwriting every byte of `buf`
    /// (it may hold an earlier read's, see `with_scratch`), or fails; fails (ESTALE) if the
    /// file is no longer at `version`.
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
        with_scratch(len as usize, |buf| {
            let origin = self.read_at(path, version, offset, buf)?;
            sink(offset, buf, None)?;
            Ok(origin)
        })
    }

    /// Hands every file of `files` whole to `sink`; each file's outcome, in order. The order
    /// is known (a prefetch list), so a source that can move several files at once (peers)
    /// overrides this; by default each is one [`Source::read_into`].
    fn read_batch(&self, files: &[Piece<'_>], sink: BatchSink<'_>) -> Vec<io::Result<Origin>> {
        files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let mut one = |off: u64, bytes: &[u8], crc: Option<u32>| sink(i, off, bytes, crc);
                self.read_into(f.path, f.version, 0, f.len, &mut one)
            })
            .collect()
    }
}

/// Reads of at most this many bytes use the thread's scratch buffer (the largest chunk size);
/// larger ones get a buffer of their own.
const SCRATCH_MAX: usize = (4 << 20) + DIRECT_ALIGN;

/// O_DIRECT's alignment of memory, offsets and lengths (a page: what every file system takes).
pub const DIRECT_ALIGN: usize = 4096;

thread_local! {
    /// The buffer a thread reads chunks into, kept between reads: a new zeroed allocation per
    /// fill (page faults, memset, and madvise when glibc hands it back) cost about a quarter of
    /// the daemon's CPU in fills from the shared file system (`perf record` over 2048 files of
    /// 256 KiB). At most [`SCRATCH_MAX`] per thread that fills.
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `f` on `len` bytes of initialised memory: the thread's scratch buffer, taken for the
/// call (a read nested in it finds none and starts its own), or one of its own if `len` is
/// over [`SCRATCH_MAX`].
pub fn with_scratch<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    let kept = len <= SCRATCH_MAX;
    let mut buf = if kept { SCRATCH.take() } else { Vec::new() };
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let r = f(&mut buf[..len]);
    if kept {
        SCRATCH.set(buf);
    }
    r
}

/// Runs `f` on `len` bytes of scratch memory (as [`with_scratch`]) whose first byte is
/// aligned to [`DIRECT_ALIGN`], for O_DIRECT reads.
pub fn with_aligned_scratch<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    with_scratch(len + DIRECT_ALIGN, |buf| {
        let skip = buf.as_ptr().align_offset(DIRECT_ALIGN);
        f(&mut buf[skip..skip + len])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_serves_nested_and_large_reads_with_buffers_of_their_own() {
        let outer = with_scratch(16, |a| {
            a.fill(1);
            // A read while the scratch buffer is taken gets its own, zeroed.
            let inner = with_scratch(8, |b| {
                assert!(b.iter().all(|&x| x == 0));
                b.len()
            });
            assert!(
                a.iter().all(|&x| x == 1),
                "the nested read wrote into the outer buffer"
            );
            inner + a.len()
        });
        assert_eq!(outer, 24);
        // Reused: the same memory, not zeroed again (its bytes are overwritten by each read).
        with_scratch(16, |a| assert!(a.iter().all(|&x| x == 1)));
        assert_eq!(with_scratch(SCRATCH_MAX + 1, |b| b.len()), SCRATCH_MAX + 1);
    }

    #[test]
    fn aligned_scratch_starts_on_a_block() {
        for len in [1, 4096, 256 << 10, 4 << 20] {
            with_aligned_scratch(len, |b| {
                assert_eq!(b.len(), len);
                assert!((b.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
            });
        }
    }
}
