//! The shared file system in memory, for unit tests: entries made without files, and any call
//! made to fail with an errno until healed, or to be slow. Its bytes are the
//! business of a [`Source`](crate::core::source::Source) double (`core::mem_source`).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::port::{BackingStat, Meta, SharedFs};
use crate::core::Kind;
use crate::core::sync::lock;

/// A call of [`SharedFs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    Stat,
    List,
    ReadLink,
    Statvfs,
}

#[derive(Default)]
pub struct MemShared {
    /// Every entry but the root, by path, with a symlink's target.
    entries: Mutex<BTreeMap<String, (Meta, Option<PathBuf>)>>,
    /// Calls that fail, with their errno.
    failing: Mutex<HashMap<Call, i32>>,
    /// How long each call takes.
    delay: Mutex<Option<Duration>>,
    /// Calls made, by kind.
    made: Mutex<HashMap<Call, u64>>,
}

fn meta(kind: Kind, size: u64, mode: u32, mtime_ns: i64) -> Meta {
    let t = (
        mtime_ns.div_euclid(1_000_000_000),
        mtime_ns.rem_euclid(1_000_000_000),
    );
    Meta {
        kind,
        size,
        blocks: size.div_ceil(512),
        mode,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        atime: t,
        mtime: t,
        ctime: t,
    }
}

impl MemShared {
    /// A regular file (and its parent directories).
    pub fn file(&self, path: &str, size: u64, mtime_ns: i64) {
        self.parents(path);
        let m = meta(Kind::File, size, 0o644, mtime_ns);
        lock(&self.entries).insert(path.into(), (m, None));
    }

    /// A symlink to `target` (and its parent directories).
    pub fn symlink(&self, path: &str, target: &str) {
        self.parents(path);
        let m = meta(Kind::Symlink, target.len() as u64, 0o777, 1);
        lock(&self.entries).insert(path.into(), (m, Some(target.into())));
    }

    fn parents(&self, path: &str) {
        let mut at = 0;
        while let Some(i) = path[at..].find('/') {
            let dir = &path[..at + i];
            let m = meta(Kind::Dir, 4096, 0o755, 1);
            lock(&self.entries).entry(dir.into()).or_insert((m, None));
            at += i + 1;
        }
    }

    /// `call` fails with `errno` from now on (the file system's background threads make calls
    /// too: a failure is not used up by whichever comes first).
    pub fn fail(&self, call: Call, errno: i32) {
        lock(&self.failing).insert(call, errno);
    }

    /// `call` works again.
    pub fn heal(&self, call: Call) {
        lock(&self.failing).remove(&call);
    }

    /// Every call takes `d` from now on.
    pub fn slow(&self, d: Duration) {
        *lock(&self.delay) = Some(d);
    }

    /// How many times `call` was made.
    pub fn made(&self, call: Call) -> u64 {
        lock(&self.made).get(&call).copied().unwrap_or(0)
    }

    /// Counts the call, sleeps its delay, and fails it if it is due to.
    fn enter(&self, call: Call) -> io::Result<()> {
        *lock(&self.made).entry(call).or_default() += 1;
        if let Some(d) = *lock(&self.delay) {
            std::thread::sleep(d);
        }
        match lock(&self.failing).get(&call) {
            Some(&errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }

    fn entry(&self, rel: &str) -> io::Result<(Meta, Option<PathBuf>)> {
        if rel.is_empty() {
            return Ok((meta(Kind::Dir, 4096, 0o755, 1), None));
        }
        lock(&self.entries)
            .get(rel)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }
}

impl SharedFs for MemShared {
    fn stat(&self, rel: &str) -> io::Result<BackingStat> {
        self.enter(Call::Stat)?;
        let (meta, _) = self.entry(rel)?;
        Ok(BackingStat {
            meta,
            allowed: 0o7777,
            read: Instant::now(),
        })
    }

    fn list(&self, rel: &str) -> io::Result<Vec<(OsString, Kind)>> {
        self.enter(Call::List)?;
        if !self.entry(rel)?.0.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let prefix = if rel.is_empty() {
            String::new()
        } else {
            format!("{rel}/")
        };
        Ok(lock(&self.entries)
            .iter()
            .filter_map(|(p, (m, _))| {
                let name = p.strip_prefix(&prefix)?;
                (!name.contains('/')).then(|| (OsString::from(name), m.kind))
            })
            .collect())
    }

    fn read_link(&self, rel: &str) -> io::Result<PathBuf> {
        self.enter(Call::ReadLink)?;
        self.entry(rel)?
            .1
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn statvfs(&self) -> io::Result<libc::statvfs> {
        self.enter(Call::Statvfs)?;
        // SAFETY: statvfs is plain data, for which all zeroes is a valid value.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        (s.f_bsize, s.f_frsize, s.f_blocks, s.f_bfree, s.f_bavail) =
            (4096, 4096, 1 << 20, 1 << 19, 1 << 19);
        s.f_namemax = 255;
        Ok(s)
    }
}
