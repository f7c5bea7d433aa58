//! A remount right after an unmount: `fusermount3 -u` returns while the old daemon still exits
//! (1.6-1.9 s measured), holding the cache directory's lock, and a restart script's next mount
//! failed on it about half the time. The holder writes its pid and mount point into the lock
//! file; a mount that finds the lock held by a daemon whose mount point is no longer mounted
//! (it is exiting) waits for it, at most [`WAIT`], saying so; one whose holder still serves a
//! mount is refused at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cache::{Cache, CacheConfig, CacheError};
use crate::stats::Stats;

/// The longest a mount waits for an exiting daemon to let go of its cache directory.
pub const WAIT: Duration = Duration::from_secs(10);

/// Opens the cache at `config.dir` for a daemon that will mount at `mountpoint`, waiting (at
/// most [`WAIT`]) for an exiting holder, and records this daemon as the holder.
pub fn open_cache(
    config: &CacheConfig,
    stats: &Arc<Stats>,
    mountpoint: &Path,
) -> Result<Cache, CacheError> {
    let started = Instant::now();
    let mut said = false;
    let cache = loop {
        match Cache::open(config, stats.clone()) {
            Err(CacheError::Locked(dir)) if started.elapsed() < WAIT => {
                let (pid, mounted_at) = holder(&dir).unwrap_or_default();
                if mounted_at.as_os_str().is_empty() || super::is_mount_point(&mounted_at) {
                    return Err(CacheError::Locked(dir));
                }
                if !said {
                    tracing::warn!(
                        "cache directory {} is held by dyadfs pid {pid}, which is exiting (its \
                         mount {} is gone): waiting up to {} s for it",
                        dir.display(),
                        mounted_at.display(),
                        WAIT.as_secs()
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            other => break other?,
        }
    };
    if said {
        tracing::info!(
            waited_ms = started.elapsed().as_millis() as u64,
            "cache directory free"
        );
    }
    let note = format!("{} {}\n", std::process::id(), mountpoint.display());
    if let Err(e) = std::fs::write(config.dir.join("lock"), note) {
        tracing::warn!(error = %e, "could not record this daemon in the cache's lock file");
    }
    Ok(cache)
}

/// The pid and mount point the lock file's holder wrote.
fn holder(dir: &Path) -> Option<(u32, PathBuf)> {
    let text = std::fs::read_to_string(dir.join("lock")).ok()?;
    let (pid, mnt) = text.trim_end_matches('\n').split_once(' ')?;
    Some((pid.parse().ok()?, PathBuf::from(mnt)))
}
