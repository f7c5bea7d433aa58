//! Opens waiting for a produced name (`--wait`) without a thread each: a wait is an entry in a
//! table, woken by the namespace when its name is published ([`Namespace::watch`]) or by its
//! deadline, and finished (the open made, the reply sent) by one of a few threads for the
//! whole mount. Thousands of readers waiting cost as many entries, not as many threads.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::core::names::{Name, Namespace, Wake, Watch};
use crate::core::sync::lock;

/// The threads that finish waits, for the whole mount (a finish is a lookup and an open, or at
/// a deadline one last look at the name).
const THREADS: usize = 4;

/// A finishing thread's stack: it opens a file, which may ask a name home.
const STACK: usize = 256 << 10;

/// What a wait learnt: the name, why it cannot be waited for, or nothing by its deadline.
pub type Told = Option<io::Result<Name>>;

/// What finishes a wait, on one of the waiting threads.
pub(super) type Finish = Box<dyn FnOnce(Told) + Send>;

/// A wait not finished: the namespace's watch (dropped when it finishes) and what finishes it.
type Pending = (Option<Watch>, Finish);

/// The waits of a mount and the threads that finish them (started at the first wait).
#[derive(Default)]
pub struct Waits {
    shared: Arc<Shared>,
    started: std::sync::OnceLock<()>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    work: Condvar,
}

#[derive(Default)]
struct State {
    next: u64,
    /// Waits not finished yet.
    pending: HashMap<u64, Pending>,
    /// Their deadlines, soonest first (a wait finished before its deadline leaves its entry
    /// until the heap is rebuilt: see [`State::forget_finished`]).
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Waits woken, to finish.
    woken: VecDeque<(u64, io::Result<Name>)>,
    stopping: bool,
}

impl State {
    /// The next wait to finish now, or how long until one's deadline.
    fn next(&mut self, now: Instant) -> Result<(Pending, Told), Option<Duration>> {
        while let Some((id, told)) = self.woken.pop_front() {
            if let Some(p) = self.pending.remove(&id) {
                return Ok((p, Some(told)));
            }
        }
        while let Some(&Reverse((at, id))) = self.deadlines.peek() {
            if at > now {
                return Err(Some(at - now));
            }
            self.deadlines.pop();
            if let Some(p) = self.pending.remove(&id) {
                return Ok((p, None));
            }
        }
        Err(None)
    }

    /// Drops the deadlines of waits finished already once they outnumber the waiting ones (a
    /// long `--wait` and many quick waits must not grow the heap without bound).
    fn forget_finished(&mut self) {
        if self.deadlines.len() > 2 * self.pending.len() + 64 {
            let pending = &self.pending;
            self.deadlines
                .retain(|Reverse((_, id))| pending.contains_key(id));
        }
    }
}

impl Waits {
    /// Starts a wait until `until`: `watch` is given what wakes it and starts the namespace's
    /// watch (or hands the waker back if it cannot: then a thread waits with `fallback`);
    /// `finish` is called once, on a waiting thread, with what the wait learnt.
    pub fn start(
        &self,
        until: Instant,
        watch: impl FnOnce(Wake) -> Result<Watch, Wake>,
        fallback: impl FnOnce(Wake) -> io::Result<()>,
        finish: Finish,
    ) -> io::Result<()> {
        self.start_threads()?;
        let id = {
            let mut s = lock(&self.shared.state);
            s.next += 1;
            let id = s.next;
            s.pending.insert(id, (None, finish));
            s.forget_finished();
            s.deadlines.push(Reverse((until, id)));
            id
        };
        self.shared.work.notify_one();
        let weak = Arc::downgrade(&self.shared);
        let wake: Wake = Box::new(move |told| wake_up(&weak, id, told));
        let watching = match watch(wake) {
            Ok(w) => w,
            Err(wake) => return fallback(wake),
        };
        let mut s = lock(&self.shared.state);
        match s.pending.get_mut(&id) {
            Some(p) => p.0 = Some(watching),
            None => {
                // Finished already (woken at once): its watch goes now, outside the lock.
                drop(s);
                drop(watching);
            }
        }
        Ok(())
    }

    /// How many waits are not finished.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        lock(&self.shared.state).pending.len()
    }

    /// Starts the waiting threads, once (a mount that started only some waits with those).
    fn start_threads(&self) -> io::Result<()> {
        let mut failed = Ok(());
        self.started.get_or_init(|| {
            for i in 0..THREADS {
                let shared = self.shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("name-wait-{i}"))
                    .stack_size(STACK)
                    .spawn(move || serve(&shared));
                match spawned {
                    Ok(_) => failed = Ok(()),
                    Err(e) if i == 0 => failed = Err(e),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start a thread that finishes waits")
                    }
                }
            }
        });
        failed
    }
}

impl Drop for Waits {
    fn drop(&mut self) {
        lock(&self.shared.state).stopping = true;
        self.shared.work.notify_all();
    }
}

/// Wait `id` was woken (its name published, or an error): a thread finishes it.
fn wake_up(shared: &Weak<Shared>, id: u64, told: io::Result<Name>) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    lock(&shared.state).woken.push_back((id, told));
    shared.work.notify_one();
}

/// A waiting thread: finishes each wait woken or past its deadline, until the mount is gone.
fn serve(shared: &Shared) {
    let mut s = lock(&shared.state);
    loop {
        if s.stopping {
            return;
        }
        match s.next(Instant::now()) {
            Ok(((watching, finish), told)) => {
                drop(s);
                drop(watching);
                finish(told);
                s = lock(&shared.state);
            }
            Err(Some(left)) => {
                s = shared
                    .work
                    .wait_timeout(s, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            Err(None) => s = shared.work.wait(s).unwrap_or_else(|e| e.into_inner()),
        }
    }
}

/// A namespace that cannot watch: a thread waits in its `get` and wakes the wait (a name
/// still absent at the deadline is left to the deadline's last look).
pub(super) fn wait_on_a_thread(
    names: Arc<dyn Namespace>,
    dir: String,
    name: String,
    until: Instant,
    wake: Wake,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("name-wait".into())
        .stack_size(STACK)
        .spawn(move || {
            let left = until.saturating_duration_since(Instant::now());
            match names.get(&dir, &name, left) {
                Ok(Some(n)) => wake(Ok(n)),
                Ok(None) => {}
                Err(e) => wake(Err(e)),
            }
        })
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn name(o: &str) -> Name {
        Name {
            object: o.into(),
            ..Name::default()
        }
    }

    #[test]
    fn waits_finish_when_woken_or_at_their_deadline_on_few_threads() {
        let waits = Waits::default();
        let (tx, rx) = mpsc::channel();
        let wakers = Arc::new(Mutex::new(Vec::new()));
        let soon = Instant::now() + Duration::from_millis(300);
        for i in 0..1000 {
            let (tx, wakers) = (tx.clone(), wakers.clone());
            let watch = move |wake: Wake| {
                lock(&wakers).push(wake);
                Ok(Box::new(()) as Watch)
            };
            let finish: Finish = Box::new(move |told| {
                let told = told.map(|t| t.unwrap().object);
                tx.send((i, told)).unwrap();
            });
            let until = if i % 2 == 0 {
                soon
            } else {
                soon + Duration::from_secs(60)
            };
            waits
                .start(until, watch, |_| unreachable!(), finish)
                .unwrap();
        }
        assert_eq!(waits.waiting(), 1000);
        // The odd ones are published; the even ones wait for their deadline.
        for (i, wake) in lock(&wakers).drain(..).enumerate() {
            if i % 2 == 1 {
                wake(Ok(name(&i.to_string())));
            }
        }
        let mut got: Vec<_> = (0..1000).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        for (i, told) in got {
            let want = (i % 2 == 1).then(|| i.to_string());
            assert_eq!(told, want, "wait {i}");
        }
        assert_eq!(waits.waiting(), 0);
    }

    #[test]
    fn a_wait_woken_at_once_finishes_and_its_watch_is_dropped() {
        let waits = Waits::default();
        let (tx, rx) = mpsc::channel();
        let watch_dropped = Arc::new(());
        let held = watch_dropped.clone();
        let watch = move |wake: Wake| {
            wake(Ok(name("now")));
            Ok(Box::new(held) as Watch)
        };
        let later = Instant::now() + Duration::from_secs(60);
        let finish: Finish = Box::new(move |told| tx.send(told.is_some()).unwrap());
        waits
            .start(later, watch, |_| unreachable!(), finish)
            .unwrap();
        assert!(rx.recv().unwrap());
        wait_until(|| Arc::strong_count(&watch_dropped) == 1);
    }

    fn wait_until(mut cond: impl FnMut() -> bool) {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
