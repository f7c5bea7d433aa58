//! The in-memory [`Source`] the unit tests of the fill engine, the file system and the kernel
//! adapter read through: it can fail its next reads, or be slow.

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::core::Version;
use crate::core::source::{Origin, Source};

/// An in-memory source that counts reads, can be slowed down, and can fail its next reads.
#[derive(Default)]
pub(crate) struct MemSource {
    pub(crate) files: Mutex<HashMap<String, (Version, Vec<u8>)>>,
    pub(crate) reads: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) fail_next: AtomicU64,
    pub(crate) delay: Option<Duration>,
}

impl MemSource {
    pub(crate) fn add(&self, path: &str, data: Vec<u8>) -> Version {
        self.add_version(path, data, 1)
    }

    pub(crate) fn add_version(&self, path: &str, data: Vec<u8>, mtime_ns: i64) -> Version {
        let version = Version {
            size: data.len() as u64,
            mtime_ns,
        };
        self.files
            .lock()
            .unwrap()
            .insert(path.into(), (version, data));
        version
    }
}

impl Source for MemSource {
    fn read_at(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<Origin> {
        if let Some(d) = self.delay {
            std::thread::sleep(d);
        }
        if self
            .fail_next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(io::Error::other("injected failure"));
        }
        let files = self.files.lock().unwrap();
        let (v, data) = files.get(path).ok_or(io::ErrorKind::NotFound)?;
        if *v != version {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        let start = offset as usize;
        buf.copy_from_slice(&data[start..start + buf.len()]);
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(Origin::Backing)
    }
}
