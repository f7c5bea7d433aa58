//! Bytes handed to the kernel's page cache of an inode (`FUSE_NOTIFY_STORE`), written on the
//! session's /dev/fuse descriptor (notifications take that way under either transport).
//!
//! A file the daemon serves itself is read by a program in as many READs as its access pattern
//! makes: `np.load` of a 256 KiB `.npz` sample sends six (the zip directory at the end, the
//! member's header, its data in pieces), each a round trip to the daemon. Stored whole at its
//! open, with the open's reply keeping the pages, it is read with none.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// `FUSE_NOTIFY_STORE`, as a notification's `error` field carries it.
const NOTIFY_STORE: i32 = 4;

/// `struct fuse_out_header` then `struct fuse_notify_store_out`.
#[repr(C)]
struct StoreHeader {
    len: u32,
    error: i32,
    unique: u64,
    nodeid: u64,
    offset: u64,
    size: u32,
    padding: u32,
}

/// Stores `bytes` at `offset` of inode `ino` in the kernel's page cache.
pub fn store(dev: &OwnedFd, ino: u64, offset: u64, bytes: &[u8]) -> io::Result<()> {
    let size = u32::try_from(bytes.len()).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    let header = StoreHeader {
        len: std::mem::size_of::<StoreHeader>() as u32 + size,
        error: NOTIFY_STORE,
        unique: 0,
        nodeid: ino,
        offset,
        size,
        padding: 0,
    };
    let iov = [
        libc::iovec {
            iov_base: &header as *const StoreHeader as *mut libc::c_void,
            iov_len: std::mem::size_of::<StoreHeader>(),
        },
        libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        },
    ];
    // SAFETY: both iovecs point at live memory of the given lengths (a repr(C) header matching
    // the kernel's, and `bytes`), which writev only reads; the descriptor is open (borrowed).
    let n = unsafe { libc::writev(dev.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_has_the_kernels_layout() {
        // fuse_out_header (16 bytes) and fuse_notify_store_out (24 bytes), no padding between.
        assert_eq!(std::mem::size_of::<StoreHeader>(), 40);
        assert_eq!(std::mem::offset_of!(StoreHeader, nodeid), 16);
        assert_eq!(std::mem::offset_of!(StoreHeader, size), 32);
    }
}
