//! Lookups, answered at once: a name found, or not; or, for a reader opening a name not
//! produced yet (`--wait`), a pending entry whose open waits until a producer publishes it
//! ([`DyadFs::wait_produced`], holding no thread: see [`super::waits`]).

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::attr::PENDING;
use super::caller::{Context, Credentials};
use super::found::Found;
use super::paths::split;
use super::tree::{Looked, Tree};
use super::waits::{Finish, Told, wait_on_a_thread};
use super::{Attr, DyadFs, Error};
use crate::core::names::{Name, now_ns};
use crate::core::source::Source;
use crate::core::sync::lock;

impl<S: Source> DyadFs<S> {
    /// Looks a name up for `caller`, at once. A name not published yet that the caller
    /// opens to read (a consumer, `--wait`) is a pending entry: a regular file of nothing,
    /// readable, never cached by the kernel, whose open waits for the name. A check or a
    /// creation of a name (a producer's `stat`, `cp`, `mkdir`) gets ENOENT, which leaves no
    /// negative entry in the kernel, so a later reader's open still waits.
    pub fn lookup(&self, parent: u64, name: &OsStr, caller: &dyn Context) -> Result<Attr, Error> {
        self.may(parent, caller, libc::X_OK)?;
        // Whether the name is the last of the path a reader opens (else a directory on the
        // way to it), once a wait is in question.
        let mut last = true;
        let waits = |path: &str| {
            let opening = tracing::debug_span!("caller").in_scope(|| caller.opening_to_read());
            let Some(opening) = opening else {
                // A check or a creation: answered at once, and remembered (`ToldAbsent`).
                self.told_absent.tell(caller, path);
                return None;
            };
            last = opening.last.is_empty() || opening.last == name.as_encoded_bytes();
            (!self.told_absent.told(caller, path)).then_some(Duration::ZERO)
        };
        match self.tree.lookup_then_wait(parent, name, true, waits)? {
            Looked::Found(attr) => Ok(attr),
            Looked::Pending(path) => {
                // The file it opens, or a directory on the way (looked up in as any other).
                let pending = Name {
                    dir: !last,
                    object: PENDING.into(),
                    mode: if last { 0o444 } else { 0o555 },
                    mtime_ns: now_ns(),
                    holder: self.tree.names.me(),
                    ..Name::default()
                };
                self.tree.upsert(path, &Found::Produced(pending), 1)
            }
        }
    }

    /// Whether `caller` may access inode `ino` as `mode` asks, where the mount judges rights by
    /// asking the shared file system as the caller (the node service: see [`super::rights`]);
    /// `Denied` (EACCES) if not. Elsewhere the kernel's check of the mode bits was the whole
    /// answer, and this says yes.
    pub fn may(&self, ino: u64, caller: &dyn Context, mode: i32) -> Result<(), Error> {
        let Some(rights) = self.rights.get() else {
            return Ok(());
        };
        let path = Tree::path_of(&*self.tree.node(ino)?);
        match rights.may(&path, caller, mode) {
            Some(false) => {
                self.stats().rights_denied.fetch_add(1, Ordering::Relaxed);
                Err(Error::Denied)
            }
            Some(true) | None => Ok(()),
        }
    }

    /// Whether an open of inode `ino` by `caller` with `flags` waits for its name to be
    /// published (`--wait`): a pending name's does, and so does an open to read a file being
    /// written on this node by another process (it is not published until its close: a
    /// consumer never reads a partial file; its writer reads what it wrote).
    pub fn open_waits(&self, ino: u64, caller: &dyn Context, flags: i32) -> bool {
        let Ok(node) = self.tree.node(ino) else {
            return false;
        };
        if lock(&node.attr).0.pending {
            return true;
        }
        if self.config.wait.is_zero() || flags & libc::O_ACCMODE != libc::O_RDONLY {
            return false;
        }
        let path = Tree::path_of(&node);
        self.tree.producer.staged(&path).is_some_and(|s| {
            let writer = s.writer_process.load(Ordering::Relaxed);
            !s.closed() && (writer == 0 || caller.process().map(|(p, _)| p) != Some(writer))
        })
    }

    /// The process of `caller` writes through handle `fh` (see [`Self::open_waits`]).
    pub fn note_writer(&self, fh: u64, caller: &dyn Context) {
        if let Ok(h) = self.tree.handles.get(fh)
            && let super::handles::Handle::Staged { staged, .. } = &*h
            && let Some((p, _)) = caller.process()
        {
            staged.writer_process.store(p, Ordering::Relaxed);
        }
    }

    /// An entry of directory `parent` that a listing hands the kernel with its attributes
    /// (READDIRPLUS): looked up as `lookup` does, the kernel's reference counted, never waited
    /// for (the name was just listed; one gone since then is `NotFound`).
    pub fn lookup_listed(&self, parent: u64, name: &OsStr) -> Result<Attr, Error> {
        let Looked::Found(attr) = self.tree.lookup_then_wait(parent, name, false, |_| None)? else {
            return Err(Error::NotFound);
        };
        self.stats()
            .listed_with_attrs
            .fetch_add(1, Ordering::Relaxed);
        Ok(attr)
    }

    /// Waits (`--wait`) for inode `ino`'s name to be published (a pending name, or a file
    /// another process is writing here: see [`Self::open_waits`]) holding no thread; then
    /// `done` is told, on one of the mount's waiting threads, whether `who` may open it as
    /// `flags` ask (the kernel judged a pending name's open by the pending entry's attributes,
    /// which let any reader in). A name still absent at the deadline is `NotFound`.
    pub fn wait_produced(
        self: &Arc<Self>,
        ino: u64,
        who: Credentials,
        flags: i32,
        done: Box<dyn FnOnce(Result<(), Error>) + Send>,
    ) {
        let path = match self.tree.node(ino) {
            Ok(node) => Tree::path_of(&node),
            Err(e) => return done(Err(e)),
        };
        self.stats().name_waits.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now() + self.config.wait;
        let (dir, name) = split(&path);
        let (dir, name) = (dir.to_string(), name.to_string());
        let names = self.tree.names.clone();
        let me = self.clone();
        let finish: Finish = Box::new(move |told| done(me.produced(&path, told, who, flags)));
        let watch = |wake| names.watch(&dir, &name, until, wake);
        let fallback = |wake| {
            wait_on_a_thread(
                self.tree.names.clone(),
                dir.clone(),
                name.clone(),
                until,
                wake,
            )
        };
        if let Err(e) = self.waits.start(until, watch, fallback, finish) {
            tracing::warn!(error = %e, "cannot wait for a name");
        }
    }

    /// Finishes a wait for `path`, which learnt `told`: published (not only created: a producer
    /// on this node may be writing it now, and a reader must not see it before its close), and
    /// `who` let in as `flags` ask.
    fn produced(&self, path: &str, told: Told, who: Credentials, flags: i32) -> Result<(), Error> {
        let (dir, name) = split(path);
        // At the deadline, one last look (for a word lost with a home that died).
        let told = match told {
            Some(told) => told,
            None => match self.tree.names.get(dir, name, Duration::ZERO) {
                Ok(Some(n)) => Ok(n),
                Ok(None) => return Err(Error::NotFound),
                Err(e) => Err(e),
            },
        };
        let published = match told {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(%path, error = %e, "waiting for a name failed");
                return Err(Error::NotFound);
            }
        };
        // The name as its home told it: not asked again (a round trip per hand-off), unless
        // something here took the path meanwhile.
        let found = match self.tree.resolve_here(path)? {
            Some(here) => here,
            None => self.tree.found_name(path, Ok(Some(published)))?,
        };
        let attr = self.tree.upsert(path.to_string(), &found, 0)?;
        let want = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => 4,
            libc::O_WRONLY => 2,
            _ => 6,
        };
        if attr.allows(&who, want) {
            Ok(())
        } else {
            Err(Error::Denied)
        }
    }
}
