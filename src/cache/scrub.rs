//! `dyadfs scrub`: every cached chunk checked again against its checksum, the bad ones dropped
//! (refetched when next read).

use std::time::Instant;

use super::*;

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

impl Cache {
    /// Re-checks every cached chunk against its checksum and drops the bad ones (`dyadfs
    /// scrub`). Entries that cannot be read are skipped.
    pub fn scrub(&self) -> ScrubReport {
        self.scrub_paced(u64::MAX)
    }

    /// As [`Cache::scrub`], reading at most `bytes_per_sec` on average (the background scrub:
    /// the disk is the readers' first).
    pub fn scrub_paced(&self, bytes_per_sec: u64) -> ScrubReport {
        let entries: Vec<Arc<Entry>> = lock(&self.index).entries().cloned().collect();
        let mut report = ScrubReport::default();
        let start = Instant::now();
        for e in entries {
            let due = Duration::from_secs_f64(
                (report.chunks * self.chunk_size()) as f64 / bytes_per_sec.max(1) as f64,
            );
            if let Some(ahead) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(ahead);
            }
            match e.recheck(self, 0..e.chunk_count()) {
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
}
