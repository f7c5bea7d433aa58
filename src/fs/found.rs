//! What a path of the namespace resolves to: a file being written here, an entry of the shared
//! file system, or a name some node published.

use std::sync::Arc;
use std::time::Instant;

use super::attr::Attr;
use super::error::Error;
use super::write::Staged;
use crate::backing::BackingStat;
use crate::core::names::{FILE_SIZE_MAX, Name};

/// What a path resolves to.
pub(super) enum Found {
    Staged(Arc<Staged>),
    Backing(BackingStat),
    Produced(Name),
}

impl Found {
    /// Its attributes as inode `ino`.
    pub(super) fn attr(&self, ino: u64) -> Result<Attr, Error> {
        match self {
            Found::Staged(s) => Attr::from_staged(ino, s),
            Found::Backing(b) => Ok(Attr::from_backing(ino, b)),
            Found::Produced(n) => Ok(Attr::from_name(ino, n)),
        }
    }

    /// When its attributes were read: what their TTL counts from (a stat of the shared file
    /// system may be a remembered one, see [`remembered`](super::remembered)).
    pub(super) fn read_at(&self) -> Instant {
        match self {
            Found::Backing(b) => b.read,
            Found::Staged(_) | Found::Produced(_) => Instant::now(),
        }
    }
}

/// Whether a produced name may be opened as a file: a directory, a special file or a forged
/// size (none is produced so large: refused before its chunk table is allocated) may not.
pub(super) fn openable(n: &Name) -> Result<(), Error> {
    if n.dir {
        return Err(Error::IsDir);
    }
    if !n.is_file() {
        return Err(Error::Invalid);
    }
    if n.size > FILE_SIZE_MAX {
        return Err(Error::TooLarge {
            size: n.size,
            max: FILE_SIZE_MAX,
        });
    }
    Ok(())
}
