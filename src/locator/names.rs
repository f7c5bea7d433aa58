//! The produced namespace: files and directories written under the mount (not in the backing
//! tree) are published by name, per directory, to the directory's *name home* (a hash over all
//! members, like a global home). Consumers on any node look names up and list directories there.
//! A produced file's bytes live in its producer's cache as an immutable *object* (a cache key
//! that is not a backing path), found and pulled like any cached file; renaming a file only
//! moves its name. [`LocalNames`] holds the names of a single-node mount in process;
//! `cluster::names` asks name homes over the locator's RPCs; [`NameTable`] is what a name home
//! keeps.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::core::NodeId;
use crate::core::Version;
use crate::core::names::{Name, NameJournal, Namespace};
use crate::core::sync::lock;
use crate::transport::frame;

/// The names of the directories this node is name home of.
#[derive(Debug, Default)]
pub struct NameTable {
    dirs: HashMap<String, BTreeMap<String, Name>>,
    /// How many of the names each user owns (what one user may make a node hold is bounded).
    per_uid: HashMap<u32, u64>,
    /// The most one user may own here (`None`: [`MAX_NAMES_PER_UID`]).
    max_per_uid: Option<u64>,
}

/// The most names one user (root excepted) may own in one node's table by default
/// (`--max-names-per-user`): its directories' and the backup copies it keeps (a name costs the
/// daemon a few hundred bytes).
pub const MAX_NAMES_PER_UID: u64 = 4 << 20;

/// The start of a refusal for a user over [`MAX_NAMES_PER_UID`] (the producer's EDQUOT).
pub const OVER_QUOTA: &str = "quota:";

impl NameTable {
    /// The table a restart finds (`names`, its journal's), its users' names bounded by
    /// `max_per_uid`.
    pub fn restored(
        names: impl IntoIterator<Item = ((String, String), Name)>,
        max_per_uid: u64,
    ) -> NameTable {
        let mut table = NameTable {
            max_per_uid: Some(max_per_uid),
            ..NameTable::default()
        };
        for ((dir, name), entry) in names {
            table.set(&dir, &name, Some(entry));
        }
        table
    }

    /// Why `new` (replacing `old`) may not be set: its owner would own more names here than
    /// one user may. A name of root's, a removal, or a new version of the owner's own name
    /// always may.
    pub fn over_bound(&self, old: Option<&Name>, new: Option<&Name>) -> Option<String> {
        let n = new?;
        let max = self.max_per_uid.unwrap_or(MAX_NAMES_PER_UID);
        if n.uid == 0 || old.is_some_and(|o| o.uid == n.uid) {
            return None;
        }
        let owned = self.per_uid.get(&n.uid).copied().unwrap_or(0);
        (owned >= max).then(|| {
            format!(
                "{OVER_QUOTA} uid {} owns {owned} names here, the most one user may",
                n.uid
            )
        })
    }

    pub fn get(&self, dir: &str, name: &str) -> Option<Name> {
        self.dirs.get(dir)?.get(name).cloned()
    }

    /// How many names the table holds (every name is some user's).
    pub fn count(&self) -> u64 {
        self.per_uid.values().sum()
    }

    /// Every name of every directory: (directory, name, entry).
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str, &Name)> {
        self.dirs
            .iter()
            .flat_map(|(d, names)| names.iter().map(move |(n, e)| (d.as_str(), n.as_str(), e)))
    }

    pub fn list(&self, dir: &str) -> Vec<(String, Name)> {
        self.dirs
            .get(dir)
            .map(|d| d.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// The names of `dir` after `after` (all with `None`), in order, as many as encode to at
    /// most `max_bytes` (at least one), and whether more follow: a page of a listing, so no
    /// answer outgrows a frame however many names a directory holds.
    pub fn page(
        &self,
        dir: &str,
        after: Option<&str>,
        max_bytes: usize,
    ) -> (Vec<(String, Name)>, bool) {
        use std::ops::Bound;
        let Some(d) = self.dirs.get(dir) else {
            return (Vec::new(), false);
        };
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut out = Vec::new();
        let mut bytes = 0;
        for (n, e) in d.range::<str, _>((from, Bound::Unbounded)) {
            let len = frame::encoded_len(&(n, e));
            if !out.is_empty() && bytes + len > max_bytes {
                return (out, true);
            }
            bytes += len;
            out.push((n.clone(), e.clone()));
        }
        (out, false)
    }

    /// [`NameTable::set`], told first to `journal`, which is then compacted from the table if
    /// it has grown well past it (under the caller's lock on the table, as the change was).
    pub fn set_journaled(
        &mut self,
        journal: Option<&dyn NameJournal>,
        dir: &str,
        name: &str,
        entry: Option<Name>,
    ) -> Option<Name> {
        let Some(j) = journal else {
            return self.set(dir, name, entry);
        };
        j.record(dir, name, entry.as_ref());
        let old = self.set(dir, name, entry);
        if j.wants_compact() {
            j.compact(&mut self.entries());
        }
        old
    }

    /// Publishes (`Some`) or removes (`None`) a name; returns what it replaced.
    pub fn set(&mut self, dir: &str, name: &str, entry: Option<Name>) -> Option<Name> {
        if let Some(e) = &entry {
            *self.per_uid.entry(e.uid).or_default() += 1;
        }
        let old = self.replace(dir, name, entry);
        if let Some(o) = &old
            && let Some(n) = self.per_uid.get_mut(&o.uid)
        {
            *n -= 1;
            if *n == 0 {
                self.per_uid.remove(&o.uid);
            }
        }
        old
    }

    fn replace(&mut self, dir: &str, name: &str, entry: Option<Name>) -> Option<Name> {
        match entry {
            Some(e) => self
                .dirs
                .entry(dir.to_string())
                .or_default()
                .insert(name.to_string(), e),
            None => {
                let d = self.dirs.get_mut(dir)?;
                let old = d.remove(name);
                if d.is_empty() {
                    self.dirs.remove(dir);
                }
                old
            }
        }
    }
}

/// The lookups waiting at a name home for names not set yet, by (directory, name): a change of
/// a name wakes the lookups waiting for it (and no other), so a wait costs nothing until then:
/// no timer per waiter, no polling of the table.
#[derive(Default)]
pub struct NameWaits {
    waits: Mutex<HashMap<(String, String), Waiting>>,
}

/// The lookups waiting for one name: what wakes them, and how many they are.
type Waiting = (Arc<tokio::sync::Notify>, usize);

/// One lookup's registration; dropping it unregisters.
pub struct NameWait<'a> {
    waits: &'a NameWaits,
    key: (String, String),
    pub notify: Arc<tokio::sync::Notify>,
}

impl NameWaits {
    /// Registers a lookup waiting for `name` of `dir`.
    pub fn register(&self, dir: &str, name: &str) -> NameWait<'_> {
        let key = (dir.to_string(), name.to_string());
        let mut waits = lock(&self.waits);
        let (notify, count) = waits.entry(key.clone()).or_default();
        *count += 1;
        NameWait {
            waits: self,
            key,
            notify: notify.clone(),
        }
    }

    /// `name` of `dir` changed: its waiting lookups look again.
    pub fn wake(&self, dir: &str, name: &str) {
        let waits = lock(&self.waits);
        if waits.is_empty() {
            return;
        }
        if let Some((notify, _)) = waits.get(&(dir.to_string(), name.to_string())) {
            notify.notify_waiters();
        }
    }

    /// How many lookups wait (stats, tests).
    pub fn waiting(&self) -> usize {
        lock(&self.waits).values().map(|(_, n)| n).sum()
    }
}

impl Drop for NameWait<'_> {
    fn drop(&mut self) {
        let mut waits = lock(&self.waits.waits);
        if let Some((_, count)) = waits.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                waits.remove(&self.key);
            }
        }
    }
}

/// What a holder does when told to release an object (set by the daemon: it knows the cache).
pub type ReleaseFn = Box<dyn Fn(&str, u64, i64, bool) + Send + Sync>;
/// Visits the copies a node holds, (path, version) each: a caller keeps the few it wants (a
/// node of 14 million files would otherwise list them all for each restarted peer).
pub type HoldingsFn = Box<dyn Fn(&mut dyn FnMut(&str, Version)) + Send + Sync>;

/// The namespace of a single-node mount: one table in this process; a lookup waiting for a
/// name sleeps until the table changes.
#[derive(Default)]
pub struct LocalNames {
    table: Mutex<NameTable>,
    changed: Condvar,
    /// Where every change is kept for the next start (none: in memory only).
    journal: Option<Arc<dyn NameJournal>>,
}

impl LocalNames {
    /// A single node's names as a restart finds them (`names`), every change told to `journal`.
    /// `max_per_uid`: the most names one user may own (`--max-names-per-user`).
    pub fn restored(
        names: impl IntoIterator<Item = ((String, String), Name)>,
        journal: Arc<dyn NameJournal>,
        max_per_uid: u64,
    ) -> LocalNames {
        LocalNames {
            table: Mutex::new(NameTable::restored(names, max_per_uid)),
            changed: Condvar::new(),
            journal: Some(journal),
        }
    }

    /// Every name (the sweep of unnamed objects asks).
    pub fn entries(&self) -> Vec<(String, String, Name)> {
        self.table()
            .entries()
            .map(|(d, n, e)| (d.to_string(), n.to_string(), e.clone()))
            .collect()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, NameTable> {
        lock(&self.table)
    }
}

impl Namespace for LocalNames {
    fn get(&self, dir: &str, name: &str, wait: Duration) -> io::Result<Option<Name>> {
        let deadline = Instant::now() + wait;
        let mut table = self.table();
        loop {
            if let Some(n) = table.get(dir, name) {
                return Ok(Some(n));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            table = self
                .changed
                .wait_timeout(table, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn list(&self, dir: &str) -> io::Result<Vec<(String, Name)>> {
        Ok(self.table().list(dir))
    }

    fn set(&self, dir: &str, name: &str, entry: Option<Name>) -> io::Result<Option<Name>> {
        let old = {
            let mut table = self.table();
            let old = table.get(dir, name);
            if let Some(why) = table.over_bound(old.as_ref(), entry.as_ref()) {
                tracing::warn!(%why, "refused a name");
                return Err(io::Error::from_raw_os_error(libc::EDQUOT));
            }
            // Kept in the order the table changes (under its lock).
            table.set_journaled(self.journal.as_deref(), dir, name, entry)
        };
        self.changed.notify_all();
        Ok(old)
    }

    fn release(&self, _holder: NodeId, _object: &str, _size: u64, _mtime_ns: i64, _drop: bool) {
        // Every object of a single node is its own: the filesystem releases those directly.
    }

    fn me(&self) -> NodeId {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(object: &str) -> Name {
        Name {
            dir: false,
            object: object.into(),
            size: 3,
            mtime_ns: 1,
            mode: 0o644,
            holder: 2,
            uid: 1000,
            gid: 1000,
            meta: Default::default(),
        }
    }

    #[test]
    fn set_get_list_remove() {
        let mut t = NameTable::default();
        assert_eq!(t.set("d", "b", Some(file("o1"))), None);
        assert_eq!(t.set("d", "a", Some(file("o2"))), None);
        assert_eq!(t.get("d", "b"), Some(file("o1")));
        let names: Vec<_> = t.list("d").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["a", "b"]);
        // A new version replaces the old and says which it was.
        assert_eq!(t.set("d", "b", Some(file("o3"))), Some(file("o1")));
        assert_eq!(t.set("d", "b", None), Some(file("o3")));
        assert_eq!(t.set("d", "a", None), Some(file("o2")));
        assert!(t.list("d").is_empty());
        assert_eq!(t.set("d", "a", None), None);
    }

    #[test]
    fn pages_resume_after_their_cursor_and_stay_within_their_bytes() {
        let mut t = NameTable::default();
        let names: Vec<String> = (0..1000).map(|i| format!("{i:0>250}")).collect();
        for n in &names {
            t.set("d", n, Some(file("//produced/2/1-1")));
        }
        let one = frame::encoded_len(&(&names[0], &file("//produced/2/1-1")));
        let (mut got, mut after, mut pages) = (Vec::new(), None::<String>, 0);
        loop {
            let (page, more) = t.page("d", after.as_deref(), 10 * one + one / 2);
            assert!(page.len() == 10 || !more, "{}", page.len());
            after = page.last().map(|(n, _)| n.clone());
            got.extend(page.into_iter().map(|(n, _)| n));
            pages += 1;
            if !more {
                break;
            }
        }
        assert_eq!((got, pages), (names, 100));
        // An entry larger than the bound still makes a page of its own; a missing directory
        // is an empty last page.
        assert_eq!(t.page("d", None, 1).0.len(), 1);
        assert_eq!(t.page("none", None, 1), (Vec::new(), false));
        let last = t.page("d", Some(&"9".repeat(250)), 1 << 20);
        assert_eq!(last, (Vec::new(), false));
    }

    #[test]
    fn local_wait_is_bounded_and_sees_a_later_publish() {
        let names = std::sync::Arc::new(LocalNames::default());
        let t = Instant::now();
        assert_eq!(names.get("", "x", Duration::from_millis(50)).unwrap(), None);
        assert!(t.elapsed() >= Duration::from_millis(50));
        let n2 = names.clone();
        let producer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            n2.set("", "x", Some(file("o"))).unwrap();
        });
        let got = names.get("", "x", Duration::from_secs(10)).unwrap();
        assert_eq!(got, Some(file("o")));
        producer.join().unwrap();
    }

    /// A lookup waiting at a home is woken by the change of its name, not of another, and
    /// its registration goes when it does.
    #[test]
    fn a_wait_is_woken_by_its_name_only() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let waits = NameWaits::default();
        rt.block_on(async {
            let w = waits.register("d", "x");
            assert_eq!(waits.waiting(), 1);
            let notified = w.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            waits.wake("d", "y");
            let other = tokio::time::timeout(Duration::from_millis(50), notified.as_mut()).await;
            assert!(other.is_err(), "woken by another name");
            waits.wake("d", "x");
            tokio::time::timeout(Duration::from_secs(5), notified)
                .await
                .expect("woken by its own name");
        });
        assert_eq!(waits.waiting(), 0);
    }

    /// One user's names in a table are bounded (root's are not), and a user at the bound may
    /// still replace or remove its own; a removal gives the place back.
    #[test]
    fn a_users_names_are_bounded() {
        let mut t = NameTable::restored([], 3);
        let of = |uid: u32| Name { uid, ..file("o") };
        for i in 0..3 {
            let n = of(7);
            assert_eq!(t.over_bound(None, Some(&n)), None);
            t.set("d", &format!("f{i}"), Some(n));
        }
        let why = t.over_bound(None, Some(&of(7))).unwrap();
        assert!(
            why.starts_with(OVER_QUOTA) && why.contains("uid 7"),
            "{why}"
        );
        assert_eq!(t.over_bound(t.get("d", "f0").as_ref(), Some(&of(7))), None);
        assert_eq!(t.over_bound(None, Some(&of(8))), None, "another user");
        assert_eq!(t.over_bound(None, Some(&of(0))), None, "root");
        t.set("d", "f0", None);
        assert_eq!(
            t.over_bound(None, Some(&of(7))),
            None,
            "a removal gives it back"
        );
        t.set("d", "f1", Some(of(8)));
        assert_eq!(
            t.over_bound(None, Some(&of(7))),
            None,
            "a name given to another"
        );
    }

    /// A journal that wants a rewrite every third record, and keeps what it was told.
    #[derive(Default)]
    struct Kept {
        records: Mutex<Vec<(String, String, Option<Name>)>>,
        rewrites: Mutex<Vec<Vec<(String, String, Name)>>>,
    }

    impl NameJournal for Kept {
        fn record(&self, dir: &str, name: &str, entry: Option<&Name>) {
            let mut records = lock(&self.records);
            records.push((dir.into(), name.into(), entry.cloned()));
        }

        fn wants_compact(&self) -> bool {
            lock(&self.records).len().is_multiple_of(3)
        }

        fn compact<'a>(&self, live: &mut dyn Iterator<Item = (&'a str, &'a str, &'a Name)>) {
            let live = live.map(|(d, n, e)| (d.into(), n.into(), e.clone()));
            lock(&self.rewrites).push(live.collect());
        }
    }

    #[test]
    fn a_journal_is_rewritten_from_the_table_with_the_change_that_asked() {
        let kept = Kept::default();
        let mut t = NameTable::default();
        t.set_journaled(Some(&kept), "d", "a", Some(file("o1")));
        t.set_journaled(Some(&kept), "d", "b", Some(file("o2")));
        assert!(lock(&kept.rewrites).is_empty());
        let old = t.set_journaled(Some(&kept), "d", "a", None);
        assert_eq!(old, Some(file("o1")));
        assert_eq!(lock(&kept.records).len(), 3);
        let rewrites = lock(&kept.rewrites);
        assert_eq!(*rewrites, [vec![("d".into(), "b".into(), file("o2"))]]);
        drop(rewrites);
        t.set_journaled(None, "d", "c", Some(file("o3")));
        assert_eq!(lock(&kept.records).len(), 3, "no journal: none told");
    }
}
