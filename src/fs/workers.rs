//! The file system's background threads: work handed to them ([`Job`]), and a thread that
//! lives as long as the component it works for ([`spawn_worker`]).

use std::sync::Arc;
use std::time::Duration;

/// Work for the background threads (readahead, verification).
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Starts a background thread of a component (`name`): it takes jobs from `next` (which waits
/// at most the duration it is given, so the thread notices the component is gone) and does
/// each with `work`; it ends once the component is dropped.
pub(super) fn spawn_worker<T: Send + Sync + 'static, J>(
    owner: &Arc<T>,
    name: String,
    next: impl Fn(Duration) -> Option<J> + Send + 'static,
    work: impl Fn(&T, J) + Send + 'static,
) -> std::io::Result<()> {
    let weak = Arc::downgrade(owner);
    std::thread::Builder::new().name(name).spawn(move || {
        loop {
            let job = next(Duration::from_secs(1));
            let Some(owner) = weak.upgrade() else { return };
            if let Some(job) = job {
                work(&owner, job);
            }
        }
    })?;
    Ok(())
}
