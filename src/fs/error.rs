//! The one place where every failure of the filesystem becomes an errno. Each subsystem has its
//! own error type; they meet here, and the conversion is one exhaustive `match`, so a new
//! variant forces an errno decision.

use std::io;

use crate::cache::CacheError;
use crate::fill::FillError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("read-only file system (the backing tree is never modified)")]
    ReadOnly,
    #[error("file exists")]
    Exists,
    /// `--no-open`: the kernel is told opens (and flushes) are not implemented, after which it
    /// opens files without asking and never sends either again.
    #[error("opens are the kernel's own (--no-open)")]
    OpensUnasked,
    #[error("invalid argument")]
    Invalid,
    #[error("name or symlink target too long")]
    NameTooLong,
    #[error("hard links are not supported in the produced namespace")]
    NoLinks,
    #[error("directory not empty")]
    NotEmpty,
    #[error("only root or the mount's owner may ask that")]
    NotOwner,
    #[error("permission denied")]
    Denied,
    #[error("a non-empty produced directory cannot be renamed (copy it instead)")]
    CrossDevice,
    #[error("writing a produced file: {0}")]
    Write(io::Error),
    #[error("produced namespace: {0}")]
    Names(io::Error),
    #[error("unknown file handle {0}")]
    BadHandle(u64),
    #[error("no such attribute")]
    NoAttr,
    #[error("buffer too small for the reply")]
    Range,
    #[error(transparent)]
    Fill(#[from] FillError),
    #[error("backing store: {0}")]
    Backing(io::Error),
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// A produced file grown past what a cache may hold ([`FILE_SIZE_MAX`], or the capacity):
    /// no seal could take it.
    ///
    /// [`FILE_SIZE_MAX`]: crate::core::names::FILE_SIZE_MAX
    #[error("a produced file of {size} bytes (at most {max} here)")]
    TooLarge { size: u64, max: u64 },
    /// A produced file grown past the room the capacity leaves beside the files kept here.
    #[error("a produced file of {size} bytes (room for {room} beside the files kept here)")]
    NoRoom { size: u64, room: u64 },
    /// Past `--max-staged-per-user`: what one uid writes or keeps here.
    #[error("user {uid} would hold {wanted} bytes of produced files here (at most {cap})")]
    OverQuota { uid: u32, wanted: u64, cap: u64 },
    #[error("this user has as many prefetch lists as it may, or one is being read")]
    PrefetchFull,
    #[error("prefetch list: {0}")]
    PrefetchList(io::Error),
    /// An open for writing kept finding the file finished by other writers as it got to it.
    #[error("the file was finished by other writers each time this open reached it")]
    Contended,
}

impl Error {
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::ReadOnly => libc::EROFS,
            Error::Exists => libc::EEXIST,
            Error::OpensUnasked => libc::ENOSYS,
            Error::Invalid => libc::EINVAL,
            Error::NameTooLong => libc::ENAMETOOLONG,
            // What link(2) says on a file system that does not make hard links.
            Error::NoLinks => libc::EPERM,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NotOwner => libc::EPERM,
            Error::Denied => libc::EACCES,
            // What rename(2) says when it cannot move: `mv` then copies and removes.
            Error::CrossDevice => libc::EXDEV,
            Error::Write(e) => e.raw_os_error().unwrap_or(libc::EIO),
            // The name home is unreachable: the application sees an I/O error, never a hang;
            // a name refused because its owner has as many as one user may, a quota's error.
            Error::Names(e) => match e.raw_os_error() {
                Some(libc::EDQUOT) => libc::EDQUOT,
                _ => libc::EIO,
            },
            Error::BadHandle(_) => libc::EBADF,
            Error::NoAttr => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::Fill(FillError::Corrupt(_) | FillError::BadSource(_)) => libc::EIO,
            // A source that vanished or changed under a read is an I/O error to the reader.
            Error::Fill(FillError::Source(e)) => match e.raw_os_error() {
                Some(libc::ESTALE) => libc::ESTALE,
                _ => libc::EIO,
            },
            Error::Fill(FillError::Cache(e)) | Error::Cache(e) => cache_errno(e),
            Error::Backing(e) => match e.kind() {
                io::ErrorKind::NotFound => libc::ENOENT,
                _ => e.raw_os_error().unwrap_or(libc::EIO),
            },
            // As a file size limit would say: no write can make it fit.
            Error::TooLarge { .. } => libc::EFBIG,
            Error::NoRoom { .. } => libc::ENOSPC,
            // As the disk quota the root daemon's writes escape would say.
            Error::OverQuota { .. } => libc::EDQUOT,
            Error::PrefetchFull => libc::EBUSY,
            Error::PrefetchList(e) => e.raw_os_error().unwrap_or(libc::EIO),
            // Busy with writers: the opener may try again.
            Error::Contended => libc::EBUSY,
        }
    }
}

/// A cache's failure, as the reader of the file sees it.
fn cache_errno(e: &CacheError) -> i32 {
    match e {
        CacheError::Io(_) | CacheError::Corrupt(_) => libc::EIO,
        CacheError::Locked(_) => libc::EBUSY,
        CacheError::FillTimeout(_) => libc::ETIMEDOUT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fill_fails_with_the_errno_of_its_cause() {
        let stale = FillError::Source(io::Error::from_raw_os_error(libc::ESTALE));
        assert_eq!(Error::from(stale).errno(), libc::ESTALE);
        let gone = FillError::Source(io::Error::from_raw_os_error(libc::ECONNRESET));
        assert_eq!(Error::from(gone).errno(), libc::EIO);
        assert_eq!(
            Error::from(FillError::Corrupt("f".into())).errno(),
            libc::EIO
        );
        let locked = CacheError::Locked("/nvme".into());
        assert_eq!(Error::from(FillError::Cache(locked)).errno(), libc::EBUSY);
        let timeout = CacheError::FillTimeout("f".into());
        assert_eq!(Error::from(timeout).errno(), libc::ETIMEDOUT);
    }
}
