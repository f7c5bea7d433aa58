//! `dyadfs prefetch`: hands a running mount the order in which a job will read its files, so
//! the daemon fills them ahead of the reader (see `fs::prefetch`). The list goes to the daemon
//! as a file of paths relative to the mount root, named in a getxattr of the root.

use std::io::{BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::daemon::UserError;
use crate::fs::prefetch::{MAX_HELD_BYTES, MAX_LIST_BYTES, MAX_PLANS, PATH_COST, PREFETCH_XATTR};

pub struct PrefetchConfig {
    pub mountpoint: PathBuf,
    /// The list (`-`: standard input): paths absolute under the mount or relative to its root.
    pub list: PathBuf,
    pub stream: String,
}

/// What the daemon answers.
#[derive(Debug, serde::Deserialize)]
pub struct Queued {
    pub files: u64,
    pub skipped: u64,
}

/// A list line as a path relative to the mount root, or `None` if it is outside the mount.
fn relative(mnt: &Path, line: &str) -> Option<String> {
    let p = Path::new(line);
    let rel = if p.is_absolute() {
        p.strip_prefix(mnt).ok()?
    } else {
        p
    };
    let s = rel.to_str()?;
    (!s.is_empty()).then(|| s.to_string())
}

pub fn prefetch(cfg: PrefetchConfig) -> Result<Queued, UserError> {
    if cfg.stream.is_empty() || cfg.stream.contains(':') {
        return Err(UserError::BadStream(cfg.stream));
    }
    let mnt = std::fs::canonicalize(&cfg.mountpoint).map_err(|source| UserError::WarmRead {
        path: cfg.mountpoint.clone(),
        source,
    })?;
    let read_err = |source| UserError::WarmRead {
        path: cfg.list.clone(),
        source,
    };
    let input: Box<dyn BufRead> = if cfg.list == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(&cfg.list).map_err(read_err)?,
        ))
    };
    let (tmp, file) = temp_file()?;
    // Copied a line at a time, buffered: the list is never held whole, and a line per write
    // would be a system call per listed file.
    let mut file = std::io::BufWriter::new(file);
    let mut outside = 0u64;
    let copied = copy_lines(input, &mnt, &mut file, &mut outside);
    let written = match copied {
        Err(Copy::Read(source)) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(read_err(source));
        }
        Err(Copy::Write(e)) => Err(e),
        Ok(()) => file.flush(),
    };
    let answer = written
        .map_err(|source| UserError::WarmRead {
            path: tmp.clone(),
            source,
        })
        .and_then(|()| {
            super::ask::<Queued>(
                &mnt,
                &format!("{PREFETCH_XATTR}{}:{}", cfg.stream, tmp.display()),
            )
        });
    let _ = std::fs::remove_file(&tmp);
    let mut q = answer.map_err(explained)?;
    q.skipped += outside;
    Ok(q)
}

/// Where copying a list failed.
enum Copy {
    Read(std::io::Error),
    Write(std::io::Error),
}

/// Copies `input`'s lines to `out` as paths relative to the mount root, counting those outside
/// it in `outside`.
fn copy_lines(
    input: impl BufRead,
    mnt: &Path,
    out: &mut impl Write,
    outside: &mut u64,
) -> Result<(), Copy> {
    for line in input.lines() {
        let line = line.map_err(Copy::Read)?;
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            continue;
        }
        match relative(mnt, line) {
            Some(r) => writeln!(out, "{r}").map_err(Copy::Write)?,
            None => *outside += 1,
        }
    }
    Ok(())
}

/// The daemon's refusals of a list in words: which of its bounds the list met.
fn explained(e: UserError) -> UserError {
    let UserError::Stats { path, source } = e else {
        return e;
    };
    let why = match source.raw_os_error() {
        Some(libc::E2BIG) => format!(
            "the mount refused the list: one user's prefetch lists may hold at most {} MiB over \
             all their streams, each path counting its length plus {} bytes (send a shorter \
             list, or cancel another stream's with an empty one)",
            MAX_HELD_BYTES >> 20,
            PATH_COST + 1
        ),
        Some(libc::EFBIG) => format!(
            "the mount refused the list: a list file may be at most {} MiB",
            MAX_LIST_BYTES >> 20
        ),
        Some(libc::EBUSY) => format!(
            "the mount refused the list: one user's lists are read one at a time, and one user \
             may have at most {MAX_PLANS} lists (try again when your other list is queued, or \
             cancel a stream's list with an empty one)"
        ),
        _ => return UserError::Stats { path, source },
    };
    UserError::Stats {
        path,
        source: std::io::Error::new(source.kind(), why),
    }
}

/// A new private file for the list (0600, never an existing name).
fn temp_file() -> Result<(PathBuf, std::fs::File), UserError> {
    let dir = std::env::temp_dir();
    let mut last = None;
    for i in 0..100u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = dir.join(format!(
            "dyadfs-prefetch-{}-{nanos}-{i}.list",
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            Err(e) => last = Some((path, e)),
        }
    }
    let (path, source) = last.expect("tried at least once");
    Err(UserError::WarmRead { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_lines_become_paths_relative_to_the_mount_root() {
        let m = Path::new("/dyad");
        assert_eq!(relative(m, "/dyad/a/b.npz").as_deref(), Some("a/b.npz"));
        assert_eq!(relative(m, "a/b.npz").as_deref(), Some("a/b.npz"));
        assert_eq!(relative(m, "/other/a"), None);
        assert_eq!(relative(m, "/dyad"), None);
    }
}
