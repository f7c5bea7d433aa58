//! The identities the layers share: a source file's [`Version`], a node's id, a path's stable
//! hash.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

/// A member of the cluster, as the peers file numbers it.
pub type NodeId = u32;

/// A source file's version: a cached copy of another version is never served. On the wire it
/// is the array `[size, mtime_ns]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Version {
    pub size: u64,
    pub mtime_ns: i64,
}

/// The version of a file as the cache records it: (size, mtime).
pub fn version_of(meta: &Metadata) -> Version {
    version_at(meta.len(), (meta.mtime(), meta.mtime_nsec()))
}

/// The version of a file of `size` bytes last modified at `mtime` (seconds, nanoseconds).
pub fn version_at(size: u64, (secs, nanos): (i64, i64)) -> Version {
    Version {
        size,
        mtime_ns: secs * 1_000_000_000 + nanos,
    }
}

/// FNV-1a 64: a stable name for a path's files (std's hasher is not stable across releases).
pub fn path_hash(path: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_hash_is_stable() {
        assert_eq!(path_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(path_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
