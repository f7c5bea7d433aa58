//! The backing store: the dataset's directory on the shared parallel file system. dyadfs only
//! ever reads it. It gives the namespace (stat, listings, symlinks) and is the source of last
//! resort for file bytes.
//!
//! Every path is resolved beneath the root by the kernel (`openat2` with `RESOLVE_BENEATH`), not
//! by a string check: a symlink in the dataset (or one swapped in after a lookup) never leads a
//! read out of it, and a path that is not relative and normalised is refused outright (see
//! [`crate::core::paths`]).
//!
//! The file system reaches it through [`SharedFs`], so its unit tests put `memory`'s double in
//! its place, which can fail any call; a managed directory's is an [`EmptyTree`]; `acl` says
//! what a file's POSIX ACL lets the mount present.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

mod acl;
mod empty;
#[cfg(test)]
pub(crate) mod memory;
mod port;
pub mod sample;

pub use empty::EmptyTree;
pub use port::{BackingStat, Meta, SharedFs};

use crate::cache::files::DataFiles;
use crate::core::Kind;
use crate::core::Version;
use crate::core::source::{
    DIRECT_ALIGN, FillSink, Origin, Source, with_aligned_scratch, with_scratch,
};

pub struct BackingStore {
    root: PathBuf,
    /// The root, opened once: every path is resolved beneath it.
    root_fd: Option<OwnedFd>,
    /// Idle cache descriptors to close when the process runs out of them (see `relieving`).
    relief: Option<Arc<DataFiles>>,
    /// Whom every open of the shared file system is made as (see `acting_as`); the process's
    /// own ids where `None`.
    acting: Option<crate::sys::identity::Ids>,
}

impl BackingStore {
    /// A store over `root`; if the root cannot be opened, every access fails with that error.
    pub fn new(root: PathBuf) -> Self {
        let root_fd = CString::new(root.as_os_str().as_encoded_bytes())
            .ok()
            .and_then(|c| {
                // SAFETY: a valid NUL-terminated path; the result is checked.
                let fd = unsafe {
                    libc::open(
                        c.as_ptr(),
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                };
                // SAFETY: a descriptor just opened and owned by nothing else.
                (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
            });
        BackingStore {
            root,
            root_fd,
            relief: None,
            acting: None,
        }
    }

    /// A store over the directory `root_fd` (opened `O_PATH`), which `root` named when it was
    /// opened: nothing is resolved by the path again (the node service opens a user's dataset
    /// as that user, and a swap of the path since cannot hand root another directory).
    pub fn beneath(root: PathBuf, root_fd: OwnedFd) -> Self {
        BackingStore {
            root,
            root_fd: Some(root_fd),
            relief: None,
            acting: None,
        }
    }

    /// Every open of the shared file system is made as `ids` (the node service's mount of a
    /// user: its fills read what that user may read, never with root's rights, and a shared
    /// file system that squashes root still serves them).
    pub fn acting_as(mut self, ids: crate::sys::identity::Ids) -> Self {
        self.acting = Some(ids);
        self
    }

    /// Runs `f` as the store's user, if it has one.
    fn as_its_user<T>(&self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        match &self.acting {
            Some(ids) => crate::sys::identity::as_user(ids, f)?,
            None => f(),
        }
    }

    /// Opens that find the process out of descriptors close the cache's idle ones and retry.
    pub fn relieving(mut self, files: Arc<DataFiles>) -> Self {
        self.relief = Some(files);
        self
    }

    /// Opens `rel` (a relative, normalised path; "" is the root) beneath the root with `flags`
    /// (read-only, close-on-exec added). Symlinks resolve only within the root.
    fn open_beneath(&self, rel: &str, flags: i32) -> io::Result<File> {
        use crate::core::paths::PathError;
        crate::core::paths::dataset_path(rel).map_err(|e| {
            io::Error::from_raw_os_error(match e {
                PathError::TooLong(_) | PathError::NameTooLong(_) => libc::ENAMETOOLONG,
                _ => libc::EINVAL,
            })
        })?;
        let root = self
            .root_fd
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let c = CString::new(if rel.is_empty() { "." } else { rel })
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: open_how is plain data; every field is set below.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | flags) as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        let open = || {
            // SAFETY: a live directory descriptor, a NUL-terminated path and a valid open_how
            // of the size passed, for the call only; the result is checked.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    root.as_raw_fd(),
                    c.as_ptr(),
                    &how as *const libc::open_how,
                    std::mem::size_of::<libc::open_how>(),
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a descriptor just opened and owned by nothing else.
            Ok(unsafe { File::from_raw_fd(fd as i32) })
        };
        // What a file holds is read as the store's user, always; where a path is only looked
        // at (`O_PATH`: its attributes, after the caller was judged allowed to search the
        // directory), by the process first, as the user only where the process may not (a
        // file system that squashes root): one identity switch per lookup cost a stat 40%
        // more (`scripts/bench_node.sh`).
        let open = || match &self.acting {
            Some(ids) if flags & libc::O_PATH != 0 => match open() {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                    crate::sys::identity::as_user(ids, open)?
                }
                looked => looked,
            },
            _ => self.as_its_user(open),
        };
        match &self.relief {
            Some(files) => files.open_retrying(open),
            None => open(),
        }
    }

    /// The attributes of `rel` itself (a symlink is not followed), with the bits its POSIX
    /// ACL lets the mount present.
    fn stat_beneath(&self, rel: &str) -> io::Result<BackingStat> {
        let file = self.open_beneath(rel, libc::O_PATH | libc::O_NOFOLLOW)?;
        let meta = Meta::of(&file.metadata()?);
        let allowed = if meta.kind == Kind::Symlink {
            0o7777
        } else {
            acl_bits(&file, rel)
        };
        Ok(BackingStat {
            meta,
            allowed,
            read: Instant::now(),
        })
    }

    /// Every entry of a directory with its type, from the directory alone (no stat per entry
    /// where the file system reports types, as every Linux one does).
    fn list_beneath(&self, rel: &str) -> io::Result<Vec<(OsString, Kind)>> {
        let dir = self.open_beneath(rel, libc::O_DIRECTORY)?;
        let mut out = Vec::new();
        // The directory is read through the descriptor just resolved beneath the root (opened
        // again through /proc: as the store's user too).
        let entries =
            self.as_its_user(|| std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())))?;
        for entry in entries {
            let entry = entry?;
            // An entry removed between readdir and a fallback stat is simply not listed.
            if let Ok(ft) = entry.file_type() {
                out.push((entry.file_name(), Kind::of(ft)));
            }
        }
        Ok(out)
    }

    fn read_link_beneath(&self, rel: &str) -> io::Result<PathBuf> {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let parent = self.open_beneath(dir, libc::O_PATH | libc::O_DIRECTORY)?;
        let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: a live directory descriptor, a NUL-terminated name and a buffer of the
        // length passed, for the call only; the result is checked.
        let n = unsafe {
            libc::readlinkat(
                parent.as_raw_fd(),
                c.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(PathBuf::from(OsString::from_vec(buf)))
    }
}

impl BackingStore {
    /// The file `path` opened for reading, if it is still at `version`.
    fn open_at_version(&self, path: &str, version: Version) -> io::Result<File> {
        // A produced object is not a backing path (and would join as an absolute one).
        if crate::core::names::is_object(path) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let file = self.open_beneath(path, 0)?;
        // Never mix two versions of a file in one cached copy.
        if crate::core::version_of(&file.metadata()?) != version {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        Ok(file)
    }
}

impl SharedFs for BackingStore {
    fn stat(&self, rel: &str) -> io::Result<BackingStat> {
        self.stat_beneath(rel)
    }

    fn list(&self, rel: &str) -> io::Result<Vec<(OsString, Kind)>> {
        self.list_beneath(rel)
    }

    fn read_link(&self, rel: &str) -> io::Result<PathBuf> {
        self.read_link_beneath(rel)
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        crate::sys::statvfs(&self.root)
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
        self.open_at_version(path, version)?
            .read_exact_at(buf, offset)?;
        Ok(Origin::Backing)
    }

    /// A fill's bytes not in the page cache are read from the shared file system straight into
    /// block-aligned memory (O_DIRECT): the cache keeps its own copy, so the shared file's
    /// pages would only be a second copy in the node's memory, and copying out of them cost
    /// a fifth of the daemon's CPU per fill of a 256 KiB file (`perf record` of the daemon over
    /// 2048 fills). Bytes in the page cache already, an unaligned offset, or a file system
    /// that refuses O_DIRECT: read through the page cache.
    fn read_into(
        &self,
        path: &str,
        version: Version,
        offset: u64,
        len: u64,
        sink: FillSink<'_>,
    ) -> io::Result<Origin> {
        let file = self.open_at_version(path, version)?;
        let len = len as usize;
        let direct = offset.is_multiple_of(DIRECT_ALIGN as u64)
            && crate::sys::pages_cached(&file, offset, len) == Some(false)
            && crate::sys::set_direct(&file, true).is_ok();
        if direct {
            let padded = len.next_multiple_of(DIRECT_ALIGN);
            let read =
                with_aligned_scratch(padded, |buf| match read_direct(&file, buf, offset, len) {
                    Ok(true) => sink(offset, &buf[..len], None).map(|()| true),
                    other => other,
                });
            if read? {
                return Ok(Origin::Backing);
            }
            // Refused after all (some file systems take the flag, then fail the read).
            crate::sys::set_direct(&file, false)?;
        }
        with_scratch(len, |buf| {
            file.read_exact_at(buf, offset)?;
            sink(offset, buf, None)?;
            Ok(Origin::Backing)
        })
    }
}

/// Reads `len` bytes at `offset` of `file` (opened O_DIRECT) into `buf` (aligned, `len` rounded
/// up to whole blocks); `Ok(false)` if the file system refused a read (EINVAL: it cannot, or a
/// short read left the next one unaligned): read it another way. A file shorter than `len` is
/// an error, as `read_exact_at` says.
fn read_direct(file: &File, buf: &mut [u8], offset: u64, len: usize) -> io::Result<bool> {
    match crate::sys::read_at_least(file, buf, offset, len) {
        Ok(n) if n >= len => Ok(true),
        Ok(_) => Err(io::ErrorKind::UnexpectedEof.into()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The bits `file` (opened `O_PATH`, `rel` in the dataset) may present, from its access ACL.
fn acl_bits(file: &File, rel: &str) -> u16 {
    // (Every backing stat asks: the path and a first buffer stay on the stack; a fd's xattrs
    // are not readable through an O_PATH descriptor itself.)
    let path = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("no NUL");
    let got = |buf: &mut [u8]| {
        // SAFETY: NUL-terminated path and name and a buffer of the length passed, for the call
        // only; the result is checked.
        let n = unsafe {
            libc::getxattr(
                path.as_ptr(),
                acl::ACL_XATTR.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        (n >= 0)
            .then_some(n as usize)
            .ok_or_else(io::Error::last_os_error)
    };
    let mut small = [0u8; 1024];
    let mut large = Vec::new();
    // Fails closed: only "no ACL here" means the mode bits are all; an ACL that cannot be
    // read (an I/O error, one larger than 64 KiB) leaves the owner's bits only.
    const OWNER_ONLY: u16 = 0o7700;
    let no_acl = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP));
    let acl = match got(&mut small) {
        Ok(n) => &small[..n],
        Err(e) if e.raw_os_error() == Some(libc::ERANGE) => {
            large.resize(64 << 10, 0);
            match got(&mut large) {
                Ok(n) => &large[..n],
                Err(e) if no_acl(&e) => return 0o7777,
                Err(_) => return OWNER_ONLY,
            }
        }
        // ENODATA (no ACL) or EOPNOTSUPP (none on this file system): the mode bits are all.
        Err(e) if no_acl(&e) => return 0o7777,
        Err(_) => return OWNER_ONLY,
    };
    let allowed = acl::allowed_bits(acl).unwrap_or(OWNER_ONLY);
    static TOLD: std::sync::Once = std::sync::Once::new();
    TOLD.call_once(|| {
        tracing::warn!(
            path = rel,
            "a backing file has a POSIX ACL: the mount presents mode bits narrowed to what its \
             entries allow everyone (users that named entries grant more read by the mode bits)"
        )
    });
    allowed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store acting as a user opens and lists only what that user may: root's file of mode
    /// 0600 is refused to it (as a file system squashing root would refuse root), and
    /// the thread is root again after.
    #[test]
    fn a_store_acting_as_a_user_reads_with_its_rights_only() {
        if crate::sys::euid() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("dyadfs-backing-as-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("closed")).unwrap();
        std::fs::write(dir.join("open"), b"o").unwrap();
        std::fs::write(dir.join("mine"), b"m").unwrap();
        std::fs::set_permissions(dir.join("mine"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(dir.join("closed"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let nobody = crate::sys::identity::Ids {
            uid: 65534,
            gid: 65534,
            groups: vec![],
        };
        let store = BackingStore::new(dir.clone()).acting_as(nobody);
        assert!(store.open_beneath("open", 0).is_ok());
        let denied = |r: io::Result<File>| r.unwrap_err().raw_os_error() == Some(libc::EACCES);
        assert!(denied(store.open_beneath("mine", 0)));
        // Its attributes are the process's to look at (the caller was judged before).
        assert!(store.stat("mine").is_ok());
        let listed = store.list("closed").unwrap_err();
        assert_eq!(listed.raw_os_error(), Some(libc::EACCES));
        assert_eq!(store.list("").unwrap().len(), 3);
        // The process's own store, on the same thread after: root's rights.
        assert!(
            BackingStore::new(dir.clone())
                .open_beneath("mine", 0)
                .is_ok()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A fill of bytes the page cache does not hold reads them around it (none of the shared
    /// file's pages is cached afterwards), and hands the same bytes as a buffered read: whole
    /// blocks, a tail shorter than a block, and a range at a chunk offset.
    #[test]
    fn fills_read_uncached_bytes_around_the_page_cache() {
        let dir = std::env::temp_dir().join(format!("dyadfs-backing-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let bytes: Vec<u8> = (0..(300 << 10) + 123)
            .map(|i: u32| (i * 7 + i / 4096) as u8)
            .collect();
        std::fs::write(dir.join("f"), &bytes).unwrap();
        let file = File::open(dir.join("f")).unwrap();
        file.sync_all().unwrap();
        let store = BackingStore::new(dir.clone());
        let version = crate::core::version_of(&file.metadata().unwrap());
        for (offset, len) in [
            (0, bytes.len()),
            (256 << 10, bytes.len() - (256 << 10)),
            (4096, 8192),
        ] {
            // SAFETY: posix_fadvise on a descriptor we hold; no memory is involved.
            let r =
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(r, 0);
            let uncached = crate::sys::pages_cached(&file, 0, bytes.len()) == Some(false);
            let mut got = Vec::new();
            let mut sink = |off: u64, b: &[u8], crc: Option<u32>| {
                assert_eq!((off, crc), (offset as u64 + got.len() as u64, None));
                got.extend_from_slice(b);
                Ok(())
            };
            let origin = store
                .read_into("f", version, offset as u64, len as u64, &mut sink)
                .unwrap();
            assert_eq!(origin, Origin::Backing);
            assert!(
                got == bytes[offset..offset + len],
                "bytes at {offset} differ"
            );
            if uncached && crate::sys::set_direct(&file, true).is_ok() {
                crate::sys::set_direct(&file, false).unwrap();
                assert_eq!(
                    crate::sys::pages_cached(&file, offset as u64, len),
                    Some(false),
                    "read through the page cache"
                );
            }
        }
        // A version that is not the file's: ESTALE, nothing handed over.
        let stale = Version { size: 1, ..version };
        let mut sink = |_: u64, _: &[u8], _: Option<u32>| -> io::Result<()> {
            panic!("bytes of another version")
        };
        let e = store.read_into("f", stale, 0, 1, &mut sink).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
