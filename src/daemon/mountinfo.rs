//! What this mount namespace has mounted where, from `/proc/self/mountinfo` (whose mount point
//! field escapes space, tab, newline and backslash in octal): read, never a request to the
//! file system itself (a daemon's own mount cannot answer its daemon while it is killed).

use std::fs;
use std::path::Path;

/// Whether `path` (canonical) is a mount point, from /proc/self/mountinfo.
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| unescape_mountinfo(m) == path.as_os_str().to_string_lossy())
}

/// The device of the file system mounted at `path` (the last such mount), from
/// /proc/self/mountinfo: no request to that file system (a daemon's own mount cannot answer
/// its daemon while it is being killed).
pub(super) fn mount_device(path: &Path) -> Option<(u32, u32)> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.as_os_str().to_string_lossy();
    let line = info.lines().rev().find(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|m| unescape_mountinfo(m) == want)
    })?;
    let (major, minor) = line.split(' ').nth(2)?.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let oct: String = chars.by_ref().take(3).collect();
            if let Ok(v) = u8::from_str_radix(&oct, 8) {
                out.push(v as char);
                continue;
            }
            out.push(c);
            out.push_str(&oct);
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_point_is_found_as_mountinfo_writes_it() {
        assert!(is_mount_point(Path::new("/proc")));
        assert!(!is_mount_point(Path::new("/no such/mount")));
        assert_eq!(unescape_mountinfo("/a\\040b\\134c"), "/a b\\c");
    }
}
