//! The publisher: this node's complete copies published and its dropped ones unpublished, in
//! batches, retried while their home does not answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cache::{CacheEvent, EventQueue};
use crate::core::Version;
use crate::locator::service::LocatorService;

/// Most changes kept for a retry (their homes did not answer) before the publisher stops
/// taking new ones until some are acknowledged or given up.
pub const MOST_RETRIED: usize = 65_536;

/// Publishes every complete copy (`from_cache`: the cache's events, those held at start first),
/// unpublishes dropped ones.
/// Changes queued together go out together (one RPC per rack home). A change its home did not
/// acknowledge (the home is down or not up yet) is retried every second for up to ten minutes;
/// while [`MOST_RETRIED`] wait so, no more are taken from `from_cache` (where a held copy not
/// told yet costs 8 bytes, a change kept here a path).
pub fn start_publisher(
    mut from_cache: impl EventQueue,
    locator: Arc<LocatorService>,
    runtime: &tokio::runtime::Handle,
) {
    const RETRY_EVERY: Duration = Duration::from_secs(1);
    const GIVE_UP_AFTER: Duration = Duration::from_secs(600);
    /// Most changes sent in one round.
    const MAX_BATCH: usize = 512;
    /// How long a round waits for more changes after its first (the publish delay it adds to
    /// a change that comes alone).
    const LINGER: Duration = Duration::from_millis(10);
    /// While changes keep coming (an epoch's pulls: a few per linger on each node), a round
    /// goes on gathering them a linger at a time, up to this long: each round costs an RPC
    /// per home and both sides their wake-ups, and at 10 ms a round carried about 3 copies
    /// (an epoch's publisher and runtime: 81-123 -> 63-66 us per 64 KiB sample of a
    /// DataLoader, docs/BENCHMARKS.md).
    const MOST_LINGER: Duration = Duration::from_millis(50);
    let rt = runtime.clone();
    std::thread::Builder::new()
        .name("publisher".into())
        .spawn(move || {
            let mut retry: Vec<((String, Version, bool), Instant)> = Vec::new();
            let mut last_retry = Instant::now();
            loop {
                let first = if retry.len() >= MOST_RETRIED {
                    std::thread::sleep(RETRY_EVERY.saturating_sub(last_retry.elapsed()));
                    None
                } else {
                    match from_cache.recv_timeout(RETRY_EVERY) {
                        Ok(ev) => Some(ev),
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                    }
                };
                let now = Instant::now();
                // Copies completing close together (a training epoch's pulls) go out together:
                // one RPC per home instead of one per file, which costs both sides a few
                // thread wake-ups per file. The thread sleeps through the linger rather than
                // waking for each change that arrives in it.
                // A backlog (a restart's held copies) fills its rounds at once, without a
                // linger: 10 ms a round of 512 held a million copies' republish to 36 K/s.
                let mut events: Vec<CacheEvent> = first.into_iter().collect();
                let mut more = |events: &mut Vec<CacheEvent>| {
                    let room = MAX_BATCH.saturating_sub(events.len());
                    events.extend(std::iter::from_fn(|| from_cache.try_recv()).take(room));
                };
                if !events.is_empty() {
                    more(&mut events);
                    while events.len() < MAX_BATCH {
                        std::thread::sleep(LINGER);
                        let before = events.len();
                        more(&mut events);
                        if events.len() == before || now.elapsed() >= MOST_LINGER {
                            break;
                        }
                    }
                }
                for ev in &events {
                    // Complete here (or dropped): nothing is left to fill for waiting peers. A
                    // partial copy's fetcher goes on filling what they ask of it.
                    if let CacheEvent::Complete { path, version }
                    | CacheEvent::Dropped { path, version } = ev
                    {
                        locator.fetched(path, *version);
                    }
                }
                // A partial copy is published by the file's designated fetcher, which fills what
                // its peers ask that it lacks: a copy another node began while a fetch is under
                // way would end the fetch at the homes (it is a holder), and the others would
                // read the shared file system for what it lacks. One held at start is published.
                events.retain(|ev| match ev {
                    CacheEvent::Partial {
                        path,
                        version,
                        reloaded: false,
                    } => locator.is_fetching(path, *version),
                    _ => true,
                });
                let mut round: Vec<((String, Version, bool), Instant)> = events
                    .into_iter()
                    .map(|ev| match ev {
                        CacheEvent::Complete { path, version }
                        | CacheEvent::Partial { path, version, .. } => ((path, version, true), now),
                        CacheEvent::Dropped { path, version } => ((path, version, false), now),
                    })
                    .collect();
                if last_retry.elapsed() >= RETRY_EVERY {
                    last_retry = now;
                    round.append(&mut retry);
                }
                if round.is_empty() {
                    continue;
                }
                let changes: Vec<(String, Version, bool)> =
                    round.iter().map(|(c, _)| c.clone()).collect();
                let acked = rt.block_on(locator.publish(&changes));
                for ((change, since), ok) in round.into_iter().zip(acked) {
                    if !ok && since.elapsed() < GIVE_UP_AFTER {
                        retry.push((change, since));
                    }
                }
            }
        })
        .expect("spawn publisher");
}
