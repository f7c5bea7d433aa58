//! `--max-staged-per-user`: the bytes of produced files one uid holds on this node's cache disk
//! that nothing may evict. The daemon writes them as root, so the disk quota of their writer
//! never sees them; this cap stands in for it. A uid holds the files it is writing (staged:
//! their length, holes included, as [`super::write::Producer::room_for`] counts them) and the
//! files it published here that this node keeps as their only copy. A file is charged to its
//! owner when it was staged (the creating process's uid, or a published file's owner for its
//! new version), and stays so if it is chowned while written.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::Error;
use crate::core::sync::lock;
use crate::stats::Stats;

/// What each uid holds, and the cap.
pub struct Quota {
    /// `None`: no cap (bytes are still counted, so a cap could be reported on).
    cap: Option<u64>,
    held: Mutex<HashMap<u32, u64>>,
    stats: Arc<Stats>,
}

/// The bytes one staged file holds against its uid, given back when it is dropped (its
/// staging file is removed then, or was moved into the cache by its seal).
pub struct Charge {
    quota: Arc<Quota>,
    uid: u32,
    bytes: AtomicU64,
}

impl Quota {
    pub fn new(cap: Option<u64>, stats: Arc<Stats>) -> Arc<Quota> {
        Arc::new(Quota {
            cap,
            held: Mutex::default(),
            stats,
        })
    }

    /// A charge of nothing yet against `uid`.
    pub fn charge(self: &Arc<Self>, uid: u32) -> Charge {
        Charge {
            quota: self.clone(),
            uid,
            bytes: AtomicU64::new(0),
        }
    }

    /// What `uid` holds now.
    pub fn held(&self, uid: u32) -> u64 {
        lock(&self.held).get(&uid).copied().unwrap_or(0)
    }

    /// Adds `bytes` a kept file holds to `uid`'s, unchecked: the file exists already.
    pub fn add(&self, uid: u32, bytes: u64) {
        *lock(&self.held).entry(uid).or_default() += bytes;
    }

    /// Gives back `bytes` of `uid`'s.
    pub fn sub(&self, uid: u32, bytes: u64) {
        let mut held = lock(&self.held);
        if let Some(h) = held.get_mut(&uid) {
            *h = h.saturating_sub(bytes);
            if *h == 0 {
                held.remove(&uid);
            }
        }
    }
}

impl Charge {
    /// Makes the file hold `size` bytes (`grow`: at least what it holds already, as a write
    /// that ends before its end does not shrink it). Refused with EDQUOT if that would take
    /// its uid past the cap; root is not capped, as disk quotas do not bind root. Shrinking is
    /// never refused.
    pub fn resize(&self, size: u64, grow: bool) -> Result<(), Error> {
        let q = &self.quota;
        let mut held = lock(&q.held);
        let had = self.bytes.load(Ordering::Relaxed);
        let size = if grow { size.max(had) } else { size };
        let total = held.get(&self.uid).copied().unwrap_or(0);
        let wanted = total - had.min(total) + size;
        if let Some(cap) = q.cap
            && size > had
            && wanted > cap
            && self.uid != 0
        {
            drop(held);
            q.stats.quota_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(Error::OverQuota {
                uid: self.uid,
                wanted,
                cap,
            });
        }
        if wanted == 0 {
            held.remove(&self.uid);
        } else {
            held.insert(self.uid, wanted);
        }
        self.bytes.store(size, Ordering::Relaxed);
        Ok(())
    }

    /// Gives its bytes back (the file became a kept object, charged on its own).
    pub fn release(&self) {
        let mut held = lock(&self.quota.held);
        let bytes = self.bytes.swap(0, Ordering::Relaxed);
        if let Some(h) = held.get_mut(&self.uid) {
            *h = h.saturating_sub(bytes);
            if *h == 0 {
                held.remove(&self.uid);
            }
        }
    }

    pub fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(cap: u64) -> Arc<Quota> {
        Quota::new(Some(cap), Arc::new(Stats::default()))
    }

    #[test]
    fn a_uid_is_refused_past_its_cap_and_others_are_not() {
        let q = quota(100);
        let (a1, a2, b) = (q.charge(1000), q.charge(1000), q.charge(1001));
        a1.resize(60, true).unwrap();
        let e = a2.resize(41, true).unwrap_err();
        assert_eq!(e.errno(), libc::EDQUOT, "{e}");
        // Refused, the file keeps its charge (nothing).
        assert_eq!(q.held(1000), 60);
        a2.resize(40, true).unwrap();
        b.resize(100, true).unwrap();
        assert_eq!(q.stats.quota_refusals.load(Ordering::Relaxed), 1);
        // A write inside a file's length charges nothing more.
        a1.resize(10, true).unwrap();
        assert_eq!(q.held(1000), 100);
        // A truncate gives back; a drop gives back all.
        a1.resize(10, false).unwrap();
        assert_eq!(q.held(1000), 50);
        drop(a2);
        assert_eq!(q.held(1000), 10);
        a1.release();
        assert_eq!(q.held(1000), 0);
        assert!(lock(&q.held).get(&1000).is_none());
    }

    #[test]
    fn kept_bytes_count_and_root_is_not_capped() {
        let q = quota(100);
        q.add(1000, 90);
        let a = q.charge(1000);
        assert_eq!(a.resize(11, true).unwrap_err().errno(), libc::EDQUOT);
        q.sub(1000, 90);
        a.resize(100, true).unwrap();
        let root = q.charge(0);
        root.resize(1 << 40, true).unwrap();
        // A file shrinks whatever the cap.
        q.add(1000, 500);
        a.resize(5, false).unwrap();
        assert_eq!(q.held(1000), 505);
    }
}
