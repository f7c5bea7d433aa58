//! A passthrough backing file registered with the kernel for this FUSE connection: its id
//! goes in open replies (either transport), and the kernel lets go of it when it is dropped.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

/// `FUSE_DEV_IOC_BACKING_OPEN`: `_IOW(229, 1, struct fuse_backing_map)` (16 bytes).
const BACKING_OPEN: libc::c_ulong = 0x4010_e501;
/// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)`.
const BACKING_CLOSE: libc::c_ulong = 0x4004_e502;

/// `struct fuse_backing_map`.
#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

pub struct Passthrough {
    id: u32,
    dev: Arc<OwnedFd>,
}

impl Passthrough {
    /// Registers `file` as a backing file on the connection of `dev` (a /dev/fuse descriptor).
    pub fn open(dev: &Arc<OwnedFd>, file: impl AsFd) -> io::Result<Passthrough> {
        let map = BackingMap {
            fd: file.as_fd().as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // SAFETY: the ioctl reads one `fuse_backing_map` (repr(C), matching the kernel's) from
        // a live local; both descriptors are open for the call.
        let id = unsafe { libc::ioctl(dev.as_raw_fd(), BACKING_OPEN, &map as *const BackingMap) };
        if id < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Passthrough {
            id: id as u32,
            dev: dev.clone(),
        })
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Passthrough {
    fn drop(&mut self) {
        // SAFETY: the ioctl reads one u32 from a live local; the descriptor is open (held).
        let r = unsafe { libc::ioctl(self.dev.as_raw_fd(), BACKING_CLOSE, &self.id as *const u32) };
        if r < 0 {
            tracing::debug!(error = %io::Error::last_os_error(), id = self.id, "closing a backing id failed");
        }
    }
}
