//! A path of the namespace in its parts: (directory, name), and back.

use std::ffi::OsStr;

/// (directory, name) of a path; the root's entries are in directory "".
pub(super) fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

pub(super) fn join(parent: &str, name: &OsStr) -> String {
    let name = name.to_string_lossy();
    if parent.is_empty() {
        name.into_owned()
    } else {
        format!("{parent}/{name}")
    }
}
