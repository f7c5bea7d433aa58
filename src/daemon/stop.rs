//! A stop signal (SIGTERM, SIGINT, SIGHUP): the mount is unmounted, or detached when files are
//! open on it, and the daemon exits within seconds whatever it is doing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{STOP_GRACE, UserError};

/// On a stop signal, unmounts (or detaches) the mount, and exits if requests still run
/// [`STOP_GRACE`] later.
pub(super) fn start_stop_on_signal(
    set: crate::sys::StopSignals,
    mut unmounter: crate::fuse::session::Unmounter,
    mountpoint: &Path,
    running: std::sync::Arc<crate::fuse::running::Running>,
) -> Result<(), UserError> {
    let mountpoint: PathBuf = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = set.wait();
            tracing::info!(signal = sig, "unmounting {}", mountpoint.display());
            if let Err(e) = unmounter.unmount() {
                // EBUSY: files are open on it. Detached, it is gone for new users at once, but
                // the session lives until the last of them is closed: once no request runs,
                // nothing is left to finish.
                tracing::info!(error = %e, "unmount refused (files are open): detaching the mount");
                if let Err(e) = crate::sys::detach(&mountpoint) {
                    tracing::error!(error = %e, "detaching the mount failed");
                }
                let deadline = std::time::Instant::now() + STOP_GRACE;
                while std::time::Instant::now() < deadline {
                    if running.now() == 0 {
                        tracing::info!(
                            "no request running: exiting (files still open on the detached \
                             mount get ENOTCONN)"
                        );
                        std::process::exit(0);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            } else {
                // A request still running (a long wait, a seal) would keep the session, and so
                // the daemon, alive: a stop takes effect within seconds whatever.
                std::thread::sleep(STOP_GRACE);
            }
            tracing::error!(
                "requests still running {STOP_GRACE:?} after the signal: exiting without them"
            );
            std::process::exit(1);
        })
        .map_err(|source| UserError::Start {
            what: "signal thread",
            source,
        })?;
    Ok(())
}
