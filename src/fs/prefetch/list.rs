//! A prefetch request and its list file: the attribute name parsed, and the list read for its
//! caller, line by line, within the bounds of [`super::MAX_LINE`], [`super::MAX_PATHS`] and
//! the bytes its user has left ([`super::MAX_HELD_BYTES`]), into one arena ([`Paths`]).

use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::paths::{Builder, Keys, Paths};
use super::{MAX_LINE, MAX_LIST_BYTES, PREFETCH_XATTR};
use crate::fs::Error;

/// Parses a request's attribute name: `Some((stream, list))` if it is one.
pub fn request(name: &str) -> Option<(&str, &Path)> {
    let rest = name.strip_prefix(PREFETCH_XATTR)?;
    let (stream, list) = rest.split_once(':')?;
    (!stream.is_empty() && list.starts_with('/')).then_some((stream, Path::new(list)))
}

/// A list whose paths would take its user past [`super::MAX_HELD_BYTES`] (E2BIG: `dyadfs
/// prefetch` says which bound).
pub(super) fn too_many_bytes() -> Error {
    Error::PrefetchList(std::io::Error::from_raw_os_error(libc::E2BIG))
}

/// Reads a list file for caller `uid`: it must be a regular file the caller owns (the daemon
/// may run as root; it reads nobody else's files). Returns the paths it accepts, in order and
/// indexed under `keys`, and how many lines it skipped (absolute, `..`, empty, longer than
/// [`MAX_LINE`], past [`super::MAX_PATHS`]). Refused as soon as its paths cost more than
/// `budget` bytes (what its user has left): never read whole first. No line is held whole but
/// those it accepts.
pub fn read_list(
    list: &Path,
    uid: u32,
    budget: usize,
    keys: &Keys,
) -> Result<(Paths, usize), Error> {
    // Looked at before it is opened for reading: opening a device (a terminal the daemon
    // would take as its controlling one, a watchdog) has effects of its own.
    let path = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(list)
        .map_err(Error::PrefetchList)?;
    let meta = path.metadata().map_err(Error::PrefetchList)?;
    if meta.file_type().is_symlink() {
        return Err(Error::PrefetchList(std::io::Error::from_raw_os_error(
            libc::ELOOP,
        )));
    }
    if !meta.is_file() || (uid != 0 && meta.uid() != uid) {
        return Err(Error::PrefetchList(std::io::Error::from_raw_os_error(
            libc::EACCES,
        )));
    }
    // The very file checked, reopened through its descriptor.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", path.as_raw_fd()))
        .map_err(Error::PrefetchList)?;
    if meta.len() > MAX_LIST_BYTES {
        return Err(Error::PrefetchList(std::io::Error::from_raw_os_error(
            libc::EFBIG,
        )));
    }
    let mut paths = Builder::new(meta.len() as usize, budget);
    let mut skipped = 0;
    let mut lines = Lines::new(BufReader::new(file));
    while let Some(line) = lines.next_line().map_err(Error::PrefetchList)? {
        let kept = match line {
            Line::Text(l) if !paths.full() => match std::str::from_utf8(l) {
                Ok(l) => paths
                    .push_with(|text| clean_into(l, text))
                    .map_err(|_| too_many_bytes())?,
                Err(_) => false,
            },
            _ => false,
        };
        skipped += usize::from(!kept);
    }
    Ok((paths.finish(keys), skipped))
}

/// A line of a list.
enum Line<'a> {
    /// Without its newline.
    Text(&'a [u8]),
    /// Longer than [`MAX_LINE`]: read past, not kept.
    TooLong,
}

/// A list's lines, read a line at a time into one buffer of at most [`MAX_LINE`] + 1 bytes: a
/// longer line is read past in the reader's own chunks, never held.
struct Lines<R> {
    r: R,
    buf: Vec<u8>,
}

impl<R: BufRead> Lines<R> {
    fn new(r: R) -> Lines<R> {
        Lines { r, buf: Vec::new() }
    }

    /// The next line, or `None` at the end.
    fn next_line(&mut self) -> std::io::Result<Option<Line<'_>>> {
        self.buf.clear();
        let limit = MAX_LINE as u64 + 1;
        if (&mut self.r).take(limit).read_until(b'\n', &mut self.buf)? == 0 {
            return Ok(None);
        }
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        } else if self.buf.len() > MAX_LINE {
            // Too long: the rest of it, up to and with its newline, is read past a chunk at a
            // time.
            loop {
                let chunk = self.r.fill_buf()?;
                if chunk.is_empty() {
                    break;
                }
                if let Some(i) = chunk.iter().position(|&b| b == b'\n') {
                    self.r.consume(i + 1);
                    break;
                }
                let n = chunk.len();
                self.r.consume(n);
            }
            return Ok(Some(Line::TooLong));
        }
        Ok(Some(Line::Text(&self.buf)))
    }
}

/// Appends a list line to `text` as a path relative to the mount root (`./` and repeated
/// slashes dropped); false if it is empty, absolute or climbs with `..` (what it appended is
/// then the caller's to drop).
fn clean_into(line: &str, text: &mut String) -> bool {
    if line.starts_with('/') {
        return false;
    }
    let start = text.len();
    for part in line.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if part == ".." {
            return false;
        }
        if text.len() > start {
            text.push('/');
        }
        text.push_str(part);
    }
    text.len() > start
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(line: &str) -> Option<String> {
        let mut text = String::new();
        clean_into(line, &mut text).then_some(text)
    }

    /// Reads `list` for `uid` with no budget but the list's own bounds.
    fn read(list: &Path, uid: u32) -> Result<(Vec<String>, usize), Error> {
        let (paths, skipped) = read_list(list, uid, usize::MAX, &Keys::new())?;
        Ok((
            (0..paths.len()).map(|i| paths.get(i).into()).collect(),
            skipped,
        ))
    }

    #[test]
    fn requests_and_list_lines_are_checked() {
        assert_eq!(
            request("user.dyadfs.prefetch:rank0:/tmp/l"),
            Some(("rank0", Path::new("/tmp/l")))
        );
        assert_eq!(request("user.dyadfs.prefetch:rank0:tmp/l"), None);
        assert_eq!(request("user.dyadfs.prefetch::/tmp/l"), None);
        assert_eq!(request("user.dyadfs.stats"), None);
        assert_eq!(clean("a//b/./c").as_deref(), Some("a/b/c"));
        assert_eq!(clean("/etc/passwd"), None);
        assert_eq!(clean("a/../../b"), None);
        assert_eq!(clean(""), None);
    }

    #[test]
    fn a_list_must_be_the_callers_own_regular_file() {
        let dir = std::env::temp_dir().join(format!("dyadfs-prefetch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let list = dir.join("l");
        std::fs::write(&list, "a\n/abs\n\nb/c\n../x\n").unwrap();
        let me = std::fs::metadata(&list).unwrap().uid();
        let (got, skipped) = read(&list, me).unwrap();
        assert_eq!(got, ["a", "b/c"]);
        assert_eq!(skipped, 3);
        let other = me.wrapping_add(1).max(1);
        assert_eq!(read(&list, other).unwrap_err().errno(), libc::EACCES);
        let link = dir.join("link");
        std::os::unix::fs::symlink(&list, &link).unwrap();
        assert_eq!(read(&link, me).unwrap_err().errno(), libc::ELOOP);
        assert!(read(&dir, me).is_err());
        // A device is refused, also for root, before it is opened for reading.
        assert_eq!(
            read(Path::new("/dev/null"), 0).unwrap_err().errno(),
            libc::EACCES
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A line longer than [`MAX_LINE`] (10 MiB here) is skipped and counted, and read past
    /// with no more than a line's buffer held; the lines around it, the longest allowed one
    /// among them, are kept.
    #[test]
    fn a_line_past_path_max_is_skipped_without_being_held() {
        let long = vec![b'x'; 10 << 20];
        let longest = "y".repeat(MAX_LINE);
        let mut text = b"a\n".to_vec();
        text.extend_from_slice(&long);
        text.extend_from_slice(format!("\n{longest}\nb").as_bytes());
        // A reader of small chunks: what the lines hold is their own buffer.
        let mut lines = Lines::new(BufReader::with_capacity(8192, &text[..]));
        let mut got = Vec::new();
        while let Some(line) = lines.next_line().unwrap() {
            got.push(match line {
                Line::Text(l) => String::from_utf8(l.to_vec()).unwrap(),
                Line::TooLong => "(too long)".into(),
            });
        }
        assert_eq!(got, ["a", "(too long)", longest.as_str(), "b"]);
        assert!(
            lines.buf.capacity() <= 2 * (MAX_LINE + 1),
            "{}",
            lines.buf.capacity()
        );

        let dir = std::env::temp_dir().join(format!("dyadfs-prefetch-long-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let list = dir.join("l");
        std::fs::write(&list, &text).unwrap();
        let me = std::fs::metadata(&list).unwrap().uid();
        let (paths, skipped) = read(&list, me).unwrap();
        assert_eq!(paths.len(), 3);
        assert_eq!(skipped, 1);
        let held: usize = paths.iter().map(|p| p.len()).sum();
        assert_eq!(held, 2 + MAX_LINE);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
