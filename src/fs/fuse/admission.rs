//! Bounds on the requests that wait on threads of their own: lookups waiting for a produced
//! name (`--wait`), per caller, and threads reading prefetch lists, for the whole mount.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::core::sync::lock;

/// Lookups waiting for names (`--wait`), by caller.
#[derive(Default)]
pub struct Waiters(Mutex<std::collections::HashMap<u32, usize>>);

/// One waiting lookup's place; given back when dropped.
pub struct Waiter(Arc<Waiters>, u32);

impl Waiters {
    /// Waits one user may have at once (a thread each, asleep).
    pub const PER_USER: usize = 1024;

    pub fn take(this: &Arc<Waiters>, uid: u32) -> Option<Waiter> {
        let mut by_user = lock(&this.0);
        let n = by_user.entry(uid).or_default();
        (*n < Self::PER_USER).then(|| {
            *n += 1;
            Waiter(this.clone(), uid)
        })
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut by_user = lock(&self.0.0);
        if let Some(n) = by_user.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                by_user.remove(&self.1);
            }
        }
    }
}

/// Threads reading prefetch lists, at most [`ListReaders::MAX`] at once.
#[derive(Default)]
pub struct ListReaders(AtomicUsize);

/// One list reader's place; given back when dropped.
pub struct ListReader(Arc<ListReaders>);

impl ListReaders {
    const MAX: usize = 4;

    pub fn take(this: &Arc<ListReaders>) -> Option<ListReader> {
        let taken = this
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < Self::MAX).then_some(n + 1)
            });
        taken.is_ok().then(|| ListReader(this.clone()))
    }
}

impl Drop for ListReader {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}
