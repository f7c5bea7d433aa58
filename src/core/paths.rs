//! What a path or name that arrives from outside (a frame from the network) must look like
//! before anything uses it. A path from a frame is data, never a path to follow: it is relative,
//! normalised (no empty, `.` or `..` component), free of NUL, and bounded, so joining it onto
//! a root can only name something beneath that root. A produced object's id is an opaque token
//! (`//produced/<node>/<token>`), never a path.

/// Longest path accepted (bytes), as Linux's PATH_MAX.
pub const MAX_PATH: usize = 4096;
/// Longest path component accepted (bytes), as Linux file systems' NAME_MAX.
pub const MAX_NAME: usize = 255;
/// Cache keys of produced objects start with this; dataset paths are relative, so never do.
pub const OBJECT_PREFIX: &str = "//produced/";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path too long ({0} bytes)")]
    TooLong(usize),
    #[error("absolute path")]
    Absolute,
    #[error("path with an empty, '.' or '..' component")]
    NotNormal,
    #[error("component too long ({0} bytes)")]
    NameTooLong(usize),
    #[error("NUL byte in a path")]
    Nul,
    #[error("not a produced object id")]
    NotObject,
}

/// A directory or file path of the dataset, relative to the mount root ("" is the root).
pub fn dataset_path(p: &str) -> Result<(), PathError> {
    if p.is_empty() {
        return Ok(());
    }
    if p.len() > MAX_PATH {
        return Err(PathError::TooLong(p.len()));
    }
    if p.starts_with('/') {
        return Err(PathError::Absolute);
    }
    p.split('/').try_for_each(name)
}

/// One component of a path: a file or directory name.
pub fn name(n: &str) -> Result<(), PathError> {
    if n.is_empty() || n == "." || n == ".." {
        return Err(PathError::NotNormal);
    }
    if n.len() > MAX_NAME {
        return Err(PathError::NameTooLong(n.len()));
    }
    if n.contains('\0') {
        return Err(PathError::Nul);
    }
    if n.contains('/') {
        return Err(PathError::NotNormal);
    }
    Ok(())
}

/// A produced object's id: `//produced/<node id>/<token>`, the token of letters, digits, `-`
/// and `_`. Returns the producing node.
pub fn object_id(p: &str) -> Result<u32, PathError> {
    let rest = p.strip_prefix(OBJECT_PREFIX).ok_or(PathError::NotObject)?;
    let (node, token) = rest.split_once('/').ok_or(PathError::NotObject)?;
    let node: u32 = node.parse().map_err(|_| PathError::NotObject)?;
    let token_ok = !token.is_empty()
        && token.len() <= 64
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !token_ok {
        return Err(PathError::NotObject);
    }
    Ok(node)
}

/// A cache key: a produced object's id or a (non-root) dataset path.
pub fn cache_key(p: &str) -> Result<(), PathError> {
    if p.starts_with(OBJECT_PREFIX) {
        return object_id(p).map(|_| ());
    }
    if p.is_empty() {
        return Err(PathError::NotNormal);
    }
    dataset_path(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_refused() {
        for bad in [
            "/etc/passwd",
            "../etc/passwd",
            "a/../../etc",
            "a//b",
            "a/./b",
            "a/",
            ".",
            "a\0b",
        ] {
            assert!(dataset_path(bad).is_err(), "{bad:?} accepted");
            assert!(cache_key(bad).is_err(), "{bad:?} accepted as a key");
        }
        assert!(dataset_path(&"a".repeat(256)).is_err());
        assert!(dataset_path(&"a/".repeat(2100)).is_err());
        for good in ["", "a", "train/0001.npy", "d/e/f g.bin", "..a", "a..b"] {
            assert_eq!(dataset_path(good), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn object_ids_are_tokens_not_paths() {
        assert_eq!(object_id("//produced/3/6554ab-1f"), Ok(3));
        for bad in [
            "//produced/3/../../etc/passwd",
            "//produced/3/a/b",
            "//produced/x/1",
            "//produced/3/",
            "/etc/passwd",
            "//produced//1",
        ] {
            assert!(object_id(bad).is_err(), "{bad:?} accepted");
            assert!(cache_key(bad).is_err(), "{bad:?} accepted as a key");
        }
        assert_eq!(cache_key("//produced/0/1-2"), Ok(()));
    }
}
