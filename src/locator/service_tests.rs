//! The locator of several members in one process, their messages through the in-process port
//! (`loopback.rs`) with members made dead, frozen or lying: the tiers' lookups, publishes,
//! failover and names, as the multi-process tests check them with SIGKILL and SIGSTOP.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::loopback::{Fault, Net};
use super::membership::{Membership, NodeId};
use super::proto::Msg;
use super::service::{Hooks, LocatorService};
use super::tiers::Reply;
use crate::core::Version;
use crate::core::names::Name;
use crate::core::sync::lock;

/// Two racks of two: nodes 0 and 1 in rack a, 2 and 3 in rack b.
const PEERS: &str = "0 127.0.0.1:1 a\n1 127.0.0.1:2 a\n2 127.0.0.1:3 b\n3 127.0.0.1:4 b\n";

const TIMEOUT: Duration = Duration::from_millis(400);

/// The complete copies a member holds (what its cache would say).
type Held = Arc<Mutex<Vec<(String, Version)>>>;

/// One job: its members' locators and what each holds.
struct Job {
    net: Arc<Net>,
    nodes: Vec<Arc<LocatorService>>,
    held: Vec<Held>,
}

impl Job {
    fn new() -> Job {
        let net = Net::new();
        let mut job = Job {
            net,
            nodes: Vec::new(),
            held: Vec::new(),
        };
        for id in 0..4 {
            job.held.push(Arc::default());
            let s = job.start(id);
            job.nodes.push(s);
        }
        job
    }

    /// A (new) process of member `id`, with empty tables, on the net.
    fn start(&self, id: NodeId) -> Arc<LocatorService> {
        let held = self.held[id as usize].clone();
        let hooks = Hooks {
            holdings: Box::new(move |visit| {
                for (path, version) in lock(&held).iter() {
                    visit(path, *version)
                }
            }),
            ..Hooks::default()
        };
        let m = Membership::parse(PEERS, id).unwrap();
        let s = LocatorService::new(m, TIMEOUT, Default::default(), self.net.port(id), hooks);
        self.net.join(&s);
        s
    }

    fn locate(&self, node: NodeId, path: &str) -> Reply {
        self.nodes[node as usize].locate(self.net.handle(), path, v(), TIMEOUT)
    }

    /// `node` completed a copy of `path`: its cache says so, and it tells its rack home.
    fn gained(&self, node: NodeId, path: &str) -> Vec<bool> {
        lock(&self.held[node as usize]).push((path.to_string(), v()));
        let change = [(path.to_string(), v(), true)];
        self.net
            .block_on(self.nodes[node as usize].publish(&change))
    }

    /// Gossip declared `node` down (or up again) at every other member, and each acted on it.
    fn gossip(&self, node: NodeId, down: bool) {
        for s in self.nodes.iter().filter(|s| s.me() != node) {
            s.liveness.set(node, down);
            self.net.block_on(s.clone().member_changed(node, down));
        }
    }

    fn call(&self, from: NodeId, to: NodeId, msg: Msg) -> Option<Msg> {
        self.net.block_on(self.nodes[from as usize].call(to, msg))
    }

    /// Paths whose homes (as a full job computes them) satisfy `want(rack a home, rack b home,
    /// global home)`.
    fn paths_where(&self, want: impl Fn(NodeId, NodeId, NodeId) -> bool) -> Vec<String> {
        let m = &self.nodes[0].membership;
        let paths: Vec<String> = (0..1000)
            .map(|i| format!("train/{i}"))
            .filter(|p| want(m.rack_home(p, "a"), m.rack_home(p, "b"), m.global_home(p)))
            .collect();
        assert!(paths.len() >= 2, "too few paths have such homes");
        paths
    }

    fn path_where(&self, want: impl Fn(NodeId, NodeId, NodeId) -> bool) -> String {
        self.paths_where(want).swap_remove(0)
    }
}

fn v() -> Version {
    Version {
        size: 7,
        mtime_ns: 1,
    }
}

#[test]
fn the_first_miss_fetches_the_rest_wait_then_pull_from_the_holder_in_any_rack() {
    let job = Job::new();
    let p = job.path_where(|a, _, g| a == 1 && g == 2);
    assert_eq!(
        job.locate(0, &p),
        Reply::Fetch,
        "nobody has it: node 0 reads it"
    );
    assert_eq!(
        job.locate(3, &p),
        Reply::WaitFor(0),
        "the other rack waits for node 0"
    );
    assert_eq!(job.gained(0, &p), vec![true]);
    assert_eq!(
        job.locate(1, &p),
        Reply::Holders(vec![0]),
        "a rack-mate pulls"
    );
    assert_eq!(
        job.locate(2, &p),
        Reply::Holders(vec![0]),
        "so does the other rack"
    );
    // Answered once, node 1 remembers: its next miss asks nobody.
    let before = job.net.delivered(1);
    assert_eq!(job.locate(1, &p), Reply::Holders(vec![0]));
    assert_eq!(job.net.delivered(1), before);
}

#[test]
fn a_frozen_rack_home_costs_one_timeout_then_is_skipped() {
    let job = Job::new();
    let paths = job.paths_where(|a, _, _| a == 1);
    job.net.fault(1, Some(Fault::Frozen));
    let started = Instant::now();
    assert_eq!(
        job.locate(0, &paths[0]),
        Reply::Fetch,
        "an unreachable home is a miss"
    );
    assert!(
        started.elapsed() >= TIMEOUT,
        "it waited for the frozen home"
    );
    assert!(job.nodes[0].suspects().contains(&1));
    // Suspect: the next miss it is home of is a miss at once.
    let started = Instant::now();
    assert_eq!(job.locate(0, &paths[1]), Reply::Fetch);
    assert!(started.elapsed() < TIMEOUT / 2, "{:?}", started.elapsed());
}

#[test]
fn a_dead_rack_home_is_a_miss_at_once_and_a_publish_it_missed_is_retried() {
    let job = Job::new();
    let p = job.path_where(|a, _, _| a == 1);
    job.net.fault(1, Some(Fault::Dead));
    let started = Instant::now();
    assert_eq!(job.locate(0, &p), Reply::Fetch);
    assert!(
        started.elapsed() < TIMEOUT / 2,
        "a refused call waits for nothing"
    );
    assert_eq!(
        job.gained(0, &p),
        vec![false],
        "not acknowledged: the caller retries"
    );
}

#[test]
fn a_lying_home_is_refused_and_suspected() {
    let job = Job::new();
    let p = job.path_where(|a, _, _| a == 1);
    job.net.fault(1, Some(Fault::Lying));
    assert_eq!(
        job.locate(0, &p),
        Reply::Fetch,
        "holders outside the job are not pulled from"
    );
    assert!(job.nodes[0].suspects().contains(&1));
}

#[test]
fn a_frozen_global_home_costs_the_rack_home_half_a_timeout_not_its_liveness() {
    let job = Job::new();
    // Node 1 asks its rack home (node 0), which asks the frozen global home (node 2).
    let p = job.path_where(|a, _, g| a == 0 && g == 2);
    job.net.fault(2, Some(Fault::Frozen));
    assert_eq!(job.locate(1, &p), Reply::Fetch);
    // The rack home gave up on the global home in time to answer node 1: node 0 is no suspect.
    assert!(!job.nodes[1].suspects().contains(&0));
    assert!(job.nodes[0].suspects().contains(&2));
}

#[test]
fn a_rack_home_asks_the_global_home_about_its_own_misses_in_half_a_timeout() {
    let job = Job::new();
    // Node 0 is rack a's home; node 2 the global home.
    let paths = job.paths_where(|a, _, g| a == 0 && g == 2);
    let (p, q) = (&paths[0], &paths[1]);
    assert_eq!(job.locate(3, p), Reply::Fetch);
    assert_eq!(job.gained(3, p), vec![true]);
    assert_eq!(
        job.locate(0, p),
        Reply::Holders(vec![3]),
        "node 0 asked the global home for its own miss"
    );
    // A frozen global home: node 0 reads the file itself after half a timeout.
    job.net.fault(2, Some(Fault::Frozen));
    let started = Instant::now();
    assert_eq!(job.locate(0, q), Reply::Fetch);
    let waited = started.elapsed();
    assert!(waited >= TIMEOUT / 2 && waited < TIMEOUT, "{waited:?}");
    assert!(job.nodes[0].suspects().contains(&2));
}

#[test]
fn a_lookup_with_no_time_left_asks_nobody_and_suspects_nobody() {
    let job = Job::new();
    // Rack a's home elsewhere (node 1), then node 0 itself with the global home elsewhere.
    let p = job.path_where(|a, _, g| a == 1 && g == 2);
    let q = job.path_where(|a, _, g| a == 0 && g == 2);
    for path in [&p, &q] {
        let r = job.nodes[0].locate(job.net.handle(), path, v(), Duration::ZERO);
        assert_eq!(r, Reply::Fetch);
    }
    assert_eq!((job.net.delivered(1), job.net.delivered(2)), (0, 0));
    assert!(job.nodes[0].suspects().is_empty());
    // The rack table is not left waiting on an answer that never came: with time, node 0's
    // lookup of q asks the global home again and gets the holder.
    assert_eq!(job.gained(3, &q), vec![true]);
    assert_eq!(job.locate(0, &q), Reply::Holders(vec![3]));
}

#[test]
fn a_dead_global_homes_files_move_to_the_next_home_with_what_the_racks_hold() {
    let job = Job::new();
    // Node 0 holds p; rack a's home is node 1; the global home, node 2, dies.
    let p = job.path_where(|a, _, g| a == 1 && g == 2);
    assert_eq!(job.locate(0, &p), Reply::Fetch);
    assert_eq!(job.gained(0, &p), vec![true]);
    job.net.fault(2, Some(Fault::Dead));
    job.gossip(2, true);
    // Node 3 is now its rack's home and asks the next global home, which rack a's home told.
    assert_eq!(job.locate(3, &p), Reply::Holders(vec![0]));
    let failovers = |n: usize| {
        let s = &job.nodes[n].stats;
        s.failovers.load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!((failovers(0), failovers(1), failovers(3)), (1, 1, 1));
}

#[test]
fn a_restarted_home_is_told_again_what_it_was_home_of() {
    let mut job = Job::new();
    let p = job.path_where(|a, _, _| a == 1);
    assert_eq!(job.locate(0, &p), Reply::Fetch);
    assert_eq!(job.gained(0, &p), vec![true]);
    // Node 1 restarts with empty tables and tells the others, who re-announce.
    job.nodes[1] = job.start(1);
    let answered = job.net.block_on(job.nodes[1].rejoin(TIMEOUT));
    assert_eq!(answered, 3);
    assert_eq!(job.locate(1, &p), Reply::Holders(vec![0]));
}

#[test]
fn a_member_declared_down_before_it_started_is_answered_once_gossip_has_it_up() {
    let mut job = Job::new();
    // Node 1 was silent past the failure detection time while node 0 started.
    job.nodes[0].liveness.set(1, true);
    job.nodes[1] = job.start(1);
    let node0 = job.nodes[0].clone();
    let gossip = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        node0.liveness.set(1, false);
    });
    let started = Instant::now();
    assert_eq!(job.net.block_on(job.nodes[1].rejoin(TIMEOUT * 5)), 3);
    // Node 1's mount returns once node 0 homes its directories where node 1 does.
    assert!(!job.nodes[0].liveness.is_down(1));
    assert!(started.elapsed() >= Duration::from_millis(200));
    gossip.join().unwrap();
    // A member gossip never has up is answered after the bounded wait.
    job.nodes[2].liveness.set(1, true);
    let started = Instant::now();
    assert_eq!(job.net.block_on(job.nodes[1].rejoin(TIMEOUT * 5)), 3);
    let took = started.elapsed();
    assert!(
        took >= super::failover::JOIN_WAIT && took < TIMEOUT * 5,
        "{took:?}"
    );
}

#[test]
fn a_name_outlives_its_home_at_the_backup_and_goes_back_when_it_returns() {
    let mut job = Job::new();
    let m = &job.nodes[0].membership;
    let (home, backup) = (m.global_home("out"), m.global_order("out")[1]);
    let writer = (0..4).find(|&n| n != home && n != backup).unwrap();
    let entry = Name {
        dir: true,
        holder: writer,
        mode: 0o755,
        ..Name::default()
    };
    let set = Msg::NameSet {
        dir: "out".into(),
        name: "run1".into(),
        entry: Some(entry.clone()),
    };
    assert_eq!(job.call(writer, home, set), Some(Msg::NameIs(None)));
    let get = || Msg::NameGet {
        dir: "out".into(),
        name: "run1".into(),
        wait_ms: 0,
    };
    // The home copies the name to its backup in the background.
    let deadline = Instant::now() + Duration::from_secs(5);
    while job.call(writer, backup, get()) != Some(Msg::NameIs(Some(entry.clone()))) {
        assert!(Instant::now() < deadline, "the backup never got its copy");
        std::thread::sleep(Duration::from_millis(10));
    }
    job.net.fault(home, Some(Fault::Dead));
    job.gossip(home, true);
    let now_home = job.nodes[writer as usize].global_home("out");
    assert_eq!(now_home, backup);
    assert_eq!(
        job.call(writer, now_home, get()),
        Some(Msg::NameIs(Some(entry.clone())))
    );
    // The home restarts empty; the backup gives the name back when told it is up again.
    job.nodes[home as usize] = job.start(home);
    job.net.fault(home, None);
    job.gossip(home, false);
    assert_eq!(
        job.call(writer, home, get()),
        Some(Msg::NameIs(Some(entry)))
    );
}

#[test]
fn a_link_record_under_another_nodes_key_is_refused_through_the_port() {
    let job = Job::new();
    let record = |holder: NodeId, key: &str| {
        let name = Name {
            object: format!("//produced/{holder}/a-1"),
            size: 3,
            mtime_ns: 1,
            holder,
            meta: crate::core::names::NameMeta {
                inode: key.into(),
                nlink: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let dir = crate::core::names::links_dir(key);
        let home = job.nodes[0].global_home(&dir);
        let msg = Msg::NameSet {
            dir,
            name: key.into(),
            entry: Some(name),
        };
        (home, msg)
    };
    // Node 1 makes a record under its own key; one under node 2's is refused at the home.
    let (home, mine) = record(1, "1-a-1");
    assert_eq!(job.call(1, home, mine), Some(Msg::NameIs(None)));
    let (home, theirs) = record(1, "2-a-1");
    assert!(matches!(job.call(1, home, theirs), Some(Msg::Refused(_))));
}
