//! One anonymous mapping split into fixed-size slots. A [`Slot`] is exclusive ownership of one
//! slot; dropping it returns the slot to the pool and wakes a waiter (back pressure: callers
//! wait for a slot instead of allocating).

use crate::core::sync::lock;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub struct Slab {
    base: *mut u8,
    slot_size: usize,
    slots: usize,
    free: Mutex<Free>,
    freed: Condvar,
}

/// The slots not lent out, and how many takers wait for one: a slot returned with none waiting
/// wakes nobody (a condvar's notify is a futex system call whether or not anyone waits: one per
/// served or pulled chunk on both nodes).
struct Free {
    slots: Vec<usize>,
    waiting: usize,
}

// SAFETY: the mapping is plain memory; concurrent access is partitioned by slot ownership
// (a slot index is handed to one Slot at a time through the mutex-protected free list).
unsafe impl Send for Slab {}
// SAFETY: as above.
unsafe impl Sync for Slab {}

impl Slab {
    pub fn new(slots: usize, slot_size: usize) -> std::io::Result<Slab> {
        let len = slots * slot_size;
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a slab needs at least one non-empty slot",
            ));
        }
        // SAFETY: an anonymous private mapping; the result is checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        Slab::of_mapping(base, slots, slot_size)
    }

    /// The slab over a mapping just made (or its failure), all slots free.
    fn of_mapping(
        base: *mut libc::c_void,
        slots: usize,
        slot_size: usize,
    ) -> std::io::Result<Slab> {
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Slab {
            base: base as *mut u8,
            slot_size,
            slots,
            free: Mutex::new(Free {
                slots: (0..slots).rev().collect(),
                waiting: 0,
            }),
            freed: Condvar::new(),
        })
    }

    /// A slab in a memfd, to be shared with the data-plane process: the daemon's mapping and
    /// the descriptor.
    pub fn new_shared(
        slots: usize,
        slot_size: usize,
    ) -> std::io::Result<(Slab, std::os::fd::OwnedFd)> {
        use std::os::fd::FromRawFd;
        // SAFETY: a NUL-terminated name and flags; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"dyadfs-slab".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the descriptor was just created and is owned here only.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let file = std::fs::File::from(fd);
        file.set_len((slots * slot_size) as u64)?;
        // Its size is fixed for good: the data-plane process could otherwise shrink it under
        // the daemon's mapping (a SIGBUS at the next access).
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: a live memfd created with MFD_ALLOW_SEALING; the result is checked.
        if unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                libc::F_ADD_SEALS,
                seals,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        let fd = std::os::fd::OwnedFd::from(file);
        let slab = Slab::map_shared(&fd, slots, slot_size)?;
        Ok((slab, fd))
    }

    /// Maps a shared slab's memfd (the daemon's side or the data-plane process's).
    pub fn map_shared(
        fd: &std::os::fd::OwnedFd,
        slots: usize,
        slot_size: usize,
    ) -> std::io::Result<Slab> {
        use std::os::fd::AsRawFd;
        let len = slots * slot_size;
        if len == 0 {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a shared mapping of a memfd of at least `len` bytes; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        Slab::of_mapping(base, slots, slot_size)
    }

    /// Takes the slot `index` if it is free (the data-plane process, told by the daemon which
    /// of the shared slots a get goes into).
    pub fn take_index(self: &Arc<Self>, index: usize) -> Option<Slot> {
        let mut free = lock(&self.free);
        let at = free.slots.iter().position(|&i| i == index)?;
        free.slots.swap_remove(at);
        Some(Slot {
            slab: self.clone(),
            index,
        })
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.slots * self.slot_size
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Takes a free slot, waiting up to `timeout` for one to be returned.
    pub fn take(self: &Arc<Self>, timeout: Duration) -> Option<Slot> {
        let deadline = Instant::now() + timeout;
        let mut free = lock(&self.free);
        loop {
            if let Some(index) = free.slots.pop() {
                return Some(Slot {
                    slab: self.clone(),
                    index,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            free.waiting += 1;
            free = self
                .freed
                .wait_timeout(free, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            free.waiting -= 1;
        }
    }

    /// The slot whose memory starts at `addr`, if it is currently lent out (used by a holder
    /// to release a slot named by a peer).
    pub fn index_of(&self, addr: u64) -> Option<usize> {
        let off = addr.checked_sub(self.base as u64)? as usize;
        (off.is_multiple_of(self.slot_size) && off / self.slot_size < self.slots)
            .then_some(off / self.slot_size)
    }

    pub fn free_slots(&self) -> usize {
        lock(&self.free).slots.len()
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping created in new(); no Slot can be alive (each holds an
        // Arc to the slab) and UCX has unregistered it (the worker thread ends first).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len()) };
    }
}

pub struct Slot {
    slab: Arc<Slab>,
    index: usize,
}

impl Slot {
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn capacity(&self) -> usize {
        self.slab.slot_size
    }

    pub fn as_ptr(&self) -> *mut u8 {
        // SAFETY: index < slots, so the offset stays inside the mapping.
        unsafe { self.slab.base.add(self.index * self.slab.slot_size) }
    }

    /// The slot's address as a peer names it in an RMA get.
    pub fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }

    pub fn bytes(&self, len: usize) -> &[u8] {
        assert!(len <= self.capacity());
        // SAFETY: this Slot owns the slot exclusively and the range is inside it.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), len) }
    }

    pub fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.capacity());
        // SAFETY: this Slot owns the slot exclusively (and &mut self), the range is inside it.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), len) }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut free = lock(&self.slab.free);
        free.slots.push(self.index);
        if free.waiting > 0 {
            self.slab.freed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_exclusive_and_come_back() {
        let slab = Arc::new(Slab::new(2, 4096).unwrap());
        let mut a = slab.take(Duration::ZERO).unwrap();
        let b = slab.take(Duration::ZERO).unwrap();
        assert_ne!(a.addr(), b.addr());
        assert_eq!(
            slab.index_of(b.addr())
                .map(|i| i * 4096 + slab.base() as usize),
            Some(b.addr() as usize)
        );
        assert!(
            slab.take(Duration::from_millis(10)).is_none(),
            "back pressure"
        );
        a.bytes_mut(3).copy_from_slice(b"abc");
        let s2 = slab.clone();
        let waiter = std::thread::spawn(move || s2.take(Duration::from_secs(5)).is_some());
        drop(b);
        assert!(waiter.join().unwrap());
        assert_eq!(a.bytes(3), b"abc");
    }
}
