//! Bytes of a cached file handed to a reader: a view of a shared mapping of the data file (the
//! FUSE reply is then written from the page cache, no copy of ours first) or a buffer.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

use super::Entry;
use super::files::Mode;

/// Bytes read from the cache for a reader: a view of a mapping of the data file (the FUSE
/// reply is then written from the page cache, with no copy into a buffer of ours first), or a
/// buffer of their own.
pub enum ReadBytes {
    Owned(Vec<u8>),
    Mapped(Arc<Mapping>, Range<usize>),
}

impl std::ops::Deref for ReadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBytes::Owned(v) => v,
            ReadBytes::Mapped(m, r) => &m.bytes()[r.clone()],
        }
    }
}

impl std::fmt::Debug for ReadBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadBytes({} bytes)", self.len())
    }
}

impl PartialEq<[u8]> for ReadBytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for ReadBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

/// A read-only shared mapping of a whole data file. Data files are never truncated while an
/// entry uses them (a new version or a dropped entry gets a new file; the old one is only
/// unlinked), so reading any byte of the mapping is safe.
pub struct Mapping {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only memory owned by this value until Drop.
unsafe impl Send for Mapping {}
// SAFETY: as above: shared reads only.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize) -> Option<Mapping> {
        if len == 0 {
            return None;
        }
        // SAFETY: a read-only shared mapping of `len` bytes of a file we hold open; the result
        // is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then_some(Mapping {
            ptr: ptr as *const u8,
            len,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes until Drop (see the type's comment).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in new(), once; no slice of it outlives `self`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

impl Entry {
    /// Maps the whole data file for reading (`None` if the system refuses): readers that keep
    /// it (an open handle of a large file) are then served without copying.
    pub fn map(&self) -> Option<Arc<Mapping>> {
        let data = self.file(Mode::ReadWrite).ok()?;
        Mapping::new(&data, self.version.size as usize).map(Arc::new)
    }

    /// Bytes `[offset, offset + len)` of present chunks (the caller has ensured and verified
    /// them), from `map` if given.
    pub fn read_bytes(
        &self,
        offset: u64,
        len: usize,
        map: Option<&Arc<Mapping>>,
    ) -> io::Result<ReadBytes> {
        if let Some(m) = map.filter(|m| offset as usize + len <= m.len) {
            return Ok(ReadBytes::Mapped(
                m.clone(),
                offset as usize..offset as usize + len,
            ));
        }
        let mut buf = vec![0; len];
        self.file(Mode::ReadWrite)?
            .read_exact_at(&mut buf, offset)?;
        Ok(ReadBytes::Owned(buf))
    }
}
