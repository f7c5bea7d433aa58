//! The names a node holds, kept on its NVMe beside the cache (`<ssd>/names.log`), so that a
//! restart (SIGTERM, SIGKILL, a requeued job step) finds every name whose producer's close
//! returned: the produced objects are kept in the cache across restarts, and without their
//! names they could never be read, evicted or deleted again. An append-only log, one record per
//! change in the order they were made (the last record for a name wins, `None` removes it),
//! replayed at mount and rewritten then with only the live names.
//!
//! Durability: a record is written (to the page cache) before the change is answered, so a
//! daemon killed at any moment loses none; a power loss may lose the records not yet on the
//! disk, as it may lose the produced bytes an application did not fsync.
//!
//! Layout (little endian): magic `"DYADFSN\0"`, then records `len u32 | crc32c u32 | payload`
//! where `payload` is the MessagePack of `(dir, name, Option<Name>)` and `len` counts it. A
//! torn record at the end (a crash mid-append) ends the replay; so does a corrupt one (the names
//! after it are lost, and said so in the log).
//!
//! Bounds: the log is also rewritten while mounted, from the live table, once it passes twice
//! its size after the last rewrite plus [`SLACK`] (a user renaming one file in a loop appended
//! 96 MB in 6 s, never compacted until the next mount). So it stays below twice the records of
//! the live names, whose number each user's `--max-names-per-user` bounds, plus the slack; and
//! the replay at mount reads it a record at a time, never whole (that remount peaked at 113 MB).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::core::names::{Name, NameJournal};
use crate::core::sync::lock;

pub const MAGIC: &[u8; 8] = b"DYADFSN\0";
/// The largest record replayed (a name of 255 bytes in a path of 4,096, and its entry).
const MAX_RECORD: usize = 64 << 10;
/// Growth past twice the rewritten size before the next rewrite: small, so a few live names
/// keep a small log, and a rewrite (an fsync) comes at most once per MiB appended.
const SLACK: u64 = 1 << 20;
/// How much of the log the replay reads at a time.
const READ_BUF: usize = 64 << 10;

/// The live names, by (directory, name).
pub type Names = BTreeMap<(String, String), Name>;

pub struct NamesLog {
    path: PathBuf,
    log: Mutex<Log>,
}

/// The open log and where it stands.
struct Log {
    /// Not `O_APPEND`: records go at `len`, after the last whole one (see [`Log::append`]).
    file: File,
    /// The bytes of the whole records written.
    len: u64,
    /// Past this length the log wants a rewrite.
    compact_at: u64,
    slack: u64,
}

impl NamesLog {
    /// Opens the log in `dir` (creating it), replays it, and rewrites it with the live names
    /// only; returns it and those names.
    pub fn open(dir: &Path) -> io::Result<(NamesLog, Names)> {
        Self::open_with_slack(dir, SLACK)
    }

    fn open_with_slack(dir: &Path, slack: u64) -> io::Result<(NamesLog, Names)> {
        let path = dir.join("names.log");
        let old = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path);
        let names = match old {
            Ok(f) => replay(f)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Names::new(),
            Err(e) => return Err(e),
        };
        let live = names.iter().map(|((d, n), e)| (d.as_str(), n.as_str(), e));
        let (file, len) = write_log(&path, live)?;
        let log = Log {
            file,
            len,
            compact_at: 2 * len + slack,
            slack,
        };
        let log = NamesLog {
            path,
            log: Mutex::new(log),
        };
        Ok((log, names))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl NameJournal for NamesLog {
    fn record(&self, dir: &str, name: &str, entry: Option<&Name>) {
        let bytes = encode(dir, name, entry);
        if let Err(e) = lock(&self.log).append(&bytes) {
            tracing::error!(error = %e, log = %self.path.display(),
                "a name change was not saved: a restart will not find it");
        }
    }

    fn wants_compact(&self) -> bool {
        let log = lock(&self.log);
        log.len > log.compact_at
    }

    fn compact<'a>(&self, live: &mut dyn Iterator<Item = (&'a str, &'a str, &'a Name)>) {
        let mut log = lock(&self.log);
        match write_log(&self.path, live) {
            Ok((file, len)) => {
                tracing::debug!(before = log.len, after = len, "names.log compacted");
                (log.file, log.len, log.compact_at) = (file, len, 2 * len + log.slack);
            }
            Err(e) => {
                // Appending goes on to the old log; tried again once it has grown by the
                // slack (a full disk is not written over at every change).
                log.compact_at = log.len + log.slack;
                tracing::error!(error = %e, log = %self.path.display(),
                    "names.log was not compacted");
            }
        }
    }
}

impl Log {
    /// Appends one record. Part of one written (a full disk) is cut off again: a torn record
    /// in the middle would end every later replay there, losing the names after it.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let written = self.file.write_all(bytes);
        match &written {
            Ok(()) => self.len += bytes.len() as u64,
            Err(_) => {
                let _ = self.file.set_len(self.len);
                let _ = self.file.seek(SeekFrom::Start(self.len));
            }
        }
        written
    }
}

/// Writes a log holding `live` beside `path` (streamed, never whole in memory), syncs it and
/// renames it over `path`, so a crash leaves one log or the other; returns it open at its end,
/// and its length.
fn write_log<'a>(
    path: &Path,
    live: impl Iterator<Item = (&'a str, &'a str, &'a Name)>,
) -> io::Result<(File, u64)> {
    let tmp = path.with_extension("log.new");
    let _ = fs::remove_file(&tmp);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let written = (|| -> io::Result<u64> {
        let mut out = BufWriter::with_capacity(256 << 10, &file);
        out.write_all(MAGIC)?;
        let mut len = MAGIC.len() as u64;
        for (d, n, entry) in live {
            let record = encode(d, n, Some(entry));
            out.write_all(&record)?;
            len += record.len() as u64;
        }
        out.flush()?;
        drop(out);
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        Ok(len)
    })();
    // A full disk keeps no half-written copy.
    let len = written.inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })?;
    Ok((file, len))
}

/// One record's bytes.
fn encode(dir: &str, name: &str, entry: Option<&Name>) -> Vec<u8> {
    let payload = rmp_serde::to_vec(&(dir, name, entry)).expect("names encode");
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The live names of the log `input` reads (see the module's layout), read a record at a time
/// through a buffer of [`READ_BUF`]: what it costs is the live names, not the log's bytes.
pub fn replay(input: impl Read) -> io::Result<Names> {
    let mut input = BufReader::with_capacity(READ_BUF, input);
    let mut names = Names::new();
    let mut magic = [0u8; 8];
    let got = read_up_to(&mut input, &mut magic)?;
    if got < magic.len() || &magic != MAGIC {
        if got > 0 {
            tracing::error!("names.log has no magic: no names restored");
        }
        return Ok(names);
    }
    let mut payload = Vec::new();
    loop {
        let mut head = [0u8; 8];
        match read_up_to(&mut input, &mut head)? {
            0 => break,
            8 => {}
            _ => {
                tracing::warn!("names.log: a torn record at the end (a crash mid-append) dropped");
                break;
            }
        }
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        if len > MAX_RECORD {
            tracing::error!(
                len,
                "names.log: a record too long; the rest is not restored"
            );
            break;
        }
        payload.resize(len, 0);
        if read_up_to(&mut input, &mut payload)? < len {
            tracing::warn!("names.log: a torn record at the end (a crash mid-append) dropped");
            break;
        }
        let record: Option<(String, String, Option<Name>)> = (crc32c::crc32c(&payload) == crc)
            .then(|| rmp_serde::from_slice(&payload).ok())
            .flatten();
        let Some((dir, name, entry)) = record else {
            tracing::error!("names.log: a corrupt record; the names after it are not restored");
            break;
        };
        match entry {
            Some(e) => names.insert((dir, name), e),
            None => names.remove(&(dir, name)),
        };
    }
    Ok(names)
}

/// Fills `buf` from `input` as far as it goes; returns how much it filled (less: the end).
fn read_up_to(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(k) => filled += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(object: &str) -> Name {
        Name {
            object: object.into(),
            size: 3,
            mtime_ns: 1,
            mode: 0o644,
            ..Default::default()
        }
    }

    /// An empty directory of its own for test `name`.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("dyadfs-names-log-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_last_change_wins_and_a_reopen_keeps_only_live_names() {
        let dir = scratch("reopen");
        let (log, names) = NamesLog::open(&dir).unwrap();
        assert!(names.is_empty());
        log.record("run", "a", Some(&file("o1")));
        log.record("run", "b", Some(&file("o2")));
        log.record("run", "a", Some(&file("o3")));
        log.record("run", "b", None);
        drop(log);
        let (log, names) = NamesLog::open(&dir).unwrap();
        assert_eq!(names.len(), 1);
        assert_eq!(names[&("run".into(), "a".into())], file("o3"));
        let compacted = fs::metadata(log.path()).unwrap().len();
        // A torn record at the end (a kill mid-append) costs only itself.
        log.record("run", "c", Some(&file("o4")));
        drop(log);
        let path = dir.join("names.log");
        let full = fs::read(&path).unwrap();
        assert!(full.len() as u64 > compacted);
        fs::write(&path, &full[..full.len() - 3]).unwrap();
        let (_, names) = NamesLog::open(&dir).unwrap();
        assert_eq!(
            names.len(),
            1,
            "the torn record is dropped, the one before kept"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    /// What a name table does with its journal (`NameTable::set_journaled`).
    fn change(log: &NamesLog, table: &mut Names, dir: &str, name: &str, entry: Option<Name>) {
        log.record(dir, name, entry.as_ref());
        let key = (dir.to_string(), name.to_string());
        match entry {
            Some(e) => table.insert(key, e),
            None => table.remove(&key),
        };
        if log.wants_compact() {
            log.compact(&mut table.iter().map(|((d, n), e)| (d.as_str(), n.as_str(), e)));
        }
    }

    #[test]
    fn one_name_changed_in_a_loop_keeps_the_log_bounded_while_open_and_loses_nothing() {
        let dir = scratch("loop");
        let slack = 4096;
        let (log, _) = NamesLog::open_with_slack(&dir, slack).unwrap();
        let mut table = Names::new();
        for i in 0..10 {
            change(&log, &mut table, "run", &format!("f{i}"), Some(file("o")));
        }
        let mut largest = 0;
        for round in 0..5000u32 {
            let (from, to) = if round % 2 == 0 {
                ("a", "b")
            } else {
                ("b", "a")
            };
            let mut moved = file("looped");
            moved.mode = 0o600 | (round & 0o77);
            change(&log, &mut table, "run/deep", from, None);
            change(&log, &mut table, "run/deep", to, Some(moved));
            largest = largest.max(fs::metadata(log.path()).unwrap().len());
        }
        let live: u64 = table
            .iter()
            .map(|((d, n), e)| encode(d, n, Some(e)).len() as u64)
            .sum::<u64>()
            + MAGIC.len() as u64;
        let record = encode("run/deep", "a", Some(&file("looped"))).len() as u64;
        assert!(
            10_000 * record > 50 * largest,
            "no rewrite: {largest} bytes"
        );
        assert!(
            largest <= 2 * live + slack + 2 * record,
            "the log reached {largest} bytes, {live} live"
        );
        drop(log);
        // The records after the last rewrite are in the log that replaced it.
        let (_, names) = NamesLog::open(&dir).unwrap();
        assert_eq!(names, table);
        let _ = fs::remove_dir_all(&dir);
    }

    /// Hands out at most 7 bytes a read, and keeps the largest read it was asked for.
    struct Trickle<'a> {
        bytes: &'a [u8],
        largest_ask: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.largest_ask = self.largest_ask.max(buf.len());
            let n = buf.len().min(7).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    #[test]
    fn the_replay_reads_a_bounded_buffer_at_a_time_and_drops_a_torn_last_record() {
        let mut bytes = MAGIC.to_vec();
        let long = "n".repeat(250);
        // Each name removed (before it was set), set, then set again.
        let kept = 700;
        for i in 0..kept {
            let name = format!("{long}{i}");
            bytes.extend(encode("dir", &name, None));
            bytes.extend(encode("dir", &name, Some(&file("first"))));
            bytes.extend(encode("dir", &name, Some(&file(&format!("o{i}")))));
        }
        let last = encode("dir", "last", Some(&file("x")));
        let whole = bytes.len();
        bytes.extend(&last);
        assert!(bytes.len() > 8 * READ_BUF);
        let mut input = Trickle {
            bytes: &bytes,
            largest_ask: 0,
        };
        let names = replay(&mut input).unwrap();
        assert!(input.largest_ask <= READ_BUF, "{}", input.largest_ask);
        assert_eq!(names.len(), kept + 1);
        assert_eq!(names[&("dir".into(), format!("{long}9"))], file("o9"));
        assert_eq!(names[&("dir".into(), "last".into())], file("x"));
        // Torn in its header, or in its payload: the record is dropped, the others kept.
        for cut in [whole + 3, whole + 8, bytes.len() - 1] {
            let names = replay(&bytes[..cut]).unwrap();
            assert_eq!(names.len(), kept, "cut at {cut}");
        }
    }

    #[test]
    fn a_corrupt_record_ends_the_replay() {
        let mut bytes = MAGIC.to_vec();
        bytes.extend(encode("d", "a", Some(&file("o1"))));
        let mut bad = encode("d", "b", Some(&file("o2")));
        let last = bad.len() - 1;
        bad[last] ^= 1;
        bytes.extend(bad);
        bytes.extend(encode("d", "c", Some(&file("o3"))));
        let names = replay(&bytes[..]).unwrap();
        assert_eq!(names.len(), 1);
        assert!(replay(&b"garbage"[..]).unwrap().is_empty());
        // A length past any record's ends it too, without allocating that length.
        let mut huge = MAGIC.to_vec();
        huge.extend(u32::MAX.to_le_bytes());
        huge.extend([0; 4]);
        assert!(replay(&huge[..]).unwrap().is_empty());
    }
}
