//! Files produced on this node. A file being written lives in `<ssd>/staging/`, visible only on
//! this node; when its last writable handle closes it is *sealed*: taken into the cache as an
//! immutable object (see `locator::names`) that this node keeps, then published by name. A
//! daemon that dies mid-write never seals: its staging files are discarded at the next start.
//!
//! The objects this node keeps (the only copy of what it produced) are listed in `<ssd>/kept`,
//! so a restarted daemon keeps them too: a log of `SIZE MTIME OBJECT UID` (kept, charged to
//! UID: see [`super::quota`]; a line of an older version has no UID and is charged to nobody)
//! and `- OBJECT` (released) lines, appended to per publish and rewritten whole at start and when it holds
//! more released lines than kept ones (rewriting it whole on every publish made the n-th
//! produced file cost n writes).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Error;
use super::quota::{Charge, Quota};
use crate::cache::Cache;
use crate::core::Version;
use crate::core::names::FILE_SIZE_MAX;
use crate::core::paths::OBJECT_PREFIX;
use crate::core::sync::lock;

/// A file being written on this node.
pub struct Staged {
    /// Its path under the mount (a rename moves it).
    pub path: Mutex<String>,
    pub file: File,
    pub staging_path: PathBuf,
    /// What users set on it (chmod, chown, utimes), published with it.
    pub set: Mutex<SetAttrs>,
    /// Open writable handles; the last one to close finishes the file (see `super::close`).
    pub writers: AtomicUsize,
    /// The process that opened it for writing (0: not known): its own opens to read it do
    /// not wait for its close (`--wait`), others' do.
    pub writer_process: AtomicU32,
    /// Unlinked before it was sealed: it is never published.
    pub unlinked: AtomicBool,
    /// A new version of a hard-linked file: the key of the record it is published to.
    pub inode: std::sync::OnceLock<String>,
    /// Held while a close decides whether it ends the writing and, if so, finishes the file
    /// (seals and publishes it): a rename, unlink or change of attributes that finds no writer
    /// left waits for it, then changes the published name.
    pub finishing: Mutex<()>,
    /// Finished at a `close()` (FUSE flush) of its only writable handle, before that handle's
    /// release: the handle takes no more writes.
    pub finished_at_flush: AtomicBool,
    /// Written to (or truncated) since it was staged. A close before any write finishes nothing:
    /// a shell's `> file` opens the file, `dup2`s it onto stdout and closes the original
    /// before the command writes a byte.
    pub dirty: AtomicBool,
    /// Its opener closed its only writable handle before writing (FUSE flush) and nobody else
    /// holds it: the kernel's release, which finishes it, is on its way (it is sent after
    /// `close()` returns, and may be handled after the caller's next request).
    pub release_expected: AtomicBool,
    /// Set (and `ended_cv` notified) once it is staged no more: finished, or given up.
    pub ended: Mutex<bool>,
    pub ended_cv: std::sync::Condvar,
    /// The errno of a write (or sync) that failed since it was last emptied, 0 if none: its
    /// bytes are not what the producer wrote, so it is never published (see
    /// [`Staged::failed`]).
    pub write_error: AtomicI32,
    /// Its length, held against its owner's `--max-staged-per-user` until it is dropped or
    /// sealed.
    pub charge: Charge,
}

impl Staged {
    /// Records that a write to it failed with `e`; returns `e`.
    pub fn failed(&self, e: io::Error) -> io::Error {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        self.write_error.store(errno, Ordering::Relaxed);
        e
    }

    /// The error of a failed write, unless the file was emptied since.
    pub fn write_error(&self) -> Option<io::Error> {
        match self.write_error.load(Ordering::Relaxed) {
            0 => None,
            errno => Some(io::Error::from_raw_os_error(errno)),
        }
    }

    /// Truncates it to `size` (refused with EDQUOT past its owner's cap); emptied, it no
    /// longer holds a failed write's bytes.
    pub fn set_len(&self, size: u64) -> Result<(), Error> {
        self.charge.resize(size, false)?;
        self.file.set_len(size).map_err(Error::Write)?;
        if size == 0 {
            self.write_error.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether no more writes will come to it: its writable handles are all released, or it
    /// was finished at a close (it is being or has been published; wait for `finishing`).
    pub fn closed(&self) -> bool {
        self.writers.load(Ordering::Relaxed) == 0 || self.finished_at_flush.load(Ordering::Relaxed)
    }

    /// Waits (at most `within`) for a release the kernel is sending (see
    /// [`Staged::release_expected`]) to finish the file; `true` if it ended.
    pub fn await_release(&self, within: std::time::Duration) -> bool {
        if !self.release_expected.load(Ordering::Relaxed) {
            return *lock(&self.ended);
        }
        let ended = lock(&self.ended);
        let (ended, _) = self
            .ended_cv
            .wait_timeout_while(ended, within, |e| !*e)
            .unwrap_or_else(|e| e.into_inner());
        *ended
    }
}

/// How long a request waits for the release the kernel sends after a writer's `close()`
/// (see [`Staged::release_expected`]).
pub const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The attributes of a file being written that are not its bytes'.
#[derive(Debug, Clone, Copy)]
pub struct SetAttrs {
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// User and group: at first, those of the process that created it.
    pub owner: (u32, u32),
    /// Times set by `utimensat` (`None`: the staging file's own).
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
    pub ctime_ns: Option<i64>,
}

/// An object kept here as the only copy.
#[derive(Debug, Clone, Copy)]
struct Kept {
    version: Version,
    /// Whose `--max-staged-per-user` it counts against (`None`: listed by an older version).
    uid: Option<u32>,
}

pub struct Producer {
    cache: Arc<Cache>,
    quota: Arc<Quota>,
    staging: PathBuf,
    kept_path: PathBuf,
    node: u32,
    /// Staged files by path.
    staged: Mutex<HashMap<String, Arc<Staged>>>,
    /// Objects kept as the only copy.
    kept: Mutex<BTreeMap<String, Kept>>,
    /// The bytes of the objects in `kept`: what the capacity cannot give a new file.
    kept_bytes: AtomicU64,
    /// The kept log open for appending, and how many lines it holds.
    kept_log: Mutex<(Option<File>, usize)>,
    epoch: u64,
    seq: AtomicU64,
}

impl Producer {
    /// Discards the staging files of a previous run and keeps the objects it produced, charged
    /// to their owners in `quota`.
    pub fn open(
        ssd: &std::path::Path,
        cache: Arc<Cache>,
        node: u32,
        quota: Arc<Quota>,
    ) -> io::Result<Producer> {
        let staging = ssd.join("staging");
        if staging.exists() {
            let n = fs::read_dir(&staging)?.count();
            if n > 0 {
                tracing::warn!(
                    files = n,
                    "discarding files left unfinished by a previous run"
                );
            }
            fs::remove_dir_all(&staging)?;
        }
        fs::create_dir_all(&staging)?;
        let kept_path = ssd.join("kept");
        let mut kept = BTreeMap::new();
        if let Ok(text) = fs::read_to_string(&kept_path) {
            for line in text.lines() {
                if let Some(object) = line.strip_prefix("- ") {
                    kept.remove(object);
                    continue;
                }
                let mut f = line.split(' ');
                let (Some(size), Some(mtime), Some(object)) = (f.next(), f.next(), f.next()) else {
                    continue;
                };
                let (Ok(size), Ok(mtime_ns)) = (size.parse(), mtime.parse()) else {
                    continue;
                };
                let version = Version { size, mtime_ns };
                let uid = f.next().and_then(|u| u.parse().ok());
                if let Some(e) = cache.lookup(object, version).filter(|e| e.is_complete()) {
                    e.set_kept(true);
                    kept.insert(object.to_string(), Kept { version, uid });
                }
            }
        }
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let kept_bytes = AtomicU64::new(kept.values().map(|k| k.version.size).sum());
        for k in kept.values() {
            if let Some(uid) = k.uid {
                quota.add(uid, k.version.size);
            }
        }
        let p = Producer {
            cache,
            quota,
            staging,
            kept_path,
            node,
            staged: Mutex::default(),
            kept: Mutex::new(kept),
            kept_bytes,
            kept_log: Mutex::new((None, 0)),
            epoch,
            seq: AtomicU64::new(0),
        };
        p.save_kept(&lock(&p.kept))?;
        Ok(p)
    }

    /// Whether a produced file may grow to `size` bytes: at most [`FILE_SIZE_MAX`] and the
    /// cache's capacity (else EFBIG: no seal could take it), and at most what the capacity
    /// leaves beside the files kept here (else ENOSPC: its seal would fail). Asked at the
    /// write or truncate that crosses it, so `truncate -s 10T` fails at once instead of
    /// costing a seal of 10 TiB.
    pub fn room_for(&self, size: u64) -> Result<(), Error> {
        let capacity = self.cache.capacity();
        let max = FILE_SIZE_MAX.min(capacity);
        if size > max {
            return Err(Error::TooLarge { size, max });
        }
        let room = capacity.saturating_sub(self.kept_bytes.load(Ordering::Relaxed));
        if size > room {
            return Err(Error::NoRoom { size, room });
        }
        Ok(())
    }

    pub fn staged(&self, path: &str) -> Option<Arc<Staged>> {
        lock(&self.staged).get(path).cloned()
    }

    /// Staged files directly inside `dir`, by name.
    pub fn staged_in(&self, dir: &str) -> Vec<(String, Arc<Staged>)> {
        lock(&self.staged)
            .iter()
            .filter_map(|(p, s)| {
                let (d, n) = super::paths::split(p);
                (d == dir).then(|| (n.to_string(), s.clone()))
            })
            .collect()
    }

    /// Whether anything is being written under `dir` (at any depth).
    pub fn has_staged_under(&self, dir: &str) -> bool {
        let prefix = format!("{dir}/");
        lock(&self.staged)
            .keys()
            .any(|p| dir.is_empty() || p.starts_with(&prefix))
    }

    /// Starts a new file at `path` owned by `owner` (uid, gid), replacing any staged one there
    /// (which keeps its handles).
    pub fn create(&self, path: &str, mode: u32, owner: (u32, u32)) -> io::Result<Arc<Staged>> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let staging_path = self.staging.join(format!("{seq:08}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&staging_path)?;
        let s = Arc::new(Staged {
            path: Mutex::new(path.to_string()),
            file,
            staging_path,
            set: Mutex::new(SetAttrs {
                mode: mode & 0o7777,
                owner,
                atime_ns: None,
                mtime_ns: None,
                ctime_ns: None,
            }),
            writers: AtomicUsize::new(0),
            writer_process: AtomicU32::new(0),
            unlinked: AtomicBool::new(false),
            inode: std::sync::OnceLock::new(),
            finishing: Mutex::new(()),
            finished_at_flush: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            release_expected: AtomicBool::new(false),
            ended: Mutex::new(false),
            ended_cv: std::sync::Condvar::new(),
            write_error: AtomicI32::new(0),
            charge: self.quota.charge(owner.0),
        });
        if let Some(old) = lock(&self.staged).insert(path.to_string(), s.clone()) {
            old.unlinked.store(true, Ordering::Relaxed);
        }
        Ok(s)
    }

    /// Forgets a staged file (unlinked, or sealed) if `path` still names it.
    pub fn unstage(&self, s: &Arc<Staged>) {
        let path = lock(&s.path).clone();
        {
            let mut staged = lock(&self.staged);
            if staged.get(&path).is_some_and(|x| Arc::ptr_eq(x, s)) {
                staged.remove(&path);
            }
        }
        *lock(&s.ended) = true;
        s.ended_cv.notify_all();
    }

    pub fn rename_staged(&self, from: &str, to: &str) {
        let mut staged = lock(&self.staged);
        if let Some(s) = staged.remove(from) {
            *lock(&s.path) = to.to_string();
            if let Some(old) = staged.insert(to.to_string(), s) {
                old.unlinked.store(true, Ordering::Relaxed);
            }
        }
    }

    /// A fresh object key for a sealed file: unique across this node's restarts.
    pub fn new_object(&self) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{OBJECT_PREFIX}{}/{:x}-{seq:x}", self.node, self.epoch)
    }

    /// A fresh key for a hard-linked file's record: unique across this node's restarts.
    pub fn new_link_key(&self) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{}-{:x}-{seq:x}", self.node, self.epoch)
    }

    /// Takes a finished staged file into the cache as the kept object `object`. On failure
    /// (the cache's file system full or read-only) nothing of it is kept: an object nobody
    /// names would hold its bytes until a restart, and after one, as it is listed kept.
    ///
    /// The object is listed kept before it enters the cache: a crash between the two leaves a
    /// listed object with no bytes, which the next start's sweep drops as no name reaches it;
    /// the other order left cached bytes that no list or name reached (found by a SIGKILL at a
    /// random moment of a producer's work: one cached file more than its names).
    pub fn seal(&self, s: &Staged, object: &str) -> io::Result<Version> {
        let meta = s.file.metadata()?;
        let version = crate::core::version_of(&meta);
        let uid = s.charge.uid();
        {
            let mut kept = lock(&self.kept);
            self.keep(
                &mut kept,
                object,
                Kept {
                    version,
                    uid: Some(uid),
                },
            );
            let line = format!("{} {} {object} {uid}\n", version.size, version.mtime_ns);
            if let Err(e) = self.log_kept(&kept, &line) {
                self.unkeep(&mut kept, object);
                drop(kept);
                self.cache.write_failed(object, &e);
                return Err(e);
            }
        }
        if let Err(e) = self.cache.adopt(object, version, &s.staging_path) {
            let e = io::Error::from(e);
            let mut kept = lock(&self.kept);
            if self.unkeep(&mut kept, object)
                && let Err(e) = self.log_kept(&kept, &format!("- {object}\n"))
            {
                tracing::warn!(error = %e, "cannot save the list of kept objects");
            }
            drop(kept);
            self.cache.write_failed(object, &e);
            return Err(e);
        }
        // Its bytes move from the staged file's charge to the kept object's.
        s.charge.release();
        Ok(version)
    }

    /// How many objects are kept as the only copy of a produced file.
    pub fn kept_count(&self) -> u64 {
        lock(&self.kept).len() as u64
    }

    /// The objects kept as the only copy of a produced file, with their versions.
    pub fn kept_objects(&self) -> Vec<(String, Version)> {
        lock(&self.kept)
            .iter()
            .map(|(o, k)| (o.clone(), k.version))
            .collect()
    }

    /// The name no longer points at `object`: delete it (`drop`) or let it be evicted.
    pub fn released(&self, object: &str, version: Version, drop: bool) {
        if drop {
            self.cache.forget(object, version);
        } else if let Some(e) = self.cache.lookup(object, version) {
            e.set_kept(false);
        }
        let mut kept = lock(&self.kept);
        if self.unkeep(&mut kept, object)
            && let Err(e) = self.log_kept(&kept, &format!("- {object}\n"))
        {
            tracing::warn!(error = %e, "cannot save the list of kept objects");
        }
    }

    /// Adds `object` to `kept` (the list, locked), and its bytes to `kept_bytes` and to its
    /// owner's.
    fn keep(&self, kept: &mut BTreeMap<String, Kept>, object: &str, k: Kept) {
        if let Some(old) = kept.insert(object.to_string(), k) {
            self.given_back(old);
        }
        self.kept_bytes.fetch_add(k.version.size, Ordering::Relaxed);
        if let Some(uid) = k.uid {
            self.quota.add(uid, k.version.size);
        }
    }

    /// Removes `object` from `kept` (the list, locked); whether it was there.
    fn unkeep(&self, kept: &mut BTreeMap<String, Kept>, object: &str) -> bool {
        let removed = kept.remove(object);
        if let Some(k) = removed {
            self.given_back(k);
        }
        removed.is_some()
    }

    /// The bytes of a kept object that is kept no more.
    fn given_back(&self, k: Kept) {
        self.kept_bytes.fetch_sub(k.version.size, Ordering::Relaxed);
        if let Some(uid) = k.uid {
            self.quota.sub(uid, k.version.size);
        }
    }

    /// Appends `line` to the kept log (`kept`: the list with the change made, held locked so
    /// lines land in the order of the changes), or rewrites the log once it is mostly
    /// released lines.
    fn log_kept(&self, kept: &BTreeMap<String, Kept>, line: &str) -> io::Result<()> {
        let mut log = lock(&self.kept_log);
        if log.1 > 2 * kept.len() + 1024 {
            drop(log);
            return self.save_kept(kept);
        }
        if log.0.is_none() {
            log.0 = Some(OpenOptions::new().append(true).open(&self.kept_path)?);
        }
        if let Err(e) = log.0.as_mut().expect("opened").write_all(line.as_bytes()) {
            // Part of the line may have landed: the next change rewrites the log whole.
            log.1 = usize::MAX / 2;
            return Err(e);
        }
        log.1 += 1;
        Ok(())
    }

    /// Rewrites the kept log whole: one line per kept object.
    fn save_kept(&self, kept: &BTreeMap<String, Kept>) -> io::Result<()> {
        let tmp = self.kept_path.with_extension("tmp");
        let written = (|| {
            let mut f = io::BufWriter::new(File::create(&tmp)?);
            for (object, k) in kept.iter() {
                let (v, uid) = (k.version, k.uid.map(|u| format!(" {u}")));
                writeln!(
                    f,
                    "{} {} {object}{}",
                    v.size,
                    v.mtime_ns,
                    uid.unwrap_or_default()
                )?;
            }
            f.into_inner().map_err(|e| e.into_error())?;
            fs::rename(&tmp, &self.kept_path)
        })();
        if let Err(e) = written {
            // A full disk keeps no half-written copy.
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        *lock(&self.kept_log) = (None, kept.len());
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Sealed files were renamed into the cache; anything else is discarded.
        let _ = fs::remove_file(&self.staging_path);
    }
}
