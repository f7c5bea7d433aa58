//! Runs the locator tiers for a simulated cluster in one process and reports control messages
//! per lookup and per publish, how many of them cross racks, the load on the busiest home, and
//! how often the backing store is read — for the hierarchical locator (node -> rack -> global,
//! with rack-level coalescing) and for a flat global table (every miss and publish goes to the
//! path's global home), on the same workload.
//!
//! cargo run --release --example locator_sim -- [NODES] [RACKS] [FILES_PER_NODE] [EPOCHS]
//!
//! Workload: each epoch every node reads a different random shard of the dataset (like
//! DistributedSampler with set_epoch), all nodes at once; then every node reads the same 16
//! "hot" files at once (a shared validation header, say). Caches are inclusive and never evict.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use dyadfs::core::Version;
use dyadfs::locator::{GlobalHome, Key, Member, Membership, NodeId, RackHome, RackLookup, Reply};

type Reads = Vec<(NodeId, u64)>;

#[derive(Default, Clone)]
struct Count {
    lookups: u64,
    lookup_msgs: u64,
    lookup_cross: u64,
    publishes: u64,
    publish_msgs: u64,
    publish_cross: u64,
    backing_reads: u64,
    local_hits: u64,
    /// Pulls that waited out the peer timeout at a slow holder before the next was tried.
    timeouts: u64,
    /// Reads on a node whose cache disk is full: served, not kept, not published.
    uncached: u64,
}

/// Nodes that are up but failing: a full cache disk (they read and keep nothing) or slow (a
/// pull from them waits out the peer timeout; the gossip does not declare them down).
#[derive(Default)]
struct Faults {
    /// Declared dead by the cluster: homes skip them, nobody pulls from them.
    down: HashSet<NodeId>,
    full: HashSet<NodeId>,
    slow: HashSet<NodeId>,
}

impl Faults {
    /// A reply of holders `h` as the reader meets it: timeouts at slow holders tried in
    /// order, and whether it ends at the backing store (every holder down or slow).
    fn pull(&self, h: &[NodeId], is_down: impl Fn(NodeId) -> bool) -> (u64, bool) {
        let mut timeouts = 0;
        for &n in h.iter().filter(|&&n| !is_down(n)) {
            if !self.slow.contains(&n) {
                return (timeouts, false);
            }
            timeouts += 1;
        }
        (timeouts, true)
    }
}

struct Net<'a> {
    m: &'a Membership,
    /// Requests received per node acting as a home.
    load: Vec<u64>,
}

impl Net<'_> {
    /// One message; returns (messages, cross-rack messages) it cost (0 if to itself).
    fn send(&mut self, from: NodeId, to: NodeId, request: bool) -> (u64, u64) {
        if from == to {
            return (0, 0);
        }
        if request {
            self.load[to as usize] += 1;
        }
        (1, u64::from(self.m.rack_of(from) != self.m.rack_of(to)))
    }
}

fn key(f: u64) -> Key {
    (
        format!("train/sample_{f:08}.npz"),
        Version {
            size: 1 << 18,
            mtime_ns: 1,
        },
    )
}

/// One round of simultaneous reads through the hierarchical locator, with `faults`.
fn round_hier(
    net: &mut Net,
    held: &mut [HashSet<u64>],
    racks: &mut HashMap<NodeId, RackHome>,
    globals: &mut HashMap<NodeId, GlobalHome>,
    reads: &[(NodeId, u64)],
    faults: &Faults,
    c: &mut Count,
) {
    let m = net.m;
    let is_down = |n: NodeId| faults.down.contains(&n);
    let pulled = |r: &Reply, c: &mut Count| match r {
        Reply::Fetch => c.backing_reads += 1,
        Reply::Holders(h) => {
            let (timeouts, backing) = faults.pull(h, is_down);
            c.timeouts += timeouts;
            c.backing_reads += u64::from(backing);
        }
        _ => {}
    };
    let now = Instant::now();
    let mut asks: Vec<(NodeId, u64, NodeId)> = Vec::new(); // (rack home, file, first asker)
    let mut obtain: Vec<(NodeId, u64)> = Vec::new();
    for &(n, f) in reads {
        if held[n as usize].contains(&f) {
            c.local_hits += 1;
            continue;
        }
        c.lookups += 1;
        let k = key(f);
        let rh = m.live_rack_home(&k.0, m.rack_of(n), is_down);
        let (a, x) = net.send(n, rh, true);
        c.lookup_msgs += a;
        c.lookup_cross += x;
        match racks.entry(rh).or_default().lookup(&k, n) {
            RackLookup::Reply(r) => {
                let (a, x) = net.send(rh, n, false);
                c.lookup_msgs += a;
                c.lookup_cross += x;
                pulled(&r, c);
                obtain.push((n, f));
            }
            RackLookup::AskGlobal => asks.push((rh, f, n)),
            RackLookup::Queued => {}
        }
    }
    for (rh, f, first) in asks {
        let k = key(f);
        let gh = m.live_global_home(&k.0, is_down);
        let (a1, x1) = net.send(rh, gh, true);
        let answer = globals
            .entry(gh)
            .or_default()
            .lookup(&k, first, now, Duration::from_secs(30));
        let (a2, x2) = net.send(gh, rh, false);
        c.lookup_msgs += a1 + a2;
        c.lookup_cross += x1 + x2;
        for (n, reply) in racks.get_mut(&rh).unwrap().global_answered(&k, answer) {
            let (a, x) = net.send(rh, n, false);
            c.lookup_msgs += a;
            c.lookup_cross += x;
            pulled(&reply, c);
            obtain.push((n, f));
        }
    }
    for (n, f) in obtain {
        if faults.full.contains(&n) {
            c.uncached += 1;
            continue;
        }
        held[n as usize].insert(f);
        c.publishes += 1;
        let k = key(f);
        let rack = m.rack_of(n);
        let rh = m.live_rack_home(&k.0, rack, is_down);
        let (a, x) = net.send(n, rh, true);
        c.publish_msgs += a;
        c.publish_cross += x;
        if racks.entry(rh).or_default().publish(&k, n) {
            let gh = m.live_global_home(&k.0, is_down);
            let (a, x) = net.send(rh, gh, true);
            c.publish_msgs += a;
            c.publish_cross += x;
            globals.entry(gh).or_default().rack_gained(&k, rack, n);
        }
    }
}

/// The same round through a flat global table: the global home tracks every holder node.
fn round_flat(
    net: &mut Net,
    held: &mut [HashSet<u64>],
    globals: &mut HashMap<NodeId, GlobalHome>,
    reads: &[(NodeId, u64)],
    c: &mut Count,
) {
    let m = net.m;
    let now = Instant::now();
    let mut obtain = Vec::new();
    for &(n, f) in reads {
        if held[n as usize].contains(&f) {
            c.local_hits += 1;
            continue;
        }
        c.lookups += 1;
        let k = key(f);
        let gh = m.global_home(&k.0);
        let (a1, x1) = net.send(n, gh, true);
        let (a2, x2) = net.send(gh, n, false);
        c.lookup_msgs += a1 + a2;
        c.lookup_cross += x1 + x2;
        let answer = globals
            .entry(gh)
            .or_default()
            .lookup(&k, n, now, Duration::from_secs(30));
        if answer == Reply::Fetch {
            c.backing_reads += 1;
        }
        obtain.push((n, f));
    }
    for (n, f) in obtain {
        held[n as usize].insert(f);
        c.publishes += 1;
        let k = key(f);
        let gh = m.global_home(&k.0);
        let (a, x) = net.send(n, gh, true);
        c.publish_msgs += a;
        c.publish_cross += x;
        // Per-node holders: the "rack" of the flat table is the node itself.
        globals
            .entry(gh)
            .or_default()
            .rack_gained(&k, &n.to_string(), n);
    }
}

/// A deterministic shuffle (xorshift), so runs are reproducible without a rand dependency.
fn shuffle(v: &mut [u64], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

fn print(label: &str, c: &Count, load: &[u64], files: u64) {
    let per = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let busiest = load.iter().max().copied().unwrap_or(0);
    let mean = load.iter().sum::<u64>() as f64 / load.len() as f64;
    println!(
        "{label:<26} {:>9} {:>8.2} {:>8.2} {:>9} {:>8.2} {:>8.2} {:>9} {:>7.1} {:>10} {:>9}",
        c.lookups,
        per(c.lookup_msgs, c.lookups),
        per(c.lookup_cross, c.lookups),
        c.publishes,
        per(c.publish_msgs, c.publishes),
        per(c.publish_cross, c.publishes),
        busiest,
        mean,
        c.backing_reads,
        files
    );
}

/// One cluster's tables, run for a healthy first epoch of random shards and then a second
/// with the shards shifted by one node: the setting of the failure and fault rounds.
struct TwoEpochs<'a> {
    net: Net<'a>,
    held: Vec<HashSet<u64>>,
    racks: HashMap<NodeId, RackHome>,
    globals: HashMap<NodeId, GlobalHome>,
    order: Vec<u64>,
    per_node: u64,
}

impl<'a> TwoEpochs<'a> {
    /// The tables after the first epoch.
    fn after_first(m: &'a Membership, per_node: u64) -> Self {
        let nodes = m.members().count();
        let mut order: Vec<u64> = (0..nodes as u64 * per_node).collect();
        shuffle(&mut order, 1);
        let mut t = TwoEpochs {
            net: Net {
                m,
                load: vec![0; nodes],
            },
            held: vec![HashSet::new(); nodes],
            racks: HashMap::new(),
            globals: HashMap::new(),
            order,
            per_node,
        };
        t.round(&Faults::default());
        t
    }

    /// One epoch of the current shards under `faults` (down nodes read nothing).
    fn round(&mut self, faults: &Faults) -> Count {
        let reads: Reads = self
            .order
            .iter()
            .enumerate()
            .map(|(i, &f)| ((i as u64 / self.per_node) as NodeId, f))
            .filter(|(n, _)| !faults.down.contains(n))
            .collect();
        let mut c = Count::default();
        let (net, held) = (&mut self.net, &mut self.held);
        round_hier(
            net,
            held,
            &mut self.racks,
            &mut self.globals,
            &reads,
            faults,
            &mut c,
        );
        c
    }

    /// The second epoch under `faults`: shards shifted by one node.
    fn second(&mut self, faults: &Faults) -> Count {
        self.order.rotate_left(self.per_node as usize);
        self.round(faults)
    }
}

/// Kills `dead` nodes after a first epoch (their caches and tables are gone), optionally lets
/// the survivors re-home what the dead were home of (the daemon's `member_changed`), then runs
/// a second epoch of shifted shards on the survivors. Returns (re-homing messages, re-homed
/// entries, the second epoch's counts).
fn failure_round(
    m: &Membership,
    per_node: u64,
    dead: &[NodeId],
    rehome: bool,
) -> (u64, u64, Count) {
    let mut t = TwoEpochs::after_first(m, per_node);
    let TwoEpochs {
        held,
        racks,
        globals,
        ..
    } = &mut t;
    let down: HashSet<NodeId> = dead.iter().copied().collect();
    for &d in dead {
        held[d as usize].clear();
        racks.remove(&d);
        globals.remove(&d);
    }
    let is_down = |n: NodeId| down.contains(&n);
    let (mut msgs, mut entries) = (0u64, 0u64);
    if rehome {
        // Members: their copies whose rack home died, to the new rack home (one batch each).
        for (n, files) in held.iter().enumerate() {
            let n = n as NodeId;
            let rack = m.rack_of(n).to_string();
            let mut batches = HashSet::new();
            for &f in files {
                let k = key(f);
                if is_down(m.rack_home(&k.0, &rack)) {
                    let rh = m.live_rack_home(&k.0, &rack, is_down);
                    batches.insert(rh);
                    entries += 1;
                    if racks.entry(rh).or_default().publish(&k, n) {
                        let gh = m.live_global_home(&k.0, is_down);
                        globals.entry(gh).or_default().rack_gained(&k, &rack, n);
                    }
                }
            }
            msgs += batches.len() as u64;
        }
        // Rack homes: their racks' files whose global home died, to the new global home.
        let homes: Vec<NodeId> = racks.keys().copied().collect();
        for rh in homes {
            let rack = m.rack_of(rh).to_string();
            let held_keys: Vec<(Key, NodeId)> = racks[&rh]
                .held()
                .map(|((path, version), n)| ((path.to_string(), version), n))
                .collect();
            let mut batches = HashSet::new();
            for (k, holder) in held_keys {
                if is_down(m.global_home(&k.0)) {
                    let gh = m.live_global_home(&k.0, is_down);
                    batches.insert(gh);
                    entries += 1;
                    globals
                        .entry(gh)
                        .or_default()
                        .rack_gained(&k, &rack, holder);
                }
            }
            msgs += batches.len() as u64;
        }
    }
    // The second epoch: dead nodes read nothing.
    let c = t.second(&Faults {
        down,
        ..Faults::default()
    });
    (msgs, entries, c)
}

/// A healthy first epoch, then a second (shards shifted by one node) with `faults`: nodes
/// whose cache disk is full, or slow. Returns the second epoch's counts.
fn fault_round(m: &Membership, per_node: u64, faults: &Faults) -> Count {
    TwoEpochs::after_first(m, per_node).second(faults)
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers"))
        .collect();
    let nodes = *args.first().unwrap_or(&1024);
    let n_racks = *args.get(1).unwrap_or(&32);
    let per_node = *args.get(2).unwrap_or(&64);
    let epochs = *args.get(3).unwrap_or(&3);
    let files = nodes * per_node;
    let members = (0..nodes as NodeId)
        .map(|id| Member {
            id,
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 10_000 + id as u16),
            rack: format!("r{:03}", u64::from(id) * n_racks / nodes),
        })
        .collect();
    let m = Membership::new(members, 0).expect("membership");
    println!(
        "{nodes} nodes in {n_racks} racks, {files} files ({per_node} per node per epoch), \
         {epochs} epochs of random shards, then 16 hot files read by every node at once\n"
    );
    println!(
        "{:<26} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9} {:>7} {:>10} {:>9}",
        "round / locator",
        "lookups",
        "msg/lkp",
        "xrack/lk",
        "publishes",
        "msg/pub",
        "xrack/pb",
        "max load",
        "mean",
        "backing rd",
        "files"
    );
    // (label, simultaneous reads as (node, file), distinct files)
    let mut rounds: Vec<(String, Reads, u64)> = Vec::new();
    for e in 1..=epochs {
        let mut order: Vec<u64> = (0..files).collect();
        shuffle(&mut order, e);
        let reads = order
            .iter()
            .enumerate()
            .map(|(i, &f)| ((i as u64 / per_node) as NodeId, f))
            .collect();
        rounds.push((format!("epoch {e}"), reads, files));
    }
    let hot: Vec<(NodeId, u64)> = (0..16u64)
        .flat_map(|f| (0..nodes as NodeId).map(move |n| (n, files + f)))
        .collect();
    rounds.push(("hot files".into(), hot, 16));

    let mut held_h = vec![HashSet::new(); nodes as usize];
    let mut held_f = vec![HashSet::new(); nodes as usize];
    let (mut racks, mut globals_h, mut globals_f) =
        (HashMap::new(), HashMap::new(), HashMap::new());
    for (label, reads, nfiles) in &rounds {
        let mut net = Net {
            m: &m,
            load: vec![0; nodes as usize],
        };
        let mut c = Count::default();
        round_hier(
            &mut net,
            &mut held_h,
            &mut racks,
            &mut globals_h,
            reads,
            &Faults::default(),
            &mut c,
        );
        print(&format!("{label} hierarchical"), &c, &net.load, *nfiles);
        let mut net = Net {
            m: &m,
            load: vec![0; nodes as usize],
        };
        let mut c = Count::default();
        round_flat(&mut net, &mut held_f, &mut globals_f, reads, &mut c);
        print(&format!("{label} flat"), &c, &net.load, *nfiles);
    }
    println!(
        "\nfailures: nodes die after epoch 1 (caches and tables lost); epoch 2 on the survivors"
    );
    println!(
        "{:<26} {:>12} {:>12} {:>12} {:>16}",
        "dead / re-homing", "rehome msgs", "rehomed", "backing rd", "of them lost"
    );
    for dead_n in [1u64, 10] {
        let dead: Vec<NodeId> = (0..dead_n).map(|i| (i * 97 % nodes) as NodeId).collect();
        for rehome in [true, false] {
            let (msgs, entries, c) = failure_round(&m, per_node, &dead, rehome);
            // Copies only the dead held are gone: those reads must go to the backing store.
            let lost = dead_n * per_node;
            println!(
                "{:<26} {:>12} {:>12} {:>12} {:>16}",
                format!(
                    "{dead_n} dead, {}",
                    if rehome { "re-homing" } else { "no re-homing" }
                ),
                msgs,
                entries,
                c.backing_reads,
                lost
            );
        }
    }
    println!(
        "\nfaults of live nodes: a healthy epoch 1, then epoch 2 with some nodes' cache disks \
         full (they read, keep nothing) or slow (pulls from them wait out the peer timeout)"
    );
    println!(
        "{:<26} {:>9} {:>12} {:>10} {:>10} {:>10}",
        "faulty nodes", "lookups", "backing rd", "timeouts", "uncached", "publishes"
    );
    let pick = |n: u64, offset: u64| -> HashSet<NodeId> {
        (0..n)
            .map(|i| ((i * 97 + offset) % nodes) as NodeId)
            .collect()
    };
    let tenth = (nodes / 10).max(1);
    let cases = [
        ("none", Faults::default()),
        (
            "1 disk full",
            Faults {
                full: pick(1, 5),
                ..Faults::default()
            },
        ),
        (
            "10% disks full",
            Faults {
                full: pick(tenth, 5),
                ..Faults::default()
            },
        ),
        (
            "1 slow",
            Faults {
                slow: pick(1, 5),
                ..Faults::default()
            },
        ),
        (
            "10% slow",
            Faults {
                slow: pick(tenth, 5),
                ..Faults::default()
            },
        ),
        (
            "10% full + 10% slow",
            Faults {
                full: pick(tenth, 5),
                slow: pick(tenth, 50),
                ..Faults::default()
            },
        ),
    ];
    for (label, faults) in &cases {
        let c = fault_round(&m, per_node, faults);
        println!(
            "{label:<26} {:>9} {:>12} {:>10} {:>10} {:>10}",
            c.lookups, c.backing_reads, c.timeouts, c.uncached, c.publishes
        );
    }
    println!(
        "\nmsg/lkp, msg/pub: control messages per lookup (a miss) and per publish (a new copy);\n\
         xrack: of those, messages between racks; max load / mean: requests received by the\n\
         busiest home and by the average node in that round; backing rd: backing-store reads."
    );
}
