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

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::core::names::{Name, NameJournal};
use crate::core::sync::lock;

pub const MAGIC: &[u8; 8] = b"DYADFSN\0";
/// The largest record replayed (a name of 255 bytes in a path of 4,096, and its entry).
const MAX_RECORD: usize = 64 << 10;

/// The live names, by (directory, name).
pub type Names = BTreeMap<(String, String), Name>;

pub struct NamesLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl NamesLog {
    /// Opens the log in `dir` (creating it), replays it, and rewrites it with the live names
    /// only; returns it and those names.
    pub fn open(dir: &Path) -> io::Result<(NamesLog, Names)> {
        let path = dir.join("names.log");
        let names = match File::open(&path) {
            Ok(mut f) => {
                let mut bytes = Vec::new();
                f.read_to_end(&mut bytes)?;
                replay(&bytes)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Names::new(),
            Err(e) => return Err(e),
        };
        let tmp = dir.join("names.log.new");
        let _ = std::fs::remove_file(&tmp);
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        let mut bytes = MAGIC.to_vec();
        for ((d, n), entry) in &names {
            bytes.extend(encode(d, n, Some(entry)));
        }
        out.write_all(&bytes)?;
        out.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        let file = OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        Ok((
            NamesLog {
                path,
                file: Mutex::new(file),
            },
            names,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl NameJournal for NamesLog {
    fn record(&self, dir: &str, name: &str, entry: Option<&Name>) {
        let bytes = encode(dir, name, entry);
        if let Err(e) = lock(&self.file).write_all(&bytes) {
            tracing::error!(error = %e, log = %self.path.display(),
                "a name change was not saved: a restart will not find it");
        }
    }
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

/// The live names a log's bytes hold (see the module's layout).
pub fn replay(bytes: &[u8]) -> Names {
    let mut names = Names::new();
    let Some(mut rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        if !bytes.is_empty() {
            tracing::error!("names.log has no magic: no names restored");
        }
        return names;
    };
    while !rest.is_empty() {
        let Some((head, after)) = rest.split_first_chunk::<8>() else {
            break;
        };
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        if len > MAX_RECORD || after.len() < len {
            if after.len() >= len {
                tracing::error!(
                    len,
                    "names.log: a record too long; the rest is not restored"
                );
            }
            break;
        }
        let payload = &after[..len];
        let record: Option<(String, String, Option<Name>)> = (crc32c::crc32c(payload) == crc)
            .then(|| rmp_serde::from_slice(payload).ok())
            .flatten();
        let Some((dir, name, entry)) = record else {
            tracing::error!("names.log: a corrupt record; the names after it are not restored");
            break;
        };
        match entry {
            Some(e) => names.insert((dir, name), e),
            None => names.remove(&(dir, name)),
        };
        rest = &after[len..];
    }
    names
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

    #[test]
    fn the_last_change_wins_and_a_reopen_keeps_only_live_names() {
        let dir = std::env::temp_dir().join(format!("dyadfs-names-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
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
        let compacted = std::fs::metadata(log.path()).unwrap().len();
        // A torn record at the end (a kill mid-append) costs only itself.
        log.record("run", "c", Some(&file("o4")));
        drop(log);
        let path = dir.join("names.log");
        let full = std::fs::read(&path).unwrap();
        assert!(full.len() as u64 > compacted);
        std::fs::write(&path, &full[..full.len() - 3]).unwrap();
        let (_, names) = NamesLog::open(&dir).unwrap();
        assert_eq!(
            names.len(),
            1,
            "the torn record is dropped, the one before kept"
        );
        let _ = std::fs::remove_dir_all(&dir);
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
        let names = replay(&bytes);
        assert_eq!(names.len(), 1);
        assert!(replay(b"garbage").is_empty());
    }
}
