//! Names this node's readers wait for (`--wait`), and the nodes that wait for names this node is
//! home of. A reader's node registers the name with its home (`NameWatch`, answered at once with
//! the names published already); the home tells it the moment the name is published
//! (`NamesAre`, pushed), and the reader's slot wakes. Nothing polls: a waiting reader costs its
//! home an entry in a table, and its node one refresh per [`REFRESH`] for all of them, and one
//! when a member is declared down or comes back (which carries the waits to a directory's new
//! home after a failover, or back to a restarted one).

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::membership::NodeId;
use crate::core::names::{Name, Namespace, Wake, Watch};
use crate::core::sync::lock;

/// How often a node registers again every name its readers wait for, with each directory's
/// home as it is now: a home that died (or restarted, its table of watchers empty) learns of
/// them within this.
pub const REFRESH: Duration = Duration::from_secs(10);

/// How long a home keeps a watch a node did not register again.
pub const KEPT: Duration = Duration::from_secs(3 * REFRESH.as_secs());

/// The most names one `NameWatch` carries (a refresh sends several).
pub const NAMES_PER_WATCH: usize = 1024;

/// A (directory, name) pair.
pub type Key = (String, String);

/// This node's readers waiting for names, by name.
#[derive(Default)]
pub struct Waiting {
    slots: Mutex<HashMap<Key, Vec<Arc<Slot>>>>,
}

/// What a wait that holds no thread does with its name (see [`Waiting::watch`]).
pub type Then = Box<dyn FnOnce(Name) + Send>;

/// Where a published name arrives for one waiting reader: a thread asleep on it, or a callback.
#[derive(Default)]
pub struct Slot {
    found: Mutex<Option<Name>>,
    ready: Condvar,
    then: Mutex<Option<Then>>,
}

/// One reader's registration; dropping it unregisters.
pub struct Wait<'a> {
    waiting: &'a Waiting,
    key: Key,
    slot: Arc<Slot>,
}

/// One reader's wait that holds no thread; dropping it unregisters, and its callback is not
/// called after (unless a delivery was calling it already).
pub struct Watching {
    waiting: Arc<Waiting>,
    key: Key,
    slot: Arc<Slot>,
}

impl Waiting {
    pub fn register(&self, dir: &str, name: &str) -> Wait<'_> {
        let (key, slot) = self.add(dir, name, None);
        Wait {
            waiting: self,
            key,
            slot,
        }
    }

    /// A reader waits for `name` of `dir` holding no thread: `then` is called with it, on the
    /// thread that delivers it.
    pub fn watch(this: &Arc<Waiting>, dir: &str, name: &str, then: Then) -> Watching {
        let (key, slot) = this.add(dir, name, Some(then));
        Watching {
            waiting: this.clone(),
            key,
            slot,
        }
    }

    fn add(&self, dir: &str, name: &str, then: Option<Then>) -> (Key, Arc<Slot>) {
        let key = (dir.to_string(), name.to_string());
        let slot = Arc::new(Slot {
            then: Mutex::new(then),
            ..Slot::default()
        });
        lock(&self.slots)
            .entry(key.clone())
            .or_default()
            .push(slot.clone());
        (key, slot)
    }

    fn remove(&self, key: &Key, slot: &Arc<Slot>) {
        let mut slots = lock(&self.slots);
        if let Some(v) = slots.get_mut(key) {
            v.retain(|s| !Arc::ptr_eq(s, slot));
            if v.is_empty() {
                slots.remove(key);
            }
        }
    }

    /// `name` of `dir` was published as `n`: every reader waiting for it wakes with it.
    pub fn deliver(&self, dir: &str, name: &str, n: &Name) {
        let Some(slots) = lock(&self.slots).remove(&(dir.to_string(), name.to_string())) else {
            return;
        };
        for s in slots {
            // (Taken before it is called: a callback may drop its own watch.)
            let then = lock(&s.then).take();
            if let Some(then) = then {
                then(n.clone());
                continue;
            }
            *lock(&s.found) = Some(n.clone());
            s.ready.notify_all();
        }
    }

    /// Whether a reader waits for `name` of `dir`.
    pub fn waits_for(&self, dir: &str, name: &str) -> bool {
        let slots = lock(&self.slots);
        !slots.is_empty() && slots.contains_key(&(dir.to_string(), name.to_string()))
    }

    /// The names waited for now.
    pub fn keys(&self) -> Vec<Key> {
        lock(&self.slots).keys().cloned().collect()
    }

    /// How many readers wait (stats, tests).
    pub fn readers(&self) -> usize {
        lock(&self.slots).values().map(Vec::len).sum()
    }
}

impl Wait<'_> {
    /// The name, once it is delivered, or `None` at `deadline`.
    pub fn until(&self, deadline: Instant) -> Option<Name> {
        let mut found = lock(&self.slot.found);
        loop {
            if let Some(n) = found.take() {
                return Some(n);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            found = match self.slot.ready.wait_timeout(found, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        self.waiting.remove(&self.key, &self.slot);
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.waiting.remove(&self.key, &self.slot);
        lock(&self.slot.then).take();
    }
}

/// A single node's namespace whose readers wait holding no thread: its own publications wake
/// them (a cluster's name homes push theirs instead: see `cluster::names`).
pub struct Watched {
    names: Arc<dyn Namespace>,
    waiting: Arc<Waiting>,
}

impl Watched {
    pub fn new(names: Arc<dyn Namespace>) -> Watched {
        Watched {
            names,
            waiting: Arc::default(),
        }
    }
}

impl Namespace for Watched {
    fn get(&self, dir: &str, name: &str, wait: Duration) -> io::Result<Option<Name>> {
        self.names.get(dir, name, wait)
    }

    /// Registered first, then looked up: a name published in between is found by one or the
    /// other.
    fn watch(&self, dir: &str, name: &str, _until: Instant, wake: Wake) -> Result<Watch, Wake> {
        let w = Waiting::watch(&self.waiting, dir, name, Box::new(move |n| wake(Ok(n))));
        if let Ok(Some(n)) = self.names.get(dir, name, Duration::ZERO) {
            self.waiting.deliver(dir, name, &n);
        }
        Ok(Box::new(w))
    }

    fn list(&self, dir: &str) -> io::Result<Vec<(String, Name)>> {
        self.names.list(dir)
    }

    fn any(&self, dir: &str) -> io::Result<bool> {
        self.names.any(dir)
    }

    fn set(&self, dir: &str, name: &str, entry: Option<Name>) -> io::Result<Option<Name>> {
        let published = entry.is_some();
        let old = self.names.set(dir, name, entry)?;
        if published
            && self.waiting.waits_for(dir, name)
            && let Ok(Some(n)) = self.names.get(dir, name, Duration::ZERO)
        {
            self.waiting.deliver(dir, name, &n);
        }
        Ok(old)
    }

    fn release(&self, holder: NodeId, object: &str, size: u64, mtime_ns: i64, drop: bool) {
        self.names.release(holder, object, size, mtime_ns, drop);
    }

    fn me(&self) -> NodeId {
        self.names.me()
    }
}

/// At a name home: the nodes watching names not published yet, until when.
#[derive(Default)]
pub struct Watchers {
    inner: Mutex<WatchersInner>,
}

#[derive(Default)]
struct WatchersInner {
    by_name: HashMap<Key, Vec<(NodeId, Instant)>>,
    per_node: HashMap<NodeId, usize>,
    added: usize,
}

impl Watchers {
    /// The most watches one node keeps at a home (a member's flood stays bounded).
    pub const PER_NODE: usize = 1 << 16;

    /// `node` watches `key` until `until`; false if it keeps [`Watchers::PER_NODE`] already.
    pub fn add(&self, node: NodeId, key: Key, until: Instant) -> bool {
        let mut guard = lock(&self.inner);
        let w = &mut *guard;
        w.added += 1;
        if w.added.is_multiple_of(4096) {
            w.forget_expired(Instant::now());
        }
        let known = w.by_name.get_mut(&key);
        if let Some(e) = known.and_then(|v| v.iter_mut().find(|(n, _)| *n == node)) {
            e.1 = e.1.max(until);
            return true;
        }
        let count = w.per_node.entry(node).or_default();
        if *count >= Self::PER_NODE {
            return false;
        }
        *count += 1;
        w.by_name.entry(key).or_default().push((node, until));
        true
    }

    /// The nodes watching `key` (it was published): each is told once, then forgotten.
    pub fn take(&self, dir: &str, name: &str) -> Vec<NodeId> {
        let mut guard = lock(&self.inner);
        let w = &mut *guard;
        if w.by_name.is_empty() {
            return Vec::new();
        }
        let Some(entries) = w.by_name.remove(&(dir.to_string(), name.to_string())) else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut nodes = Vec::new();
        for (node, until) in entries {
            w.release(node);
            if until > now {
                nodes.push(node);
            }
        }
        nodes
    }

    /// How many watches are kept (stats, tests).
    pub fn kept(&self) -> usize {
        lock(&self.inner).per_node.values().sum()
    }
}

impl WatchersInner {
    fn release(&mut self, node: NodeId) {
        if let Some(n) = self.per_node.get_mut(&node) {
            *n -= 1;
            if *n == 0 {
                self.per_node.remove(&node);
            }
        }
    }

    fn forget_expired(&mut self, now: Instant) {
        let mut gone = Vec::new();
        self.by_name.retain(|_, v| {
            v.retain(|&(node, until)| {
                let keep = until > now;
                if !keep {
                    gone.push(node);
                }
                keep
            });
            !v.is_empty()
        });
        for node in gone {
            self.release(node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> Key {
        ("d".into(), n.into())
    }

    #[test]
    fn a_published_name_wakes_its_readers_and_only_them() {
        let w = Waiting::default();
        let (a, b) = (w.register("d", "a"), w.register("d", "b"));
        let a2 = w.register("d", "a");
        assert_eq!(w.readers(), 3);
        w.deliver("d", "a", &Name::pointer("1-2-3", 1));
        let soon = Instant::now() + Duration::from_millis(50);
        assert!(a.until(soon).is_some() && a2.until(soon).is_some());
        assert!(b.until(soon).is_none(), "another name's reader waits on");
        drop((a, a2));
        assert_eq!(w.keys(), vec![key("b")]);
        drop(b);
        assert_eq!(w.readers(), 0);
    }

    #[test]
    fn a_watch_is_called_once_with_its_name_and_never_once_dropped() {
        let names = Watched::new(Arc::new(super::super::names::LocalNames::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        let later = Instant::now() + Duration::from_secs(60);
        let wake = |tx: std::sync::mpsc::Sender<_>, tag| -> Wake {
            Box::new(move |n: io::Result<Name>| tx.send((tag, n.unwrap().object)).unwrap())
        };
        let a = names
            .watch("d", "a", later, wake(tx.clone(), 1))
            .ok()
            .unwrap();
        let dropped = names
            .watch("d", "a", later, wake(tx.clone(), 2))
            .ok()
            .unwrap();
        let b = names
            .watch("d", "b", later, wake(tx.clone(), 3))
            .ok()
            .unwrap();
        drop(dropped);
        assert!(rx.try_recv().is_err(), "nothing published yet");
        let file = |o: &str| Name {
            object: format!("//produced/0/{o}"),
            mode: 0o644,
            ..Name::default()
        };
        names.set("d", "a", Some(file("x"))).unwrap();
        assert_eq!(rx.try_recv().unwrap(), (1, "//produced/0/x".into()));
        assert!(
            rx.try_recv().is_err(),
            "the dropped watch and another name's stay quiet"
        );
        let c = names.watch("d", "a", later, wake(tx, 4)).ok().unwrap();
        assert_eq!(rx.try_recv().unwrap().0, 4, "published already: at once");
        drop((a, b, c));
        assert_eq!(names.waiting.readers(), 0);
    }

    #[test]
    fn a_home_tells_each_watching_node_once_and_bounds_each() {
        let h = Watchers::default();
        let later = Instant::now() + Duration::from_secs(60);
        assert!(h.add(1, key("a"), later));
        assert!(h.add(1, key("a"), later), "a refresh is the same watch");
        assert!(h.add(2, key("a"), later));
        assert!(
            h.add(3, key("a"), Instant::now()),
            "expired by the time it is published"
        );
        assert_eq!(h.kept(), 3);
        let mut told = h.take("d", "a");
        told.sort_unstable();
        assert_eq!(told, vec![1, 2]);
        assert!(h.take("d", "a").is_empty());
        assert_eq!(h.kept(), 0);
        for i in 0..Watchers::PER_NODE {
            assert!(h.add(9, key(&i.to_string()), later));
        }
        assert!(!h.add(9, key("one more"), later));
        assert!(h.add(8, key("one more"), later), "another node's own bound");
    }
}
