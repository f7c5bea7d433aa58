//! What goes wrong in the cache, and how it reaches a caller that speaks errno.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("corrupt cache entry: {0}")]
    Corrupt(String),
    #[error("cache directory {0} is in use by another dyadfs daemon")]
    Locked(PathBuf),
    #[error("timed out waiting for another reader's fill of {0}")]
    FillTimeout(String),
}

/// A cache error as an I/O error with the same errno where it has one (a producer's close
/// then says ENOSPC, not EIO).
impl From<CacheError> for io::Error {
    fn from(e: CacheError) -> io::Error {
        match e {
            CacheError::Io(e) => e,
            e => io::Error::other(e),
        }
    }
}
