//! Lookups, answered at once: a name found, or not; or, for a reader opening a name not
//! produced yet (`--wait`), a pending entry whose open waits until a producer publishes it
//! ([`DyadFs::wait_produced`], holding no thread: see `waits.rs`).

use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::attr::PENDING;
use super::found::Found;
use super::paths::join;
use super::{Attr, DyadFs, Error, caller};
use crate::core::names::{Name, now_ns};
use crate::core::source::Source;
use crate::core::sync::lock;

/// What a lookup found.
pub enum Looked {
    Found(Attr),
    /// Nothing yet at this path, and a reader opens it (`--wait`): answer with a pending entry.
    Pending(String),
}

impl<S: Source> DyadFs<S> {
    /// Looks a name up for thread `caller`, at once. A name not published yet that the caller
    /// opens to read (a consumer, `--wait`) is a pending entry: a regular file of nothing,
    /// readable, never cached by the kernel, whose open waits for the name. A check or a
    /// creation of a name (a producer's `stat`, `cp`, `mkdir`) gets ENOENT, which leaves no
    /// negative entry in the kernel, so a later reader's open still waits.
    pub fn lookup(&self, parent: u64, name: &OsStr, caller: u32) -> Result<Attr, Error> {
        // Whether the name is the last of the path a reader opens (else a directory on the
        // way to it), once a wait is in question.
        let mut last = true;
        let waits = |path: &str| {
            let opening =
                tracing::debug_span!("caller").in_scope(|| caller::opening_to_read(caller));
            let Some(opening) = opening else {
                // A check or a creation: answered at once, and remembered (`ToldAbsent`).
                self.told_absent.tell(caller, path);
                return None;
            };
            last = opening.last.is_empty() || opening.last == name.as_encoded_bytes();
            (!self.told_absent.told(caller, path)).then_some(Duration::ZERO)
        };
        match self.lookup_then_wait(parent, name, true, waits)? {
            Looked::Found(attr) => Ok(attr),
            Looked::Pending(path) => {
                // The file it opens, or a directory on the way (looked up in as any other).
                let pending = Name {
                    dir: !last,
                    object: PENDING.into(),
                    mode: if last { 0o444 } else { 0o555 },
                    mtime_ns: now_ns(),
                    holder: self.names.me(),
                    ..Name::default()
                };
                self.upsert(path, &Found::Produced(pending), 1)
            }
        }
    }

    /// Whether an open of inode `ino` by thread `tid` with `flags` waits for its name to be
    /// published (`--wait`): a pending name's does, and so does an open to read a file being
    /// written on this node by another process (it is not published until its close: a
    /// consumer never reads a partial file; its writer reads what it wrote).
    pub fn open_waits(&self, ino: u64, tid: u32, flags: i32) -> bool {
        let Ok(node) = self.node(ino) else {
            return false;
        };
        if lock(&node.attr).0.pending {
            return true;
        }
        if self.config.wait.is_zero() || flags & libc::O_ACCMODE != libc::O_RDONLY {
            return false;
        }
        let path = Self::path_of(&node);
        self.producer.staged(&path).is_some_and(|s| {
            let writer = s.writer_process.load(Ordering::Relaxed);
            !s.closed() && (writer == 0 || caller::process_of(tid) != Some(writer))
        })
    }

    /// The process of thread `tid` writes through handle `fh` (see [`Self::open_waits`]).
    pub fn note_writer(&self, fh: u64, tid: u32) {
        if let Ok(h) = self.handles.get(fh)
            && let super::handles::Handle::Staged { staged, .. } = &*h
            && let Some(p) = caller::process_of(tid)
        {
            staged.writer_process.store(p, Ordering::Relaxed);
        }
    }

    /// An entry of directory `parent` that a listing hands the kernel with its attributes
    /// (READDIRPLUS): looked up as `lookup` does, the kernel's reference counted, never waited
    /// for (the name was just listed; one gone since then is `NotFound`).
    pub fn lookup_listed(&self, parent: u64, name: &OsStr) -> Result<Attr, Error> {
        let Looked::Found(attr) = self.lookup_then_wait(parent, name, false, |_| None)? else {
            return Err(Error::NotFound);
        };
        let stats = self.stats();
        stats.listed_with_attrs.fetch_add(1, Ordering::Relaxed);
        Ok(attr)
    }

    /// `lookup`, where a name not found is waited for (`--wait`) if `wait(path)` says so (asked
    /// only then: telling whether the caller opens the name to read reads /proc). `kernel`: a LOOKUP
    /// of the kernel's, which tells the stat read-ahead where a scan is.
    /// `wait`: for a name not found, how long to wait for it (`None`: not at all; zero: say
    /// [`Looked::Wait`] instead of waiting), asked only if `--wait` is set.
    fn lookup_then_wait(
        &self,
        parent: u64,
        name: &OsStr,
        kernel: bool,
        wait: impl FnOnce(&str) -> Option<Duration>,
    ) -> Result<Looked, Error> {
        let parent = self.node(parent)?;
        let dir = Self::path_of(&parent);
        if kernel {
            self.stat_ahead.looked_up(&dir, name);
        }
        let path = join(&dir, name);
        let known = {
            let inodes = self.inodes.read().unwrap_or_else(|e| e.into_inner());
            inodes
                .by_path
                .get(&path)
                .and_then(|i| inodes.nodes.get(i).cloned())
        };
        // (A hard-linked file's node may be known by another of its names: then this one is
        // looked up itself.)
        if let Some(node) = known.filter(|n| Self::path_of(n) == path) {
            match self.refreshed(&node, true) {
                Err(Error::NotFound) => {}
                Err(e) => return Err(e),
                // Unless forgotten meanwhile (then it is made anew below).
                Ok(attr) if self.take_ref(attr.ino) => return Ok(Looked::Found(attr)),
                Ok(_) => {}
            }
        }
        let resolved =
            tracing::debug_span!("resolve").in_scope(|| self.resolve(&path, Duration::ZERO));
        let found = match resolved {
            Err(Error::NotFound) if !self.config.wait.is_zero() => match wait(&path) {
                Some(d) if d.is_zero() => return Ok(Looked::Pending(path)),
                Some(d) => self.resolve(&path, d)?,
                None => return Err(Error::NotFound),
            },
            r => r?,
        };
        self.upsert(path, &found, 1).map(Looked::Found)
    }
}
