//! The close path of a file being written. Of the closes of its writable handles, one ends
//! the writing ([`Produce::writer_closed`]): the opener's own `close()` of its only writer, once
//! something was written (FUSE flush, so an error reaches `close()`), else the last release.
//! That close finishes the file ([`Produce::finish_write`]) in two steps: [`Produce::seal`]
//! makes its bytes an immutable object of a fixed version, kept in this node's cache, then
//! [`Produce::publish`] points its name at that object, for every node to see.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Produce;
use crate::core::Version;
use crate::core::names::{Name, NameMeta, now_ns};
use crate::core::source::Source;
use crate::core::sync::lock;
use crate::fs::Error;
use crate::fs::found::Found;
use crate::fs::handles::Handle;
use crate::fs::paths::split;
use crate::fs::write::Staged;

/// Which close of a writable handle of a file being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::fs) enum Close {
    /// A `close()` by the process that opened the handle, which holds the file no more; the
    /// handle stays open until its release.
    Flush,
    /// The kernel let go of the handle: every descriptor of it is closed.
    Release,
}

/// What sealing made of a file's bytes: the object kept here, at its version for good.
struct Sealed {
    object: String,
    version: Version,
}

impl<S: Source> Produce<S> {
    /// The last close of an open file (the kernel sends it once every descriptor of the open
    /// is closed, including dups and forked copies, shortly after the last close returns). The
    /// last writable handle of a file being written finishes it, unless a close (`flush`) did.
    pub(in crate::fs) fn release(&self, fh: u64) -> Result<(), Error> {
        let handle = self.tree.handles.remove(fh);
        match handle.as_deref() {
            Some(Handle::Cached(h)) => h.entry.unpin(),
            Some(Handle::Staged {
                staged,
                writable: true,
            }) => return self.writer_closed(staged, Close::Release),
            _ => {}
        }
        Ok(())
    }

    /// A `close()` by the process that opened handle `fh`, which holds the file no more (see
    /// `caller::held_elsewhere`): a file being written whose only writable handle this is, and
    /// that was written to, is finished now, so a failure reaches `close()` (and the name is
    /// published when `close()` returns, not a few ms after). The handle then takes no more
    /// writes: a write through a descriptor of it that escaped the check (passed to an
    /// unrelated process) fails with EBADF. Other handles have nothing to do.
    pub fn flush(&self, fh: u64) -> Result<(), Error> {
        match &*self.tree.handles.get(fh)? {
            Handle::Staged {
                staged,
                writable: true,
            } => self.writer_closed(staged, Close::Flush),
            _ => Ok(()),
        }
    }

    /// A writable handle of `staged` closed (`close`); the close that ends the writing
    /// finishes the file. Under the `finishing` lock: a rename, unlink or change of attributes
    /// that finds no writer left waits for the file to be finished.
    pub(in crate::fs) fn writer_closed(
        &self,
        staged: &Arc<Staged>,
        close: Close,
    ) -> Result<(), Error> {
        let _finishing = lock(&staged.finishing);
        let ends = match close {
            // Not while another writer has it open (the last release finishes it), nor before
            // anything was written (a shell's redirection closes its first descriptor before
            // the command writes through the dup).
            Close::Flush => {
                let only = staged.writers.load(Ordering::Relaxed) == 1;
                // A file refused its first write ends here too: its close says why.
                let dirty = staged.dirty.load(Ordering::Relaxed) || staged.write_error().is_some();
                if only && !dirty {
                    // Its release finishes it: requests that need it finished wait for that.
                    staged.release_expected.store(true, Ordering::Relaxed);
                }
                only && dirty
            }
            Close::Release => staged.writers.fetch_sub(1, Ordering::Relaxed) == 1,
        };
        if !ends || staged.finished_at_flush.load(Ordering::Relaxed) {
            return Ok(());
        }
        if close == Close::Flush {
            staged.finished_at_flush.store(true, Ordering::Relaxed);
        }
        self.finish_write(staged)
    }

    /// Finishes a file being written: seals it, then publishes it (neither if it was unlinked
    /// meanwhile). It stays staged (visible here) until its name is published, so no reader on
    /// this node falls between the two and finds the previous version; then, whatever
    /// happened, it is staged no more.
    pub(in crate::fs) fn finish_write(&self, staged: &Arc<Staged>) -> Result<(), Error> {
        let r = if staged.unlinked.load(Ordering::Relaxed) {
            Ok(())
        } else {
            // Spans of their own in a `--trace`: where a producer's close spends its time.
            tracing::debug_span!("seal")
                .in_scope(|| self.seal(staged))
                .and_then(|sealed| {
                    tracing::debug_span!("publish").in_scope(|| self.publish(staged, sealed))
                })
        };
        self.producer.unstage(staged);
        r
    }

    /// Makes a staged file's bytes an immutable object of a fixed version, kept in this node's
    /// cache (its only copy). A file a write of which failed is not sealed.
    fn seal(&self, staged: &Staged) -> Result<Sealed, Error> {
        if let Some(e) = staged.write_error() {
            // A write failed: a consumer would read less (or other) than the producer wrote.
            // Its bytes go now rather than at the last release: the disk may be full.
            let _ = staged.file.set_len(0);
            return Err(Error::Write(e));
        }
        let object = self.producer.new_object();
        // The staged file's descriptor holds its bytes (moved into the cache or not) until the
        // last release: a file that is not published gives them back now.
        let version = self.producer.seal(staged, &object).map_err(|e| {
            let _ = staged.file.set_len(0);
            Error::Write(e)
        })?;
        Ok(Sealed { object, version })
    }

    /// Points the sealed file's name (or its hard link record) at its object, for every node
    /// to see, and lets the version it replaces go.
    fn publish(&self, staged: &Staged, sealed: Sealed) -> Result<(), Error> {
        let Sealed { object, version } = sealed;
        let path = lock(&staged.path).clone();
        // Until its name is set, a failure releases the object: kept with nothing naming it, it
        // would hold its bytes for good.
        let not_named = |e: Error| {
            self.producer.released(&object, version, true);
            let _ = staged.file.set_len(0);
            e
        };
        let set = *lock(&staged.set);
        let name = Name {
            dir: false,
            object: object.clone(),
            size: version.size,
            mtime_ns: version.mtime_ns,
            mode: set.mode,
            holder: self.names.me(),
            uid: set.owner.0,
            gid: set.owner.1,
            meta: NameMeta {
                atime_ns: set.atime_ns,
                mtime_ns: set.mtime_ns,
                ctime_ns: set.ctime_ns,
                ..NameMeta::default()
            },
        };
        if let Some(key) = staged.inode.get()
            && let Some(mut r) = self.tree.record(key).map_err(not_named)?
        {
            // A new version of a hard-linked file: every name of it sees the new bytes.
            let old = r.clone();
            (r.object, r.size, r.mtime_ns) = (name.object, name.size, name.mtime_ns);
            (r.mode, r.uid, r.gid) = (name.mode, name.uid, name.gid);
            r.meta.mtime_ns = set.mtime_ns;
            r.meta.ctime_ns = Some(set.ctime_ns.unwrap_or_else(now_ns));
            self.set_record(key, Some(r.clone())).map_err(not_named)?;
            self.release_object(&old, false);
            self.tree
                .stats
                .files_produced
                .fetch_add(1, Ordering::Relaxed);
            self.tree.upsert(path, &Found::Produced(r), 0)?;
            return Ok(());
        }
        let (dir, file) = split(&path);
        let old = self
            .names
            .set(dir, file, Some(name.clone()))
            .map_err(|e| not_named(Error::Names(e)))?;
        if let Some(old) = old.filter(|o| o.object != name.object) {
            // The old version stays readable by whoever has it open, then may be evicted.
            self.unname(&old, false)?;
        }
        self.tree
            .stats
            .files_produced
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%path, object = %name.object, size = version.size, "published");
        self.tree.upsert(path, &Found::Produced(name), 0)?;
        Ok(())
    }
}
