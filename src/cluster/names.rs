//! The produced namespace of a cluster: each directory's names live at its name home (a hash of
//! the directory over all members), asked over the locator's RPCs. A name from a home is used
//! only if well formed.

use std::sync::Arc;
use std::time::Duration;

use crate::core::names::{Name, Namespace, Wake, Watch};
use crate::core::{NodeId, Version};
use crate::locator::check::check_name;
use crate::locator::error::LocatorError;
use crate::locator::name_calls::{self as calls, NameCall, OverQuota};
use crate::locator::service::LocatorService;
use crate::locator::watching::{KEPT, Key, NAMES_PER_WATCH, REFRESH, Waiting};

/// The produced namespace of a cluster: each directory's names live at its name home.
pub struct ClusterNames {
    pub locator: Arc<LocatorService>,
    pub runtime: tokio::runtime::Handle,
    /// How long a name question waits, after its home failed to answer, for the cluster to
    /// declare that home down (its directories then move to the next live node, which holds
    /// their backup copies): the failure detection time, with a margin.
    pub failover_wait: Duration,
    /// This node's refresh of its readers' watches, started by the first wait.
    pub refresher: std::sync::OnceLock<()>,
    /// Places for this node's name questions out at once ([`CALLS_AT_ONCE`]).
    pub calls: tokio::sync::Semaphore,
    /// Waits not registered with their homes yet (see [`Namespace::watch`]).
    pub registering: Arc<Registering>,
}

/// Names readers began to wait for, which the refresh registers with their homes in a few
/// messages (each of up to [`NAMES_PER_WATCH`] names), holding no thread and no connection of
/// its own per wait.
#[derive(Default)]
pub struct Registering {
    /// Each name, until when it is waited for, and how soon a failed registration is retried.
    new: std::sync::Mutex<Vec<(Key, std::time::Instant, Duration)>>,
    added: tokio::sync::Notify,
}

impl Registering {
    fn add(&self, names: impl IntoIterator<Item = (Key, std::time::Instant, Duration)>) {
        crate::core::sync::lock(&self.new).extend(names);
        self.added.notify_one();
    }
}

/// The most name questions a node has out at once (each on a connection of its own).
pub const CALLS_AT_ONCE: usize = 32;

/// How often a question whose home failed checks whether the directory moved.
const FAILOVER_POLL: Duration = Duration::from_millis(50);

/// How soon a wait whose registration failed registers again (doubling up to [`REFRESH`]).
const REGISTER_AGAIN: Duration = Duration::from_millis(100);

impl ClusterNames {
    /// Asks the directory's name home. A home that fails to answer may be dying before the
    /// cluster has declared it down: rather than lose a produced name (or answer "no such
    /// name"), the question waits for the directory to move and asks the new home; a home that
    /// was only slow (never declared down) keeps its directories, so nothing is orphaned at a
    /// backup.
    fn ask<C: NameCall>(&self, dir: &str, call: &C, wait: Duration) -> std::io::Result<C::Answer> {
        let msg = call.msg();
        // A call holds a connection to the home while it is out: thousands of waiting opens
        // registering at once would open thousands (a home takes 256 from one node, and a
        // refused call makes it suspect here).
        let _out = self.runtime.block_on(self.calls.acquire());
        let l = &self.locator;
        let mut home = l.global_home(dir);
        let deadline = std::time::Instant::now() + self.failover_wait;
        loop {
            let call = l.call_home(home, msg.clone(), wait + l.timeout);
            let reply = tracing::debug_span!("ask", home).in_scope(|| self.runtime.block_on(call));
            if let Some(reply) = reply {
                return Ok(C::answer(reply)?);
            }
            loop {
                if std::time::Instant::now() >= deadline {
                    return Err(LocatorError::NameHomeUnreachable(home).into());
                }
                std::thread::sleep(FAILOVER_POLL);
                let now = l.global_home(dir);
                if now != home {
                    tracing::info!(dir, from = home, to = now, "asking a directory's new home");
                    home = now;
                    break;
                }
            }
        }
    }
}

impl ClusterNames {
    /// A name from a name home, used only if well formed (see [`check_name`]).
    fn checked(&self, n: Option<Name>) -> std::io::Result<Option<Name>> {
        match n {
            Some(n) => match check_name(&n, &self.locator.membership) {
                Ok(()) => Ok(Some(n)),
                Err(why) => Err(LocatorError::BadName(why).into()),
            },
            None => Ok(None),
        }
    }
}

impl ClusterNames {
    /// Waits up to `wait` for `name` of `dir` to be published: registered with its home, which
    /// tells this node the moment it is (nothing polls; see `locator::watching`). At the
    /// deadline one last look, for a word lost with a home that died.
    fn wait_for(&self, dir: &str, name: &str, wait: Duration) -> std::io::Result<Option<Name>> {
        let deadline = std::time::Instant::now() + wait;
        let slot = self.locator.wait_for_name(dir, name);
        self.keep_watches_registered();
        // A registration that failed (its home unreachable for longer than a failover takes,
        // or its answer refused) is tried again until the deadline: a reader that waits must
        // not be told "no such file" before it, while the name may yet be published.
        let mut again = REGISTER_AGAIN;
        loop {
            match self.register(dir, name, deadline) {
                Ok(Some(n)) => return self.checked(Some(n)),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(dir, name, error = %e, "registering a wait failed; trying again");
                    let now = std::time::Instant::now();
                    if let Some(n) = slot.until(deadline.min(now + again)) {
                        return self.checked(Some(n));
                    }
                    if std::time::Instant::now() >= deadline {
                        break;
                    }
                    again = (again * 2).min(REFRESH);
                }
            }
        }
        if let Some(n) = slot.until(deadline) {
            return self.checked(Some(n));
        }
        drop(slot);
        self.get(dir, name, Duration::ZERO)
    }

    /// Registers this node's wait for `dir/name` (until `deadline`) with the directory's home;
    /// the name if it is published already.
    fn register(
        &self,
        dir: &str,
        name: &str,
        deadline: std::time::Instant,
    ) -> std::io::Result<Option<Name>> {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let watch = calls::Watch {
            node: self.locator.me(),
            names: &[(dir.into(), name.into())],
            wait_ms: left.as_millis() as u64,
        };
        let found = self.ask(dir, &watch, Duration::ZERO)?;
        Ok(found
            .into_iter()
            .find(|(d, m, _)| d == dir && m == name)
            .map(|(_, _, n)| n))
    }

    /// Starts, once, this node's refresh of its readers' watches: each name waited for is
    /// registered again with its directory's home as it is now, every [`REFRESH`] and soon
    /// after a member is declared down or comes back (a home that died hands its directories
    /// to the next; one that restarted lost its table of watchers).
    fn keep_watches_registered(&self) {
        self.refresher.get_or_init(|| {
            let (locator, registering) = (self.locator.clone(), self.registering.clone());
            self.runtime.spawn(async move {
                let (mut seen, mut at) = (locator.liveness.changes(), tokio::time::Instant::now());
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(MEMBERS_LOOKED_AT) => {}
                        _ = registering.added.notified() => {
                            register_new(&locator, &registering).await;
                            continue;
                        }
                    }
                    let now = locator.liveness.changes();
                    if now == seen && at.elapsed() < REFRESH {
                        continue;
                    }
                    (seen, at) = (now, tokio::time::Instant::now());
                    register_again(&locator).await;
                }
            });
        });
    }
}

/// How often the refresh looks whether a member's state changed (a look is a load).
const MEMBERS_LOOKED_AT: Duration = Duration::from_millis(250);

/// Registers every name this node's readers wait for with its directory's home, in messages of
/// at most [`NAMES_PER_WATCH`] names; those published already wake their readers.
async fn register_again(locator: &Arc<LocatorService>) {
    let mut by_home: std::collections::HashMap<_, Vec<_>> = Default::default();
    for (dir, name) in locator.names_waited() {
        by_home
            .entry(locator.global_home(&dir))
            .or_default()
            .push((dir, name));
    }
    for (home, names) in by_home {
        for part in names.chunks(NAMES_PER_WATCH) {
            let watch = calls::Watch {
                node: locator.me(),
                names: part,
                wait_ms: KEPT.as_millis() as u64,
            };
            let reply = locator.call_home(home, watch.msg(), locator.timeout).await;
            if let Some(Ok(found)) = reply.map(calls::Watch::answer) {
                locator.names_are(&found);
            }
        }
    }
}

/// Registers the names readers began to wait for with their homes: those published already
/// wake their readers; those whose home did not answer are tried again later (doubling from
/// [`REGISTER_AGAIN`] up to [`REFRESH`], while a reader still waits).
async fn register_new(locator: &Arc<LocatorService>, registering: &Arc<Registering>) {
    let new = std::mem::take(&mut *crate::core::sync::lock(&registering.new));
    let now = std::time::Instant::now();
    let mut by_home: std::collections::HashMap<_, Vec<_>> = Default::default();
    for (key, until, again) in new {
        if until > now && locator.waiting.waits_for(&key.0, &key.1) {
            let home = locator.global_home(&key.0);
            by_home.entry(home).or_default().push((key, until, again));
        }
    }
    for (home, names) in by_home {
        for part in names.chunks(NAMES_PER_WATCH) {
            let last = part.iter().map(|(_, until, _)| *until).max().unwrap_or(now);
            let names: Vec<Key> = part.iter().map(|(key, _, _)| key.clone()).collect();
            let watch = calls::Watch {
                node: locator.me(),
                names: &names,
                wait_ms: last.saturating_duration_since(now).as_millis() as u64,
            };
            let reply = locator.call_home(home, watch.msg(), locator.timeout).await;
            match reply.map(calls::Watch::answer) {
                Some(Ok(found)) => locator.names_are(&found),
                m => {
                    let m = m.map(|r| r.map(|found| found.len()));
                    tracing::warn!(home, answer = ?m, "registering waits failed; trying again");
                    let (again, registering) = (part[0].2, registering.clone());
                    let retried = part.iter().map(|(key, until, again)| {
                        (key.clone(), *until, (*again * 2).min(REFRESH))
                    });
                    let retried: Vec<_> = retried.collect();
                    tokio::spawn(async move {
                        tokio::time::sleep(again).await;
                        registering.add(retried);
                    });
                }
            }
        }
    }
}

impl Namespace for ClusterNames {
    fn get(&self, dir: &str, name: &str, wait: Duration) -> std::io::Result<Option<Name>> {
        if !wait.is_zero() {
            return self.wait_for(dir, name, wait);
        }
        let n = self.ask(dir, &calls::Get { dir, name }, wait)?;
        self.checked(n)
    }

    /// The name's home is told by the refresh (see [`register_new`]), a name that arrives is
    /// checked as any from a home.
    fn watch(
        &self,
        dir: &str,
        name: &str,
        until: std::time::Instant,
        wake: Wake,
    ) -> Result<Watch, Wake> {
        let locator = self.locator.clone();
        let then = Box::new(move |n: Name| match check_name(&n, &locator.membership) {
            Ok(()) => wake(Ok(n)),
            Err(why) => wake(Err(LocatorError::BadName(why).into())),
        });
        let watching = Waiting::watch(&self.locator.waiting, dir, name, then);
        self.keep_watches_registered();
        let key = (dir.to_string(), name.to_string());
        self.registering.add([(key, until, REGISTER_AGAIN)]);
        Ok(Box::new(watching))
    }

    fn any(&self, dir: &str) -> std::io::Result<bool> {
        let (names, more) = self.ask(dir, &calls::List { dir, after: None }, Duration::ZERO)?;
        Ok(more || !names.is_empty())
    }

    /// Page by page: each asks for the names after the last one listed (a page that fails
    /// over asks the directory's new home from there), until the home says no more follow.
    fn list(&self, dir: &str) -> std::io::Result<Vec<(String, Name)>> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = calls::List {
                dir,
                after: after.as_deref(),
            };
            let (names, more) = self.ask(dir, &page, Duration::ZERO)?;
            // Each page moves forward, or a home could keep a lister asking forever.
            let forward = names
                .iter()
                .map(|(n, _)| n.as_str())
                .try_fold(after.as_deref(), |last, n| {
                    (last < Some(n)).then_some(Some(n))
                })
                .is_some();
            if !forward || (more && names.is_empty()) {
                return Err(
                    LocatorError::BadName(format!("a listing of {dir:?} went back")).into(),
                );
            }
            if let Some((last, _)) = names.last() {
                after = Some(last.clone());
            }
            // A malformed entry from the home is left out, the rest listed.
            all.extend(names.into_iter().filter(|(name, n)| {
                crate::core::paths::name(name).is_ok() && self.checked(Some(n.clone())).is_ok()
            }));
            if !more {
                return Ok(all);
            }
        }
    }

    fn set(&self, dir: &str, name: &str, entry: Option<Name>) -> std::io::Result<Option<Name>> {
        match self.ask(dir, &calls::Set { dir, name, entry }, Duration::ZERO)? {
            Ok(n) => Ok(n),
            // The owner has as many names as one user may: the producer's EDQUOT.
            Err(OverQuota(why)) => {
                tracing::warn!(%why, "a name was refused");
                Err(std::io::Error::from_raw_os_error(libc::EDQUOT))
            }
        }
    }

    fn release(&self, holder: NodeId, object: &str, size: u64, mtime_ns: i64, drop: bool) {
        let unhold = calls::Unhold {
            object,
            version: Version { size, mtime_ns },
            drop,
        };
        // Best effort: a holder that cannot be told keeps an evictable copy.
        let _ = self
            .runtime
            .block_on(self.locator.call(holder, unhold.msg()));
    }

    fn me(&self) -> NodeId {
        self.locator.me()
    }
}
