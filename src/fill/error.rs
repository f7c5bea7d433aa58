//! What filling a cache entry from a source can fail with. The file system gives each its errno
//! (`fs/error.rs`, the one table); the cluster's background copies log them.

use std::io;

use crate::cache::CacheError;

#[derive(Debug, thiserror::Error)]
pub enum FillError {
    #[error("chunk of {0} failed its checksum again after refetching")]
    Corrupt(String),
    #[error("source read failed: {0}")]
    Source(io::Error),
    /// A source broke the port's contract (a bug of the source, not of the data).
    #[error("the source {0}")]
    BadSource(&'static str),
    #[error(transparent)]
    Cache(#[from] CacheError),
}
