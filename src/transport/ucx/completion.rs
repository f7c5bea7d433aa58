//! A one-shot result handed from UCX's progress thread to the thread that waits for it (a
//! get's slot and status), with a timeout and a clear answer when the worker stopped.

use std::sync::Arc;
use std::time::Duration;

use crate::core::sync::lock;

/// The result of a get, for the thread that waits for it. It sleeps on a condvar at once,
/// where a channel would first spin and yield: on a busy node each yield is a context switch
/// (1.5 per pulled file, `perf record -e sched:sched_switch` of `scripts/bench_small_pull.sh`).
pub struct Completion<T>(Arc<Shared<T>>);

/// The progress thread's end of a [`Completion`]. If the waiter gave up, the result is dropped
/// with the last end (a get's slot then returns to its pool).
pub struct Completer<T>(Arc<Shared<T>>);

type Shared<T> = (std::sync::Mutex<Outcome<T>>, std::sync::Condvar);

enum Outcome<T> {
    Pending,
    Done(T),
    /// The completer went away without a result (the worker stopped).
    Abandoned,
}

pub(super) fn completion<T>() -> (Completer<T>, Completion<T>) {
    let shared = Arc::new((std::sync::Mutex::new(Outcome::Pending), Default::default()));
    (Completer(shared.clone()), Completion(shared))
}

impl<T> Completer<T> {
    pub(super) fn complete(self, value: T) {
        self.settle(Outcome::Done(value));
    }

    fn settle(&self, outcome: Outcome<T>) {
        let (state, ready) = &*self.0;
        let mut state = lock(state);
        if matches!(*state, Outcome::Pending) {
            *state = outcome;
            ready.notify_one();
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        self.settle(Outcome::Abandoned);
    }
}

/// Why a [`Completion`] gave no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoResult {
    /// It did not come within the timeout.
    TimedOut,
    /// It never will: the worker stopped.
    Abandoned,
}

impl<T> Completion<T> {
    /// The result, waiting at most `timeout` for it.
    pub fn wait(self, timeout: Duration) -> Result<T, NoResult> {
        let (state, ready) = &*self.0;
        let guard = lock(state);
        let (mut guard, _) = ready
            .wait_timeout_while(guard, timeout, |s| matches!(s, Outcome::Pending))
            .unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *guard, Outcome::Abandoned) {
            Outcome::Done(v) => Ok(v),
            Outcome::Pending => Err(NoResult::TimedOut),
            Outcome::Abandoned => Err(NoResult::Abandoned),
        }
    }
}
