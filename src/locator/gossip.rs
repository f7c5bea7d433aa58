//! Who is alive: SWIM membership with failure detection (the `foca` crate) over UDP on the
//! control port's address. The peers file (or the rendezvous) still says who the members are;
//! gossip only says which of them are up. A member that stops answering probes (frozen, dead,
//! cut off) is suspected, then declared down by the whole cluster within about
//! [`GossipConfig::detect_within`]; a member that comes back (a restart, or a frozen process
//! resumed) rejoins with a newer incarnation and is up again.
//!
//! Every datagram carries an HMAC-SHA256 tag under the job secret (domain
//! `dyadfs-gossip-v3`) over a header and foca's payload: one without a valid tag is dropped
//! unread, so a process without the secret can neither declare a node down nor keep a dead one
//! alive. The header binds a datagram to its sender, its receiver and its moment: the sender's
//! id, which must match the address it came from, the receiver's id, which must be the node
//! that reads it (so a datagram one member sent another cannot be fed to a third), and a stamp (the sender's clock in microseconds, strictly
//! increasing per sender), which must be newer than the last one taken from that sender and
//! within [`FRESH`] of the receiver's clock. So a recorded datagram replayed later, from
//! anywhere, is dropped: foca's probe numbers (a `u8`) alone let a replay of old acks keep a
//! frozen node alive.
//!
//! foca was chosen over chitchat because it is the protocol alone (no I/O, no runtime, no
//! key-value state to carry), so it runs on a plain thread beside the tokio runtime and its
//! datagrams are ours to authenticate; chitchat brings its own UDP transport and async runtime
//! and gossips a key-value store this cluster does not need.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use foca::{AccumulatingRuntime, Config, Foca, OwnedNotification, PostcardCodec, Timer};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};

use crate::core::NodeId;
use crate::transport::auth::{self, Secret};

/// The tag domain of gossip datagrams.
const DOMAIN: &[u8] = b"dyadfs-gossip-v3";
const TAG: usize = 32;
/// The header before foca's payload: the sender's id (u32), the receiver's (u32) and the stamp
/// (u64), little-endian.
const HEADER: usize = 16;
/// How far a datagram's stamp may be from the receiver's clock (the nodes of a job keep
/// theirs within milliseconds by NTP; a replay after this long is dropped even by a receiver
/// that never saw the original, e.g. one restarted since).
pub const FRESH: Duration = Duration::from_secs(10);

/// Microseconds since the Unix epoch.
fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A member as gossip knows it: its id, where it listens, and which start of it this is (a
/// restarted daemon's higher incarnation wins over the one the cluster declared down).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Peer {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub incarnation: u64,
}

impl foca::Identity for Peer {
    type Addr = NodeId;

    fn renew(&self) -> Option<Self> {
        Some(Peer {
            incarnation: self.incarnation + 1,
            ..self.clone()
        })
    }

    fn addr(&self) -> NodeId {
        self.id
    }

    fn win_addr_conflict(&self, other: &Self) -> bool {
        self.incarnation > other.incarnation
    }
}

/// What this node knows of the others' liveness: the members heard from (up) and those the
/// cluster declared down. A member never heard of is neither while this node starts; one still
/// silent [`GossipConfig::detect_within`] (and a probe) after this node started is down, as
/// if it had died then (a straggler or a failed launch must not hold the directories it is
/// home of): when it does start, it joins and is up.
#[derive(Debug, Default)]
pub struct Liveness {
    /// (up, down)
    sets: RwLock<(HashSet<NodeId>, HashSet<NodeId>)>,
    /// How many changes the sets have seen: what moved may have moved directories' homes.
    changes: std::sync::atomic::AtomicU64,
}

impl Liveness {
    pub fn is_down(&self, node: NodeId) -> bool {
        self.sets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .contains(&node)
    }

    pub fn is_up(&self, node: NodeId) -> bool {
        self.sets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .contains(&node)
    }

    pub fn down_count(&self) -> usize {
        self.sets.read().unwrap_or_else(|e| e.into_inner()).1.len()
    }

    /// Records a member's state; `true` if it changed.
    pub fn set(&self, node: NodeId, down: bool) -> bool {
        let mut sets = self.sets.write().unwrap_or_else(|e| e.into_inner());
        let (up, gone) = &mut *sets;
        let changed = if down {
            up.remove(&node);
            gone.insert(node)
        } else {
            gone.remove(&node);
            up.insert(node)
        };
        if changed {
            self.changes
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        changed
    }

    /// A number that moves with every change of a member's state.
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Acquire)
    }
}

pub struct GossipConfig {
    pub me: Peer,
    /// Every member, this node included.
    pub members: Vec<(NodeId, SocketAddr)>,
    /// The job secret datagrams are tagged with (`None`: `--insecure`, untagged).
    pub secret: Option<Arc<Secret>>,
    /// How long a silent member may stay suspect before it is declared down. A member is
    /// probed every `detect_within / 4`, so detection takes about this long plus a probe.
    pub detect_within: Duration,
}

/// A change of a member's state, as gossip tells it.
pub type OnChange = Box<dyn Fn(NodeId, bool) + Send>;

/// Starts gossip on its own thread; `liveness` follows the cluster's view, and `on_change`
/// is told each member that goes down (`true`) or comes back after being down (`false`).
pub fn start(cfg: GossipConfig, liveness: Arc<Liveness>, on_change: OnChange) -> io::Result<()> {
    let socket = UdpSocket::bind(cfg.me.addr)?;
    let seed = u64::from_le_bytes(auth::random_bytes(8)?.try_into().expect("8 random bytes"));
    std::thread::Builder::new()
        .name("gossip".into())
        .spawn(move || Agent::new(cfg, socket, seed, liveness, on_change).run())?;
    Ok(())
}

/// foca's configuration for a cluster of `n` members that must notice a failure within `d`.
fn foca_config(n: usize, d: Duration) -> Config {
    let mut c = Config::new_lan(NonZeroU32::new(n.max(1) as u32).expect("at least one"));
    c.probe_period = (d / 4).max(Duration::from_millis(100));
    c.probe_rtt = (c.probe_period / 2).max(Duration::from_millis(50));
    c.suspect_to_down_after = d;
    // A member that rejoins is tried again soon, not after a minute.
    if let Some(p) = c.periodic_announce_to_down_members.as_mut() {
        p.frequency = d.max(Duration::from_secs(1));
    }
    c
}

struct Agent {
    foca: Foca<Peer, PostcardCodec, SmallRng, foca::NoCustomBroadcast>,
    runtime: AccumulatingRuntime<Peer>,
    socket: UdpSocket,
    secret: Option<Arc<Secret>>,
    me: NodeId,
    /// Where each member sends from (its gossip address).
    addrs: HashMap<NodeId, SocketAddr>,
    /// The last stamp this node sent, and the newest taken from each sender.
    stamp: u64,
    heard: HashMap<NodeId, u64>,
    /// Datagrams dropped as replayed, stale or misaddressed.
    pub stale: u64,
    /// When members never heard from count as down (once: `None` after).
    unjoined_after: Option<Instant>,
    /// What this agent sent (tests record a node's datagrams to replay them).
    #[cfg(test)]
    sent: Vec<(SocketAddr, Vec<u8>)>,
    /// Timers by deadline (the sequence number keeps equal deadlines in order).
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    pending: HashMap<u64, Timer<Peer>>,
    seq: u64,
    liveness: Arc<Liveness>,
    on_change: OnChange,
}

impl Agent {
    fn new(
        cfg: GossipConfig,
        socket: UdpSocket,
        seed: u64,
        liveness: Arc<Liveness>,
        on_change: OnChange,
    ) -> Agent {
        let config = foca_config(cfg.members.len(), cfg.detect_within);
        let unjoined_after = Instant::now() + cfg.detect_within + config.probe_period;
        let me = cfg.me.clone();
        let mut agent = Agent {
            foca: Foca::new(
                me.clone(),
                config,
                SmallRng::seed_from_u64(seed),
                PostcardCodec,
            ),
            runtime: AccumulatingRuntime::new(),
            socket,
            secret: cfg.secret,
            me: me.id,
            addrs: cfg.members.iter().copied().collect(),
            stamp: 0,
            heard: HashMap::new(),
            stale: 0,
            unjoined_after: Some(unjoined_after),
            #[cfg(test)]
            sent: Vec::new(),
            timers: BinaryHeap::new(),
            pending: HashMap::new(),
            seq: 0,
            liveness,
            on_change,
        };
        // Everyone in the peers file is told this node is here (whatever start of them it is:
        // the answer carries their current identity).
        for (id, addr) in cfg.members {
            if id != me.id {
                let them = Peer {
                    id,
                    addr,
                    incarnation: 0,
                };
                if let Err(e) = agent.foca.announce(them, &mut agent.runtime) {
                    tracing::debug!(error = %e, "gossip announce failed");
                }
            }
        }
        agent
    }

    fn run(mut self) {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            self.drain();
            let now = Instant::now();
            let wait = self
                .timers
                .peek()
                .map_or(Duration::from_secs(1), |Reverse((at, _))| {
                    at.saturating_duration_since(now)
                })
                .clamp(Duration::from_millis(1), Duration::from_secs(1));
            let _ = self.socket.set_read_timeout(Some(wait));
            match self.socket.recv_from(&mut buf) {
                Ok((n, from)) => self.receive(&buf[..n], from),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "gossip socket");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            self.fire_timers();
        }
    }

    /// Hands foca the timers that are due.
    fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(&Reverse((at, seq))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            if let Some(t) = self.pending.remove(&seq)
                && let Err(e) = self.foca.handle_timer(t, &mut self.runtime)
            {
                tracing::debug!(error = %e, "gossip timer");
            }
        }
    }

    /// Hands a datagram that checks out to foca.
    fn receive(&mut self, datagram: &[u8], from: SocketAddr) {
        match self.verified(datagram, from) {
            Some(payload) => {
                if let Err(e) = self.foca.handle_data(payload, &mut self.runtime) {
                    tracing::debug!(error = %e, "gossip datagram refused");
                }
            }
            None => self.stale += 1,
        }
    }

    /// The payload of a datagram whose tag checks out (untagged with `--insecure`), from the
    /// member it names, at its address, newer than anything taken from it and fresh.
    fn verified<'a>(&mut self, datagram: &'a [u8], from: SocketAddr) -> Option<&'a [u8]> {
        let signed = match &self.secret {
            Some(key) => {
                let split = datagram.len().checked_sub(TAG)?;
                let (signed, tag) = datagram.split_at(split);
                auth::tag_ok(key, DOMAIN, signed, tag).then_some(signed)?
            }
            None => datagram,
        };
        if signed.len() < HEADER {
            return None;
        }
        let (header, payload) = signed.split_at(HEADER);
        let sender = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
        let receiver = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let stamp = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
        if sender == self.me || receiver != self.me || self.addrs.get(&sender) != Some(&from) {
            return None;
        }
        let fresh = FRESH.as_micros() as u64;
        if now_micros().abs_diff(stamp) > fresh
            || self.heard.get(&sender).is_some_and(|last| stamp <= *last)
        {
            return None;
        }
        self.heard.insert(sender, stamp);
        Some(payload)
    }

    /// `data` for member `to` as a datagram: the header, the payload, and the tag over both.
    fn seal(&mut self, to: NodeId, data: &[u8]) -> Vec<u8> {
        self.stamp = now_micros().max(self.stamp + 1);
        let mut datagram = Vec::with_capacity(HEADER + data.len() + TAG);
        datagram.extend_from_slice(&self.me.to_le_bytes());
        datagram.extend_from_slice(&to.to_le_bytes());
        datagram.extend_from_slice(&self.stamp.to_le_bytes());
        datagram.extend_from_slice(data);
        if let Some(key) = &self.secret {
            let tag = auth::tag(key, DOMAIN, &datagram);
            datagram.extend_from_slice(&tag);
        }
        datagram
    }

    /// Declares down, once, the members never heard from by [`Agent::unjoined_after`].
    fn unjoined(&mut self) {
        if self.unjoined_after.is_none_or(|at| Instant::now() < at) {
            return;
        }
        self.unjoined_after = None;
        let silent: Vec<NodeId> = self
            .addrs
            .keys()
            .copied()
            .filter(|&n| n != self.me && !self.heard.contains_key(&n) && !self.liveness.is_up(n))
            .collect();
        for node in silent {
            if self.liveness.set(node, true) {
                tracing::warn!(node, "a member never started (never heard from): down");
                (self.on_change)(node, true);
            }
        }
    }

    /// Sends what foca wants sent, schedules its timers, and applies its news.
    fn drain(&mut self) {
        self.unjoined();
        while let Some((to, data)) = self.runtime.to_send() {
            let datagram = self.seal(to.id, &data);
            let _ = self.socket.send_to(&datagram, to.addr);
            #[cfg(test)]
            self.sent.push((to.addr, datagram));
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            self.seq += 1;
            self.timers
                .push(Reverse((Instant::now() + after, self.seq)));
            self.pending.insert(self.seq, timer);
        }
        while let Some(n) = self.runtime.to_notify() {
            let (node, down) = match n {
                OwnedNotification::MemberUp(p) => (p.id, false),
                OwnedNotification::MemberDown(p) => (p.id, true),
                OwnedNotification::Rename(_, p) if self.liveness.is_down(p.id) => {
                    // A newer start of a member declared down: it is back only once it is up.
                    tracing::info!(node = p.id, "a member restarted");
                    continue;
                }
                _ => continue,
            };
            let was_down = self.liveness.is_down(node);
            if self.liveness.set(node, down) {
                tracing::info!(node, down, "member state changed");
                // A member first heard from is no news to the locator (it says Rejoined itself).
                if down || was_down {
                    (self.on_change)(node, down);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn free_addr() -> SocketAddr {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    }

    /// `n` members on free loopback addresses, tagged with one job secret, and how fast they
    /// detect a silent one.
    struct TestMembers {
        addrs: Vec<SocketAddr>,
        key: Arc<Secret>,
        detect_within: Duration,
    }

    impl TestMembers {
        fn new(n: usize, detect_ms: u64) -> TestMembers {
            TestMembers {
                addrs: (0..n).map(|_| free_addr()).collect(),
                key: Arc::new(Secret::new(vec![7; 32]).unwrap()),
                detect_within: Duration::from_millis(detect_ms),
            }
        }

        /// Member `i`'s configuration, as start `incarnation`.
        fn cfg(&self, i: usize, incarnation: u64) -> GossipConfig {
            GossipConfig {
                me: Peer {
                    id: i as u32,
                    addr: self.addrs[i],
                    incarnation,
                },
                members: self
                    .addrs
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (i as u32, *a))
                    .collect(),
                secret: Some(self.key.clone()),
                detect_within: self.detect_within,
            }
        }
    }

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn tags_are_checked_and_bound_to_their_domain() {
        let key = Secret::new(vec![7; 32]).unwrap();
        let t = auth::tag(&key, DOMAIN, b"payload");
        assert!(auth::tag_ok(&key, DOMAIN, b"payload", &t));
        assert!(!auth::tag_ok(&key, DOMAIN, b"payloae", &t));
        assert!(!auth::tag_ok(&key, b"another-use", b"payload", &t));
        let other = Secret::new(vec![8; 32]).unwrap();
        assert!(!auth::tag_ok(&other, DOMAIN, b"payload", &t));
    }

    /// Two agents with the job secret see each other; a third without it is never heard, and
    /// a member never heard from is down once the start's grace is over.
    #[test]
    fn only_holders_of_the_secret_are_heard() {
        let m = TestMembers::new(4, 800);
        let stranger = Arc::new(Secret::new(vec![9; 32]).unwrap());
        let views: Vec<Arc<Liveness>> = (0..4).map(|_| Arc::default()).collect();
        // Node 3 never runs (its address is bound, unread).
        let _silent = UdpSocket::bind(m.addrs[3]).unwrap();
        for (i, key) in [(0, &m.key), (1, &m.key), (2, &stranger)] {
            let cfg = GossipConfig {
                secret: Some(key.clone()),
                ..m.cfg(i, 1)
            };
            start(cfg, views[i].clone(), Box::new(|_, _| {})).unwrap();
        }
        wait_for("nodes 0 and 1 see each other", || {
            views[0].is_up(1) && views[1].is_up(0)
        });
        std::thread::sleep(Duration::from_secs(2));
        for v in &views[..2] {
            // Never heard: down once the start's grace is over, as a member that died.
            assert!(!v.is_up(2) && v.is_down(2), "the stranger was heard");
            assert!(!v.is_up(3) && v.is_down(3), "a silent member is not down");
        }
        assert!(
            !views[2].is_up(0) && !views[2].is_up(1),
            "the stranger heard the others"
        );
    }

    #[test]
    fn a_member_that_stops_is_down_everywhere_and_back_when_it_restarts() {
        let m = TestMembers::new(3, 800);
        let views: Vec<Arc<Liveness>> = (0..3).map(|_| Arc::default()).collect();
        let cfg = |i: usize, incarnation| m.cfg(i, incarnation);
        let addrs = &m.addrs;
        for (i, view) in views.iter().enumerate().take(2) {
            start(cfg(i, 1), view.clone(), Box::new(|_, _| {})).unwrap();
        }
        // Node 2 runs in a thread we can stop: its agent is driven by hand below.
        let socket = UdpSocket::bind(addrs[2]).unwrap();
        let mut agent = Agent::new(cfg(2, 1), socket, 3, views[2].clone(), Box::new(|_, _| {}));
        drive(&mut agent, Duration::from_secs(2));
        assert!(!views[0].is_down(2), "node 2 was up");
        // Node 2 freezes (its socket stays bound, unread).
        let frozen_at = Instant::now();
        wait_for("node 0 declares node 2 down", || views[0].is_down(2));
        wait_for("node 1 declares node 2 down", || views[1].is_down(2));
        let detected = frozen_at.elapsed();
        assert!(detected < Duration::from_secs(6), "took {detected:?}");
        // It restarts (a new incarnation on the same address): up again everywhere.
        drop(agent);
        start(cfg(2, 2), views[2].clone(), Box::new(|_, _| {})).unwrap();
        wait_for("node 0 sees node 2 back", || !views[0].is_down(2));
        wait_for("node 1 sees node 2 back", || !views[1].is_down(2));
    }

    /// Runs a hand-driven agent for `d`: what `Agent::run` does, on the test's thread.
    fn drive(agent: &mut Agent, d: Duration) {
        let stop = Instant::now() + d;
        let mut buf = vec![0u8; 64 << 10];
        while Instant::now() < stop {
            agent.drain();
            let _ = agent
                .socket
                .set_read_timeout(Some(Duration::from_millis(10)));
            if let Ok((n, from)) = agent.socket.recv_from(&mut buf) {
                agent.receive(&buf[..n], from);
            }
            agent.fire_timers();
        }
    }

    /// Everything a member sent while up, replayed from its own address while it is frozen
    /// (the strongest replay: the address binding cannot tell), does not keep it alive: it is
    /// declared down on the usual schedule. Before the header, node 0 never declared it down
    /// while the replay ran.
    #[test]
    fn replayed_datagrams_do_not_keep_a_frozen_member_alive() {
        let m = TestMembers::new(2, 400);
        let (addrs, cfg) = (&m.addrs, |i: usize| m.cfg(i, 1));
        let view0: Arc<Liveness> = Arc::default();
        start(cfg(0), view0.clone(), Box::new(|_, _| {})).unwrap();
        let socket = UdpSocket::bind(addrs[1]).unwrap();
        let mut b = Agent::new(cfg(1), socket, 5, Arc::default(), Box::new(|_, _| {}));
        drive(&mut b, Duration::from_secs(RECORD_SECS));
        assert!(view0.is_up(1) && !view0.is_down(1), "node 1 was up");
        let recorded: Vec<Vec<u8>> = b
            .sent
            .iter()
            .filter(|(to, _)| *to == addrs[0])
            .map(|(_, d)| d.clone())
            .collect();
        assert!(recorded.len() > 20, "{} datagrams", recorded.len());
        // Frozen: it answers nothing, and its recorded datagrams are replayed in a loop.
        let frozen_at = Instant::now();
        let mut replayed = 0usize;
        while !view0.is_down(1) {
            assert!(
                frozen_at.elapsed() < Duration::from_secs(8),
                "node 1 still not down after {replayed} replayed datagrams"
            );
            for d in &recorded {
                let _ = b.socket.send_to(d, addrs[0]);
                replayed += 1;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(replayed > 0);
        // And a hand-driven receiver counts them as stale instead of taking them.
        let mut a2 = Agent::new(
            cfg(0),
            UdpSocket::bind(free_addr()).unwrap(),
            6,
            Arc::default(),
            Box::new(|_, _| {}),
        );
        for d in &recorded {
            a2.receive(d, addrs[1]);
            a2.receive(d, addrs[1]);
        }
        assert!(a2.stale >= recorded.len() as u64, "{} stale", a2.stale);
    }

    /// A datagram one member sealed for another is refused by a third, even from the sender's
    /// own address (issue 68: the header bound the sender but not the receiver, so a spoofer
    /// could feed B->C datagrams to A); the same payload sealed for that third is taken.
    #[test]
    fn a_datagram_for_another_member_is_refused() {
        let m = TestMembers::new(3, 400);
        let cfg = |i: usize| m.cfg(i, 1);
        let hand = |i: usize, seed| {
            let socket = UdpSocket::bind(free_addr()).unwrap();
            Agent::new(cfg(i), socket, seed, Arc::default(), Box::new(|_, _| {}))
        };
        let (mut a, mut b) = (hand(0, 7), hand(1, 8));
        let for_c = b.seal(2, b"payload");
        a.receive(&for_c, m.addrs[1]);
        assert_eq!(a.stale, 1, "taken though sealed for node 2");
        let for_a = b.seal(0, b"payload");
        assert!(a.verified(&for_a, m.addrs[1]).is_some());
    }

    /// How long the replayed member is recorded while up.
    const RECORD_SECS: u64 = 30;

    /// A member that never starts is down one detection time after this node started (before,
    /// it stayed unknown forever, holding its directories); when it starts late it joins and
    /// is up again, and the locator is told both.
    #[test]
    fn a_member_that_never_started_is_down_and_up_once_it_starts() {
        let m = TestMembers::new(2, 600);
        let cfg = |i: usize| m.cfg(i, 1);
        let view: Arc<Liveness> = Arc::default();
        let told = Arc::new(Mutex::new(Vec::new()));
        let t = told.clone();
        let started = Instant::now();
        start(
            cfg(0),
            view.clone(),
            Box::new(move |n, down| t.lock().unwrap().push((n, down))),
        )
        .unwrap();
        wait_for("node 1 down", || view.is_down(1));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        start(cfg(1), Arc::default(), Box::new(|_, _| {})).unwrap();
        wait_for("node 1 up", || view.is_up(1));
        assert_eq!(*told.lock().unwrap(), vec![(1, true), (1, false)]);
    }
}
