//! `dyadfs scrub`: every cached chunk checked again against its checksum, the bad ones dropped
//! (refetched when next read).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::entry::Entry;
use super::error::CacheError;

/// What a scrub found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScrubReport {
    pub files: u64,
    /// Present chunks read and checked (a partial chunk's present pages count as one).
    pub chunks: u64,
    /// Chunks that failed their checksum and were dropped (refetched when next read; a partial
    /// chunk with a page dropped counts as one).
    pub dropped: u64,
    /// Entries whose data file could not be read.
    pub unreadable: u64,
}

/// Re-checks every chunk of `entries` (chunks of `chunk_size`) with `recheck` (which drops the
/// bad ones and says how many it checked and dropped), reading at most `bytes_per_sec` on
/// average (the background scrub: the disk is the readers' first). Entries that cannot be read
/// are skipped.
pub(super) fn paced(
    entries: Vec<Arc<Entry>>,
    chunk_size: u64,
    bytes_per_sec: u64,
    recheck: impl Fn(&Entry) -> Result<(u64, u64), CacheError>,
) -> ScrubReport {
    let mut report = ScrubReport::default();
    let start = Instant::now();
    for e in entries {
        let due = Duration::from_secs_f64(
            (report.chunks * chunk_size) as f64 / bytes_per_sec.max(1) as f64,
        );
        if let Some(ahead) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(ahead);
        }
        match recheck(&e) {
            Ok((checked, dropped)) => {
                report.files += 1;
                report.chunks += checked;
                report.dropped += dropped;
            }
            Err(err) => {
                tracing::warn!(path = %e.path, error = %err, "scrub could not read an entry");
                report.unreadable += 1;
            }
        }
    }
    tracing::info!(?report, "scrub done");
    report
}
