//! The backing store: the dataset's directory on the shared parallel file system. dyadfs only
//! ever reads it. It gives the namespace (stat, listings, symlinks) and is the source of last
//! resort for file bytes.

use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Arc;

use super::Kind;
use super::read::{Origin, Source};
use crate::cache::Version;
use crate::cache::files::DataFiles;

pub struct BackingStore {
    root: PathBuf,
    /// Idle cache descriptors to close when the process runs out of them (see `relieving`).
    relief: Option<Arc<DataFiles>>,
}

/// The version of a file as the cache records it: (size, mtime).
pub fn version_of(meta: &Metadata) -> Version {
    Version {
        size: meta.len(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
    }
}

impl BackingStore {
    pub fn new(root: PathBuf) -> Self {
        BackingStore { root, relief: None }
    }

    /// Opens that find the process out of descriptors close the cache's idle ones and retry.
    pub fn relieving(mut self, files: Arc<DataFiles>) -> Self {
        self.relief = Some(files);
        self
    }

    fn open(&self, rel: &str) -> io::Result<File> {
        let path = self.path(rel);
        match &self.relief {
            Some(files) => files.open_retrying(|| File::open(&path)),
            None => File::open(path),
        }
    }

    /// The backing path of a path relative to the mount root ("" is the root).
    pub fn path(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    pub fn stat(&self, rel: &str) -> io::Result<Metadata> {
        std::fs::symlink_metadata(self.path(rel))
    }

    /// Every entry of a directory with its type, from the directory alone (no stat per entry
    /// where the file system reports types, as every Linux one does).
    pub fn list(&self, rel: &str) -> io::Result<Vec<(OsString, Kind)>> {
        let mut out = Vec::new();
        let dir = match &self.relief {
            Some(files) => files.open_retrying(|| std::fs::read_dir(self.path(rel)))?,
            None => std::fs::read_dir(self.path(rel))?,
        };
        for entry in dir {
            let entry = entry?;
            // An entry removed between readdir and a fallback stat is simply not listed.
            if let Ok(ft) = entry.file_type() {
                out.push((entry.file_name(), Kind::of(ft)));
            }
        }
        Ok(out)
    }

    pub fn read_link(&self, rel: &str) -> io::Result<PathBuf> {
        std::fs::read_link(self.path(rel))
    }
}

impl Source for BackingStore {
    fn read_at(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<Origin> {
        // A produced object is not a backing path (and would join as an absolute one).
        if crate::locator::names::is_object(path) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let file = self.open(path)?;
        // Never mix two versions of a file in one cached copy.
        if version_of(&file.metadata()?) != version {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        file.read_exact_at(buf, offset)?;
        Ok(Origin::Backing)
    }
}
