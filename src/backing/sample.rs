//! What a dataset holds, from a look at a few of its files: the size of a typical one (the
//! median of the first regular files a breadth-first walk of the root meets). A mount decides
//! from it how the kernel opens files (`--opens auto`): a dataset of small samples read again and
//! again is best served without opens, one of large files by passthrough.

use std::collections::VecDeque;
use std::path::Path;

/// The median size of the first `files` regular files met walking `root` breadth first,
/// reading at most `entries` directory entries in all (a shared file system's listing is slow:
/// the look stays a few round trips). `None`: no regular file was met.
pub fn typical_size(root: &Path, files: usize, entries: usize) -> Option<u64> {
    let mut sizes = Vec::new();
    let mut dirs = VecDeque::from([root.to_path_buf()]);
    let mut read = 0;
    'walk: while let Some(dir) = dirs.pop_front() {
        let Ok(list) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in list.flatten() {
            read += 1;
            if read > entries || sizes.len() >= files {
                break 'walk;
            }
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                dirs.push_back(e.path());
            } else if t.is_file()
                && let Ok(m) = e.metadata()
            {
                sizes.push(m.len());
            }
        }
    }
    if sizes.is_empty() {
        return None;
    }
    sizes.sort_unstable();
    Some(sizes[sizes.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_the_first_files_met() {
        let root = std::env::temp_dir().join(format!("dyadfs-sample-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(typical_size(&root, 8, 100), None, "no root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        assert_eq!(typical_size(&root, 8, 100), None, "no file");
        for (i, size) in [10usize, 2000, 30, 40, 50].iter().enumerate() {
            std::fs::write(root.join(format!("a/b/f{i}")), vec![0u8; *size]).unwrap();
        }
        std::fs::write(root.join("index"), vec![0u8; 1 << 20]).unwrap();
        // Six files: 10 30 40 50 2000 1M.
        assert_eq!(typical_size(&root, 64, 100), Some(50));
        // The walk stops after the entries it may read: the root's two (a/ and index) alone.
        assert_eq!(typical_size(&root, 64, 2), Some(1 << 20));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
