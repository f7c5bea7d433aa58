//! Bytes of a cached file handed to a reader: a view of a shared mapping of the data file (the
//! FUSE reply is then written from the page cache, no copy of ours first) or a buffer.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

/// Bytes read from the cache for a reader: a view of a mapping of the data file (the FUSE
/// reply is then written from the page cache, with no copy into a buffer of ours first), or a
/// buffer of their own.
pub enum ReadBytes {
    Owned(Vec<u8>),
    /// Read into block-aligned memory (see [`Aligned`]).
    Aligned(Aligned),
    Mapped(Arc<Mapping>, Range<usize>),
    /// Read into the thread's kept buffer (see [`Pooled`]).
    Pooled(Pooled),
}

/// Bytes read into a buffer the thread keeps between reads (given back when dropped): a packed
/// object's read is a copy from the page cache into warm memory, with no allocation, zeroing or
/// page fault per read, and no mapping whose pages would count in the daemon's RSS.
pub struct Pooled {
    buf: Vec<u8>,
    len: usize,
}

/// A kept buffer is at most this large (the largest packed object is one chunk).
const POOLED_MAX: usize = 4 << 20;

thread_local! {
    static POOL: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Pooled {
    /// `len` bytes of the thread's buffer (grown if need be), for `fill` to overwrite.
    pub(super) fn fill(
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<Pooled> {
        let mut buf = POOL.take();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let r = fill(&mut buf[..len]);
        let pooled = Pooled { buf, len };
        r.map(|()| pooled)
    }

    /// `len` bytes of the thread's kept buffer, their content whatever it held: for a caller
    /// that overwrites them all before serving them.
    pub fn with_len(len: usize) -> Pooled {
        Pooled::fill(len, |_| Ok(())).expect("a fill that cannot fail")
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.len() <= POOLED_MAX {
            POOL.set(buf);
        }
    }
}

/// Bytes read for a reader into memory aligned for O_DIRECT: those not in the page cache are
/// read from the disk straight into it, so a daemon-served read neither copies them through the
/// cache file's page cache nor keeps them there beside the mount's own copy.
pub struct Aligned {
    ptr: std::ptr::NonNull<u8>,
    /// Bytes allocated: `len` rounded up to whole blocks.
    cap: usize,
    len: usize,
}

/// O_DIRECT's alignment of memory, offsets and lengths.
const BLOCK: usize = crate::core::source::DIRECT_ALIGN;

// SAFETY: `Aligned` owns its allocation outright (like a `Vec<u8>`): moving it to another thread
// or sharing `&Aligned` hands out nothing but the bytes.
unsafe impl Send for Aligned {}
// SAFETY: as above; only `&[u8]` is reachable through a shared reference.
unsafe impl Sync for Aligned {}

impl Aligned {
    pub(super) fn zeroed(len: usize) -> Aligned {
        let cap = len.next_multiple_of(BLOCK).max(BLOCK);
        let layout = Self::layout(cap);
        // SAFETY: the layout's size is at least one block.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Aligned { ptr, cap, len }
    }

    fn layout(cap: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(cap, BLOCK).expect("a block-aligned size")
    }

    /// All the allocated bytes, for a read of up to `cap` bytes.
    pub(super) fn room(&mut self) -> &mut [u8] {
        // SAFETY: `cap` bytes are allocated, initialised (zeroed) and borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl std::ops::Deref for Aligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len <= cap` initialised bytes, borrowed immutably with `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) };
    }
}

impl std::ops::Deref for ReadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBytes::Owned(v) => v,
            ReadBytes::Aligned(a) => a,
            ReadBytes::Mapped(m, r) => &m.bytes()[r.clone()],
            ReadBytes::Pooled(p) => &p.buf[..p.len],
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
    pub(super) fn new(file: &File, len: usize) -> Option<Mapping> {
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

    /// Its length in bytes (the data file's size).
    pub(super) fn size(&self) -> usize {
        self.len
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
