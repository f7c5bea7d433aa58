//! `--opens auto`: how the kernel opens files, decided per mount from what it holds. Zero-message
//! opens (`--no-open`: the kernel opens a file without asking, so a cached sample read again
//! costs a LOOKUP and a READ where an asked open costs a LOOKUP, an OPEN, a RELEASE and, on a
//! writable mount, a GETATTR) are all or nothing per mount, rule out passthrough and writes
//! through opened files: they are chosen for a read-only mount of a dataset whose typical file
//! is a sample (at most [`UNASKED_MAX`]), where the daemon serves each cold read from its
//! cache file and the pages stay between opens; large files keep passthrough.

use std::path::Path;

use super::config::MountConfig;

/// A typical file of at most this size makes a read-only dataset mount's opens unasked: the
/// largest file the cache packs into segments by default (`--pack-max`), a training sample.
pub const UNASKED_MAX: u64 = 1 << 20;
/// How many files, and directory entries at most, the look at the dataset reads.
const LOOK_FILES: usize = 64;
const LOOK_ENTRIES: usize = 4096;

/// Turns `--opens auto` into unasked opens where they pay (see the module's comment).
pub(super) fn decide(args: &mut MountConfig) {
    let read_only = args.read_only || args.options.iter().any(|o| o == "ro");
    if !args.opens_auto || !read_only || args.managed {
        return;
    }
    if let Some(size) = typical(&args.backing)
        && size <= UNASKED_MAX
    {
        tracing::info!(
            typical_size = size,
            "a read-only dataset of small files: opens unasked (--opens auto)"
        );
        args.fs.no_open = true;
        args.fs.passthrough = false;
        args.read_only = true;
    }
}

fn typical(backing: &Path) -> Option<u64> {
    crate::backing::sample::typical_size(backing, LOOK_FILES, LOOK_ENTRIES)
}
