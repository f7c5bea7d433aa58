//! A mount that fails leaves the cache directory as it found it: a refusal late in the start
//! (a plain user's mount on a root-owned mount point, a wrong job key) found `data/` with its
//! 256 subdirectories, the lock, the logs and the managed root made, and a corrected mount then
//! started over a directory the operator never asked for. What was there is never touched.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::Path;

/// The cache directory's top-level names before a mount began, or `None` if it did not exist.
pub struct Before(Option<HashSet<OsString>>);

impl Before {
    pub fn take(ssd: &Path) -> Before {
        Before(
            std::fs::read_dir(ssd)
                .ok()
                .map(|d| d.flatten().map(|e| e.file_name()).collect()),
        )
    }

    /// Removes what the failed mount made in `ssd` (and `ssd` itself, if it made it), except
    /// `keep` (the log of a daemon that died without a word: the only account of why).
    pub fn undo(&self, ssd: &Path, keep: Option<&Path>) {
        let Ok(dir) = std::fs::read_dir(ssd) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name();
            let was = self.0.as_ref().is_some_and(|b| b.contains(&name));
            if was || keep.is_some_and(|k| k == e.path()) {
                continue;
            }
            // `file_type` does not follow a symlink, and `remove_dir_all` follows none.
            let gone = match e.file_type() {
                Ok(t) if t.is_dir() => std::fs::remove_dir_all(e.path()),
                _ => std::fs::remove_file(e.path()),
            };
            if let Err(err) = gone {
                tracing::warn!(path = %e.path().display(), error = %err, "could not remove what a failed mount made");
            }
        }
        if self.0.is_none() {
            // Only if empty: a kept log keeps it.
            let _ = std::fs::remove_dir(ssd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_there_stays_and_what_was_made_goes() {
        let root = std::env::temp_dir().join(format!("dyadfs-undo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let ssd = root.join("ssd");
        // A directory made by the mount goes whole.
        let before = Before::take(&ssd);
        std::fs::create_dir_all(ssd.join("data/00")).unwrap();
        std::fs::write(ssd.join("lock"), b"").unwrap();
        before.undo(&ssd, None);
        assert!(!ssd.exists());
        // One that was there keeps what it held, and a kept log.
        std::fs::create_dir_all(&ssd).unwrap();
        std::fs::write(ssd.join("old"), b"x").unwrap();
        let before = Before::take(&ssd);
        std::fs::create_dir_all(ssd.join("data/00")).unwrap();
        std::fs::write(ssd.join("dyadfs.log"), b"why").unwrap();
        before.undo(&ssd, Some(&ssd.join("dyadfs.log")));
        let mut left: Vec<_> = std::fs::read_dir(&ssd)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["dyadfs.log", "old"]);
        let _ = std::fs::remove_dir_all(&root);
    }
}
