//! Holder hints: when a node keeps asking where files are and keeps hearing "another node has
//! it" (a later epoch, each node reading a shard another node filled), it reads the global
//! homes' feeds of copies gained (the feed replication reads) into its node tier, so the rest
//! of its reads find their holders there instead of costing a locate round trip each (and the
//! home's answer). Every rack's holders are taken (see the service's `read_hints`): a file
//! held only in another rack costs no locate either (it cost two round trips, the rack home
//! asking the global home), and a holder in the node's own rack is preferred where one is
//! known. A hint is an answer like any other in the node tier: it expires with
//! it, and a holder that no longer has the file is dropped at its failed pull and the file
//! located again. Here only the decision of when to read, and from where; the service does the
//! reading.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::membership::NodeId;
use crate::core::sync::lock;

/// Answers naming holders that the rack tier gave since the last read which start a read: a
/// few, so a node that reads a handful of files elsewhere never reads the feeds, and one whose
/// reads are mostly elsewhere reads them soon.
pub const READ_AFTER: u32 = 16;
/// Most copies one read looks at in the feeds (all homes together): a bound on the node tier's
/// growth and on a read's cost for a dataset far larger than this node reads.
pub const MOST_PER_READ: usize = 1 << 18;
/// Copies asked of a home per call.
pub const PAGE: u32 = 4096;
/// Past a read that taught nothing (the feeds hold nothing new), the next waits for twice as
/// many answers, up to this many.
pub const READ_AFTER_MOST: u32 = 1 << 14;

struct State {
    /// Rack-tier answers naming holders since the last read.
    answered: u32,
    /// How many of them start the next read ([`READ_AFTER`], doubled by fruitless reads).
    needed: u32,
    /// A read is under way.
    reading: bool,
    /// Per global home, the feed position to read from next.
    next: HashMap<NodeId, u64>,
    /// When the feeds were last read from their start.
    from_start_at: Option<Instant>,
}

/// When this node reads the feeds, and where in each it is.
pub struct Hints {
    state: Mutex<State>,
    /// How long a hint is kept (the node tier's answer lifetime): the feeds are read from the
    /// start again once the hints of the last such read may have expired.
    kept: Duration,
}

impl Hints {
    pub fn new(kept: Duration) -> Hints {
        Hints {
            state: Mutex::new(State {
                answered: 0,
                needed: READ_AFTER,
                reading: false,
                next: HashMap::new(),
                from_start_at: None,
            }),
            kept,
        }
    }

    /// The rack tier answered a locate with holders. `Some(from_start)` when this node should
    /// read the feeds now (from their start, or on from where it left off); the caller then
    /// reads and calls [`Hints::done`].
    pub fn answered(&self, now: Instant) -> Option<bool> {
        let mut s = lock(&self.state);
        if s.reading {
            // What this answer named, the read under way brings (or found nothing to bring).
            return None;
        }
        s.answered += 1;
        if s.answered < s.needed {
            return None;
        }
        s.reading = true;
        s.answered = 0;
        // Earlier hints may be gone: the node tier keeps each for `kept` after it was learned.
        let from_start = s
            .from_start_at
            .is_none_or(|at| now.duration_since(at) >= self.kept * 2 / 3);
        if from_start {
            s.from_start_at = Some(now);
            s.next.clear();
        }
        Some(from_start)
    }

    /// Where to read `home`'s feed from.
    pub fn position(&self, home: NodeId) -> u64 {
        lock(&self.state).next.get(&home).copied().unwrap_or(0)
    }

    /// `home`'s feed was read up to `next`.
    pub fn advanced(&self, home: NodeId, next: u64) {
        lock(&self.state).next.insert(home, next);
    }

    /// The read ended (however far it got), having taught the node tier `learned` holders.
    pub fn done(&self, learned: usize) {
        let mut s = lock(&self.state);
        s.reading = false;
        s.needed = match learned {
            0 => (s.needed * 2).min(READ_AFTER_MOST),
            _ => READ_AFTER,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_starts_after_enough_answers_and_rereads_once_hints_may_be_gone() {
        let h = Hints::new(Duration::from_secs(30));
        let t0 = Instant::now();
        for _ in 1..READ_AFTER {
            assert_eq!(h.answered(t0), None);
        }
        assert_eq!(
            h.answered(t0),
            Some(true),
            "the first read is from the start"
        );
        for _ in 0..READ_AFTER * 2 {
            assert_eq!(h.answered(t0), None, "one read at a time");
        }
        h.advanced(3, 700);
        assert_eq!(h.position(3), 700);
        assert_eq!(h.position(4), 0);
        h.done(5);
        // Answers during the read do not count towards the next one.
        let t1 = t0 + Duration::from_secs(5);
        for _ in 1..READ_AFTER {
            assert_eq!(h.answered(t1), None);
        }
        assert_eq!(h.answered(t1), Some(false), "on from where it left off");
        assert_eq!(h.position(3), 700);
        h.done(5);
        let t2 = t0 + Duration::from_secs(21);
        for _ in 1..READ_AFTER {
            assert_eq!(h.answered(t2), None);
        }
        assert_eq!(
            h.answered(t2),
            Some(true),
            "the first hints may have expired"
        );
        assert_eq!(h.position(3), 0);
    }

    #[test]
    fn a_read_that_teaches_nothing_makes_the_next_wait_longer() {
        let h = Hints::new(Duration::from_secs(30));
        let t0 = Instant::now();
        let reads_after =
            |n: u32| (1..n).all(|_| h.answered(t0).is_none()) && h.answered(t0).is_some();
        assert!(reads_after(READ_AFTER));
        h.done(0);
        assert!(
            reads_after(2 * READ_AFTER),
            "twice as many after a fruitless read"
        );
        h.done(0);
        assert!(reads_after(4 * READ_AFTER));
        h.done(1);
        assert!(
            reads_after(READ_AFTER),
            "back to the first count after a useful one"
        );
        for _ in 0..20 {
            h.done(0);
            while h.answered(t0).is_none() {}
        }
        h.done(0);
        assert!(reads_after(READ_AFTER_MOST), "bounded");
    }
}
