//! Bounds on the requests whose replies are made later: opens waiting for a produced name
//! (`--wait`, started in `waiting.rs`), per caller and for the whole mount, and threads reading
//! prefetch lists. (Over
//! io_uring each ring queue bounds its own as well, with a share for each user: see
//! `ring::queue::Away`.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::core::sync::lock;

/// Opens waiting for names (`--wait`), by caller: at most `per_user` of one, four times that in
/// all (`--max-waits-per-user`).
pub struct Waiters {
    by_user: Mutex<std::collections::HashMap<u32, usize>>,
    per_user: usize,
}

/// One waiting lookup's place; given back when dropped.
pub struct Waiter(Arc<Waiters>, u32);

impl Waiters {
    pub fn new(per_user: usize) -> Waiters {
        Waiters {
            by_user: Mutex::default(),
            per_user,
        }
    }

    /// Waits all users may have at once (an entry each in `fs::waits`).
    pub fn total(&self) -> usize {
        4 * self.per_user
    }

    pub fn take(this: &Arc<Waiters>, uid: u32) -> Option<Waiter> {
        let mut by_user = lock(&this.by_user);
        if by_user.values().sum::<usize>() >= this.total() {
            return None;
        }
        let n = by_user.entry(uid).or_default();
        (*n < this.per_user).then(|| {
            *n += 1;
            Waiter(this.clone(), uid)
        })
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut by_user = lock(&self.0.by_user);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_bounded_per_user_and_for_the_mount() {
        let w = Arc::new(Waiters::new(100));
        let mine: Vec<_> = (0..100)
            .map(|_| Waiters::take(&w, 7).expect("under the user's bound"))
            .collect();
        assert!(Waiters::take(&w, 7).is_none(), "past the user's bound");
        let users = w.total() / 100;
        let others: Vec<_> = (1..users as u32)
            .flat_map(|u| (0..100).map(move |_| u + 100))
            .map(|u| Waiters::take(&w, u).expect("under both bounds"))
            .collect();
        assert!(Waiters::take(&w, 9).is_none(), "past the mount's bound");
        drop(mine);
        assert!(
            Waiters::take(&w, 9).is_some(),
            "places come back when dropped"
        );
        drop(others);
    }
}
