//! Connections still in their handshake, bounded: at most [`MAX_PENDING`] in all and
//! [`MAX_PENDING_PER_SOURCE`] from one address. A new connection past a bound closes the oldest
//! one still pending (the oldest of its own address when that is the bound it hit), as sshd's
//! MaxStartups does: a flood of strangers that open sockets and stall holds at most the bound's
//! worth of memory, and a member's handshake, which takes a round trip, still gets through
//! unless the flood opens a bound's worth of sockets within that round trip.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::core::sync::lock;

/// Connections in their handshake at once, in all.
pub const MAX_PENDING: usize = 256;
/// Connections in their handshake at once from one address.
pub const MAX_PENDING_PER_SOURCE: usize = 64;

#[derive(Clone, Default)]
pub struct Pending(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    next: u64,
    /// Oldest first.
    order: VecDeque<(u64, IpAddr, Arc<Notify>)>,
    per_source: HashMap<IpAddr, usize>,
    evicted: u64,
}

/// A place among the pending connections; dropping it (handshake done or failed) frees it.
pub struct Ticket {
    pending: Pending,
    id: u64,
    /// Notified when a newer connection took this one's place: the handshake is abandoned.
    pub evicted: Arc<Notify>,
}

impl Pending {
    /// Admits a new connection from `source`, closing the oldest pending one if a bound is hit.
    pub fn admit(&self, source: IpAddr) -> Ticket {
        let mut inner = lock(&self.0);
        let from_source = inner.per_source.get(&source).copied().unwrap_or(0);
        let victim = if from_source >= MAX_PENDING_PER_SOURCE {
            inner.order.iter().position(|(_, ip, _)| *ip == source)
        } else if inner.order.len() >= MAX_PENDING {
            Some(0)
        } else {
            None
        };
        if let Some(i) = victim
            && let Some((_, ip, notify)) = inner.order.remove(i)
        {
            inner.forget(ip);
            inner.evicted += 1;
            notify.notify_one();
        }
        let id = inner.next;
        inner.next += 1;
        let evicted = Arc::new(Notify::new());
        inner.order.push_back((id, source, evicted.clone()));
        *inner.per_source.entry(source).or_default() += 1;
        Ticket {
            pending: self.clone(),
            id,
            evicted,
        }
    }

    /// Connections pending now, and closed so far to make room.
    pub fn counts(&self) -> (usize, u64) {
        let inner = lock(&self.0);
        (inner.order.len(), inner.evicted)
    }
}

impl Inner {
    fn forget(&mut self, ip: IpAddr) {
        if let Some(n) = self.per_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&ip);
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = lock(&self.pending.0);
        if let Some(i) = inner.order.iter().position(|(id, _, _)| *id == self.id)
            && let Some((_, ip, _)) = inner.order.remove(i)
        {
            inner.forget(ip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[tokio::test]
    async fn a_flood_from_one_source_evicts_its_own_oldest_and_no_other() {
        let p = Pending::default();
        let other = p.admit(ip(2));
        let flood: Vec<Ticket> = (0..MAX_PENDING_PER_SOURCE)
            .map(|_| p.admit(ip(1)))
            .collect();
        assert_eq!(p.counts(), (MAX_PENDING_PER_SOURCE + 1, 0));
        let newer = p.admit(ip(1));
        // The flood's oldest was told to go; the other source's connection was not.
        tokio::time::timeout(
            std::time::Duration::from_secs(1),
            flood[0].evicted.notified(),
        )
        .await
        .expect("the oldest of the source is evicted");
        assert_eq!(p.counts(), (MAX_PENDING_PER_SOURCE + 1, 1));
        let quiet = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            other.evicted.notified(),
        )
        .await;
        assert!(quiet.is_err(), "another source's handshake is left alone");
        drop((flood, newer, other));
        assert_eq!(p.counts().0, 0);
        assert!(lock(&p.0).per_source.is_empty());
    }

    #[tokio::test]
    async fn the_total_is_bounded_across_sources() {
        let p = Pending::default();
        let held: Vec<Ticket> = (0..MAX_PENDING)
            .map(|i| p.admit(ip((i % 200) as u8)))
            .collect();
        let _new = p.admit(ip(250));
        assert_eq!(p.counts(), (MAX_PENDING, 1));
        tokio::time::timeout(
            std::time::Duration::from_secs(1),
            held[0].evicted.notified(),
        )
        .await
        .expect("the oldest overall is evicted");
    }
}
