//! The name home's side of a node: the produced names of the directories it is home (or
//! backup) of, the lookups waiting here for names not set yet, and the nodes watching names.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::core::names::{Name, NameJournal};
use crate::core::sync::lock;
use crate::locator::check::check_change;
use crate::locator::membership::NodeId;
use crate::locator::names::{NameTable, NameWaits};
use crate::locator::pages;
use crate::locator::proto::Msg;
use crate::locator::watching::Watchers;
use crate::stats::Stats;

/// The longest a name home holds a `NameGet` open, whatever the caller asks.
const MAX_NAME_WAIT: Duration = Duration::from_secs(3600);

/// The names kept here, who waits for them and who watches them.
pub(in crate::locator) struct NameHome {
    /// Produced names of the directories this node is name home (or backup) of.
    table: Mutex<NameTable>,
    /// Lookups waiting here for names not set yet.
    waits: NameWaits,
    /// The nodes watching names of the directories this node is home of.
    watchers: Watchers,
    /// Where the names are kept for this node's next start.
    journal: Option<Arc<dyn NameJournal>>,
    stats: Arc<Stats>,
}

impl NameHome {
    pub(super) fn new(journal: Option<Arc<dyn NameJournal>>, stats: Arc<Stats>) -> NameHome {
        NameHome {
            table: Mutex::default(),
            waits: NameWaits::default(),
            watchers: Watchers::default(),
            journal,
            stats,
        }
    }

    /// The names this node held before it restarted, back in its table (at most
    /// `max_per_uid` for one user).
    pub(super) fn restore(
        &self,
        names: impl IntoIterator<Item = ((String, String), Name)>,
        max_per_uid: u64,
    ) {
        let table = NameTable::restored(names, max_per_uid);
        self.stats
            .home_names
            .store(table.count(), Ordering::Relaxed);
        *lock(&self.table) = table;
    }

    /// `f` of the table, under its lock.
    pub(in crate::locator) fn with_table<R>(&self, f: impl FnOnce(&NameTable) -> R) -> R {
        f(&lock(&self.table))
    }

    /// The name, once it is set or the wait (`wait_ms`, bounded) ends, whichever is first.
    /// Woken by the set itself (`waits`), never by a timer.
    pub(super) async fn get(&self, dir: &str, name: &str, wait_ms: u64) -> Msg {
        // A number from the wire: bounded, so no caller holds a home's task for long.
        let wait = Duration::from_millis(wait_ms).min(MAX_NAME_WAIT);
        let found = lock(&self.table).get(dir, name);
        if found.is_some() || wait.is_zero() {
            return Msg::NameIs(found);
        }
        // Registered before the table is looked at again, so a set in between wakes it.
        let deadline = tokio::time::Instant::now() + wait;
        let registered = self.waits.register(dir, name);
        loop {
            let woken = registered.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let found = lock(&self.table).get(dir, name);
            if found.is_some() || tokio::time::Instant::now() >= deadline {
                return Msg::NameIs(found);
            }
            let _ = tokio::time::timeout_at(deadline, woken).await;
        }
    }

    /// `node` watches `names` for up to `wait_ms` (bounded); those published already are the
    /// answer, the others it is told of when they are (see [`NameHome::watchers_of`]).
    pub(super) fn watch(&self, node: NodeId, names: Vec<(String, String)>, wait_ms: u64) -> Msg {
        let until = Instant::now() + Duration::from_millis(wait_ms).min(MAX_NAME_WAIT);
        let mut found = Vec::new();
        let table = lock(&self.table);
        for (dir, name) in names {
            match table.get(&dir, &name) {
                Some(n) => found.push((dir, name, n)),
                None => {
                    // (Past its bound a node learns of the name at its reader's deadline.)
                    self.watchers.add(node, (dir, name), until);
                }
            }
        }
        Msg::NamesAre(found)
    }

    /// The nodes watching `name` of `dir`, no longer watching it (each is told once).
    pub(super) fn watchers_of(&self, dir: &str, name: &str) -> Vec<NodeId> {
        self.watchers.take(dir, name)
    }

    /// A page of the names of `dir` after `after`.
    pub(super) fn list(&self, dir: &str, after: Option<&str>) -> Msg {
        let (names, more) = lock(&self.table).page(dir, after, pages::PAGE_BYTES);
        Msg::Names { names, more }
    }

    /// Sets (or removes) a name if `peer` may, journals it and wakes its waiters; the name it
    /// replaced, or why the change was refused.
    pub(super) fn set(
        &self,
        dir: &str,
        name: &str,
        entry: Option<Name>,
        peer: Option<NodeId>,
    ) -> Result<Option<Name>, String> {
        let old = {
            let mut names = lock(&self.table);
            let old = names.get(dir, name);
            check_change(dir, name, old.as_ref(), entry.as_ref(), peer).and_then(|()| {
                names
                    .over_bound(old.as_ref(), entry.as_ref())
                    .map_or(Ok(()), Err)
            })?;
            let old = names.set_journaled(self.journal.as_deref(), dir, name, entry);
            self.stats
                .home_names
                .store(names.count(), Ordering::Relaxed);
            old
        };
        self.waits.wake(dir, name);
        Ok(old)
    }

    /// Keeps (and journals) a name as given (a home's copy at its backup, or a backup's given
    /// back to its home), and wakes anyone here waiting for it.
    pub(super) fn store(&self, dir: &str, name: &str, entry: Option<Name>) {
        {
            let mut names = lock(&self.table);
            names.set_journaled(self.journal.as_deref(), dir, name, entry);
            self.stats
                .home_names
                .store(names.count(), Ordering::Relaxed);
        }
        self.waits.wake(dir, name);
    }

    /// The objects of `holder` the names here point at.
    pub(in crate::locator) fn objects_of(&self, holder: NodeId) -> HashSet<String> {
        lock(&self.table)
            .entries()
            .filter(|(_, _, n)| !n.dir && n.holder == holder)
            .map(|(_, _, n)| n.object.clone())
            .collect()
    }

    /// The objects that names kept here say `holder` keeps, after `after`, a page of them
    /// (the holder's sweep of unnamed objects asks).
    pub(super) fn objects_page(&self, holder: NodeId, after: Option<&str>) -> Msg {
        let mut objects: Vec<String> = lock(&self.table)
            .entries()
            .filter(|(_, _, n)| !n.dir && n.holder == holder && !n.object.is_empty())
            .map(|(_, _, n)| n.object.as_str())
            .filter(|o| after.is_none_or(|a| *o > a))
            .map(String::from)
            .collect();
        objects.sort_unstable();
        objects.dedup();
        let fit = pages::fitting(&objects);
        let more = fit < objects.len();
        objects.truncate(fit);
        Msg::Objects { objects, more }
    }
}
