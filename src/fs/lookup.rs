//! Lookups: a name found at once, or waited for (`--wait`) until a producer publishes it; the
//! wait can be left to a thread other than the FUSE thread that asked.

use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Attr, DyadFs, Error, caller, join};
use crate::core::source::Source;

/// What a lookup found.
pub enum Looked {
    Found(Attr),
    /// Nothing yet, and the name is to be waited for (`--wait`).
    Wait,
}

impl<S: Source> DyadFs<S> {
    /// Looks a name up for thread `caller`; a name not published yet is waited for (`--wait`)
    /// only when the caller is opening it to read (a consumer): a check or a creation of a
    /// name (a producer's `stat`, `cp`, `mkdir`) is answered at once, and its ENOENT leaves no
    /// negative entry in the kernel, so a later reader's open still waits.
    pub fn lookup(&self, parent: u64, name: &OsStr, caller: u32) -> Result<Attr, Error> {
        match self.lookup_at_once(parent, name, caller)? {
            Looked::Found(attr) => Ok(attr),
            Looked::Wait => self.lookup_waiting(parent, name),
        }
    }

    /// [`Self::lookup`] without the wait: says so when the name is to be waited for, so that
    /// the wait can be left to a thread other than the one that asked.
    pub fn lookup_at_once(&self, parent: u64, name: &OsStr, caller: u32) -> Result<Looked, Error> {
        self.lookup_then_wait(parent, name, true, |path| {
            if !caller::is_opening_to_read(caller) {
                // A check or a creation: answered at once, and remembered (`ToldAbsent`).
                self.told_absent.tell(caller, path);
                return None;
            }
            (!self.told_absent.told(caller, path)).then_some(Duration::ZERO)
        })
    }

    /// The lookup [`Self::lookup_at_once`] said to wait for: waits up to `--wait` for the name.
    pub fn lookup_waiting(&self, parent: u64, name: &OsStr) -> Result<Attr, Error> {
        match self.lookup_then_wait(parent, name, false, |_| Some(self.config.wait))? {
            Looked::Found(attr) => Ok(attr),
            Looked::Wait => Err(Error::NotFound),
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
        let found = match self.resolve(&path, Duration::ZERO) {
            Err(Error::NotFound) if !self.config.wait.is_zero() => match wait(&path) {
                Some(d) if d.is_zero() => return Ok(Looked::Wait),
                Some(d) => self.resolve(&path, d)?,
                None => return Err(Error::NotFound),
            },
            r => r?,
        };
        self.upsert(path, &found, 1).map(Looked::Found)
    }
}
