//! The cluster's fetch logic without a cluster: a scripted locator, pulls from an in-memory
//! table of holders, and an in-memory backing store. Which holder is tried, in which order,
//! what a failure is reported as, how long a coordinated wait lasts and when the backing store
//! serves are checked here; the 4-process tests check that the real parts do the same.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::AtomicU32;

use super::*;
use crate::core::source::Piece;
use crate::locator::membership::Membership;
use crate::locator::tiers::Reply;
use crate::transport::pull::Sink;

const DATA: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
const PEERS: &str = "0 127.0.0.1:7000 r0\n1 127.0.0.1:7001 r0\n\
                     2 127.0.0.1:7002 r1\n3 127.0.0.1:7003 r1\n";

fn version() -> Version {
    Version {
        size: DATA.len() as u64,
        mtime_ns: 1,
    }
}

/// A locator that answers from a script (the last answer repeats) and records what it is told.
struct Script {
    membership: Membership,
    answers: Mutex<VecDeque<Reply>>,
    asked: AtomicU32,
    suspects: Vec<NodeId>,
    down: Vec<NodeId>,
    timeout: Duration,
    fetch_failed: Mutex<Vec<String>>,
    pull_failed: Mutex<Vec<NodeId>>,
    /// What each holder says it has of a large file (no entry: it does not say).
    maps: HashMap<NodeId, Option<PageMap>>,
    maps_asked: AtomicU32,
}

impl Script {
    fn new(answers: Vec<Reply>) -> Script {
        Script {
            membership: Membership::parse(PEERS, 0).unwrap(),
            answers: Mutex::new(answers.into()),
            asked: AtomicU32::new(0),
            suspects: Vec::new(),
            down: Vec::new(),
            timeout: Duration::from_secs(5),
            fetch_failed: Mutex::default(),
            pull_failed: Mutex::default(),
            maps: HashMap::new(),
            maps_asked: AtomicU32::new(0),
        }
    }
}

impl Locate for Script {
    fn me(&self) -> NodeId {
        0
    }
    fn membership(&self) -> &Membership {
        &self.membership
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn locate(&self, _path: &str, _version: Version, within: Duration) -> Reply {
        assert!(!within.is_zero() && within <= self.timeout, "{within:?}");
        self.asked.fetch_add(1, Ordering::Relaxed);
        let mut a = self.answers.lock().unwrap();
        if a.len() > 1 {
            a.pop_front().unwrap()
        } else {
            a.front().cloned().expect("a scripted answer")
        }
    }
    fn fetch_failed(&self, path: &str, _version: Version) {
        self.fetch_failed.lock().unwrap().push(path.to_string());
    }
    fn suspects(&self) -> Vec<NodeId> {
        self.suspects.clone()
    }
    fn pull_failed(&self, _path: &str, _version: Version, holder: NodeId, _: &TransportError) {
        self.pull_failed.lock().unwrap().push(holder);
    }
    fn is_down(&self, node: NodeId) -> bool {
        self.down.contains(&node)
    }
    fn pages_of(
        &self,
        holder: NodeId,
        _file: (&str, Version, u64),
        _within: Duration,
    ) -> Option<Option<PageMap>> {
        self.maps_asked.fetch_add(1, Ordering::Relaxed);
        self.maps.get(&holder).cloned()
    }
}

/// Holders by port (node n listens on 7000 + n): every node serves `DATA` except the broken
/// (which answer an error at once) and the frozen (which use up the time they are given).
#[derive(Default)]
struct Peers {
    broken: HashSet<NodeId>,
    frozen: HashSet<NodeId>,
    tried: Mutex<Vec<NodeId>>,
    /// The time each pull was given.
    given: Mutex<Vec<Duration>>,
    /// Each batched pull: its holder and how many files.
    batches: Mutex<Vec<(NodeId, usize)>>,
}

impl Pull for Peers {
    fn pull(
        &self,
        peer: SocketAddr,
        want: &Want,
        sink: Sink<'_>,
        within: Duration,
    ) -> Result<u64, TransportError> {
        let node = NodeId::from(peer.port() - 7000);
        self.tried.lock().unwrap().push(node);
        self.given.lock().unwrap().push(within);
        if self.frozen.contains(&node) {
            std::thread::sleep(within);
            return Err(TransportError::Timeout {
                peer,
                what: "a staged chunk",
                timeout: within,
            });
        }
        if self.broken.contains(&node) {
            return Err(TransportError::Remote {
                peer,
                message: "broken".into(),
            });
        }
        let bytes = &DATA[want.offset as usize..(want.offset + want.len) as usize];
        sink(want.offset, bytes, crc32c::crc32c(bytes)).map_err(TransportError::Sink)?;
        Ok(want.len)
    }

    /// Serves `DATA` for each file but those named `missing*`, which the holder says it has
    /// not got; a broken holder refuses every file, a frozen one the whole batch.
    fn pull_batch(
        &self,
        peer: SocketAddr,
        wants: &[Want],
        sink: crate::transport::pull::BatchSink<'_>,
        within: Duration,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let node = NodeId::from(peer.port() - 7000);
        self.batches.lock().unwrap().push((node, wants.len()));
        self.given.lock().unwrap().push(within);
        if self.frozen.contains(&node) {
            return Err(TransportError::Timeout {
                peer,
                what: "a batch's file",
                timeout: within,
            });
        }
        let refused = || TransportError::Remote {
            peer,
            message: "not here".into(),
        };
        Ok(wants
            .iter()
            .enumerate()
            .map(|(i, w)| {
                if self.broken.contains(&node) || w.path.starts_with("missing") {
                    return Err(refused());
                }
                let bytes = &DATA[..w.len as usize];
                sink(i, bytes, crc32c::crc32c(bytes)).map_err(TransportError::Sink)
            })
            .collect())
    }
}

/// The shared file system: `DATA` under any path, unless it fails.
#[derive(Default)]
struct Shared {
    reads: AtomicU32,
    fails: bool,
}

impl Source for Shared {
    fn read_at(&self, _: &str, _: Version, offset: u64, buf: &mut [u8]) -> io::Result<Origin> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self.fails {
            return Err(io::Error::other("shared file system down"));
        }
        buf.copy_from_slice(&DATA[offset as usize..offset as usize + buf.len()]);
        Ok(Origin::Backing)
    }
}

fn cluster(script: Script, peers: Peers, shared: Shared) -> ClusterSource<Script, Peers, Shared> {
    ClusterSource {
        locator: script,
        puller: peers,
        backing: shared,
        stats: Arc::default(),
        maps: Default::default(),
        spent: Default::default(),
    }
}

/// Reads all of `path` through the source; the bytes must be `DATA` whatever served them.
fn read_all(s: &ClusterSource<Script, Peers, Shared>, path: &str) -> io::Result<Origin> {
    let mut buf = vec![0; DATA.len()];
    let origin = s.read_at(path, version(), 0, &mut buf)?;
    assert_eq!(buf, DATA);
    Ok(origin)
}

fn tried(s: &ClusterSource<Script, Peers, Shared>) -> Vec<NodeId> {
    s.puller.tried.lock().unwrap().clone()
}

#[test]
fn a_holder_serves_and_the_shared_file_system_is_not_read() {
    let s = cluster(
        Script::new(vec![Reply::Holders(vec![2])]),
        Peers::default(),
        Shared::default(),
    );
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Peer);
    assert_eq!(tried(&s), [2]);
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 0);
}

#[test]
fn a_holder_in_this_rack_is_preferred() {
    let s = cluster(
        Script::new(vec![Reply::Holders(vec![2, 3, 1])]),
        Peers::default(),
        Shared::default(),
    );
    read_all(&s, "a").unwrap();
    assert_eq!(tried(&s), [1], "node 1 shares node 0's rack");
}

#[test]
fn a_failed_holder_is_reported_and_the_next_serves() {
    let peers = Peers {
        broken: [1].into(),
        ..Default::default()
    };
    let s = cluster(
        Script::new(vec![Reply::Holders(vec![1, 2])]),
        peers,
        Shared::default(),
    );
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Peer);
    assert_eq!(tried(&s), [1, 2]);
    assert_eq!(*s.locator.pull_failed.lock().unwrap(), [1]);
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 0);
}

/// Frozen holders (not known to be down yet) share one peer timeout per read: the second is
/// not given another, and the shared file system serves once the first used it up.
#[test]
fn frozen_holders_cost_a_read_one_peer_timeout_in_all() {
    let peers = Peers {
        frozen: [1, 2, 3].into(),
        ..Default::default()
    };
    let mut script = Script::new(vec![Reply::Holders(vec![1, 2, 3])]);
    script.timeout = Duration::from_millis(200);
    let s = cluster(script, peers, Shared::default());
    let t = std::time::Instant::now();
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    let given = s.puller.given.lock().unwrap().clone();
    assert!(given[0] <= Duration::from_millis(200), "{given:?}");
    assert!(
        given.iter().sum::<Duration>() <= Duration::from_millis(200),
        "{given:?}"
    );
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 1);
    // One budget (200 ms), not three, with room for a loaded test machine.
    assert!(
        t.elapsed() < Duration::from_millis(550),
        "{:?}",
        t.elapsed()
    );
}

/// A file whose read spent the peer timeout on holders that froze together is read from the
/// shared file system at once by its next reads (the other READs of a large file) for a
/// timeout, then from holders again: a holder that went away costs a file one timeout.
#[test]
fn a_file_spends_one_peer_timeout_not_one_per_read() {
    let peers = Peers {
        frozen: [1, 2].into(),
        ..Default::default()
    };
    let mut script = Script::new(vec![Reply::Holders(vec![1, 2])]);
    script.timeout = Duration::from_millis(300);
    let s = cluster(script, peers, Shared::default());
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    let pulls = tried(&s).len();
    assert!(pulls >= 1);
    for _ in 0..3 {
        assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    }
    assert_eq!(tried(&s).len(), pulls, "no holder was tried again");
    // Another file still tries its holders.
    assert_eq!(read_all(&s, "b").unwrap(), Origin::Backing);
    assert!(tried(&s).len() > pulls);
    let pulls = tried(&s).len();
    // A timeout later, the file's holders are tried again.
    std::thread::sleep(Duration::from_millis(350));
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    assert!(tried(&s).len() > pulls);
}

#[test]
fn when_every_holder_fails_the_shared_file_system_serves() {
    let peers = Peers {
        broken: [1, 2, 3].into(),
        ..Default::default()
    };
    let s = cluster(
        Script::new(vec![Reply::Holders(vec![1, 2, 3])]),
        peers,
        Shared::default(),
    );
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    let mut t = tried(&s);
    t.sort();
    assert_eq!(t, [1, 2, 3], "each holder is tried once");
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 1);
}

#[test]
fn holders_that_dropped_the_file_are_passed_over_for_those_located_again() {
    // The node tier named node 1 (a hint from a feed) which has dropped the file; located
    // again, the file is at 1 and 3: only 3 is tried, and the shared file system is not read.
    let s = cluster(
        Script::new(vec![Reply::Holders(vec![1]), Reply::Holders(vec![1, 3])]),
        Peers {
            broken: [1].into(),
            ..Default::default()
        },
        Shared::default(),
    );
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Peer);
    assert_eq!(tried(&s), [1, 3]);
    assert_eq!(s.locator.asked.load(Ordering::Relaxed), 2);
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 0);
}

#[test]
fn suspect_holders_are_tried_last() {
    let mut script = Script::new(vec![Reply::Holders(vec![1, 2])]);
    script.suspects = vec![1];
    let s = cluster(script, Peers::default(), Shared::default());
    read_all(&s, "a").unwrap();
    assert_eq!(tried(&s), [2], "node 1 is suspect although in this rack");
}

/// A cluster whose one holder, `node`, froze and is suspect already (an earlier request timed
/// out on it), with a peer timeout of 400 ms.
fn only_holder_frozen_and_suspect(node: NodeId) -> ClusterSource<Script, Peers, Shared> {
    let mut script = Script::new(vec![Reply::Holders(vec![node])]);
    script.suspects = vec![node];
    script.timeout = Duration::from_millis(400);
    let peers = Peers {
        frozen: [node].into(),
        ..Peers::default()
    };
    cluster(script, peers, Shared::default())
}

/// The first pull was given at most a quarter of the 400 ms peer timeout.
fn assert_first_pull_waited_a_quarter(s: &ClusterSource<Script, Peers, Shared>) {
    let given = s.puller.given.lock().unwrap().clone();
    assert!(given[0] <= Duration::from_millis(100), "{given:?}");
}

#[test]
fn a_suspect_only_holder_gets_a_short_wait_then_the_shared_fs_serves() {
    // This request's own timeout is not spent on the frozen holder again: a quarter of it,
    // then the shared file system.
    let s = only_holder_frozen_and_suspect(1);
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    assert_eq!(tried(&s), [1]);
    assert_first_pull_waited_a_quarter(&s);
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 1);
}

#[test]
fn this_node_as_the_only_holder_is_no_holder() {
    // The locator may still list this node for a copy it just dropped.
    let s = cluster(
        Script::new(vec![Reply::Holders(vec![0])]),
        Peers::default(),
        Shared::default(),
    );
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    assert!(tried(&s).is_empty());
}

#[test]
fn a_fetch_reads_the_shared_file_system_and_a_failed_one_is_reported() {
    let s = cluster(
        Script::new(vec![Reply::Fetch]),
        Peers::default(),
        Shared::default(),
    );
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    assert!(s.locator.fetch_failed.lock().unwrap().is_empty());

    let down = Shared {
        fails: true,
        ..Default::default()
    };
    let s = cluster(Script::new(vec![Reply::Fetch]), Peers::default(), down);
    assert!(read_all(&s, "a").is_err());
    assert_eq!(*s.locator.fetch_failed.lock().unwrap(), ["a"]);
}

#[test]
fn a_waiter_pulls_from_the_fetcher_at_once() {
    // The fetcher serves (or fills for the waiter) whatever range it asks for.
    let s = cluster(
        Script::new(vec![Reply::WaitFor(2)]),
        Peers::default(),
        Shared::default(),
    );
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Peer);
    assert_eq!(tried(&s), [2]);
    assert_eq!(s.locator.asked.load(Ordering::Relaxed), 1);
    assert_eq!(s.stats.coordinated_waits.load(Ordering::Relaxed), 1);
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 0);
}

#[test]
fn a_fetcher_that_cannot_serve_is_asked_about_again() {
    // Node 2 fails; the home then hands the fetch to this node.
    let peers = Peers {
        broken: [2].into(),
        ..Default::default()
    };
    let s = cluster(
        Script::new(vec![Reply::WaitFor(2), Reply::Fetch]),
        peers,
        Shared::default(),
    );
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    assert_eq!(s.locator.asked.load(Ordering::Relaxed), 2);
    assert_eq!(*s.locator.pull_failed.lock().unwrap(), [2]);
}

#[test]
fn a_wait_is_bounded_by_the_timeout() {
    let mut script = Script::new(vec![Reply::WaitFor(2)]);
    script.timeout = Duration::from_millis(100);
    let peers = Peers {
        broken: [2].into(),
        ..Default::default()
    };
    let s = cluster(script, peers, Shared::default());
    let t = Instant::now();
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
}

#[test]
fn waiting_for_oneself_is_a_fetch() {
    let s = cluster(
        Script::new(vec![Reply::WaitFor(0)]),
        Peers::default(),
        Shared::default(),
    );
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    assert_eq!(s.locator.asked.load(Ordering::Relaxed), 1);
}

#[test]
fn a_produced_object_comes_from_its_producer_never_the_shared_file_system() {
    let object = "//produced/3/5-1";
    let s = cluster(
        Script::new(vec![Reply::Fetch]),
        Peers::default(),
        Shared::default(),
    );
    assert_eq!(read_all(&s, object).unwrap(), Origin::Peer);
    assert_eq!(tried(&s), [3]);

    let peers = Peers {
        broken: [3].into(),
        ..Default::default()
    };
    let s = cluster(Script::new(vec![Reply::Fetch]), peers, Shared::default());
    assert!(read_all(&s, object).is_err());
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 0);
}

#[test]
fn a_holder_known_to_be_down_is_never_tried() {
    let mut script = Script::new(vec![Reply::Holders(vec![1, 2])]);
    script.down = vec![1];
    let s = cluster(script, Peers::default(), Shared::default());
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Peer);
    assert_eq!(tried(&s), [2]);

    // The only holder is down: the shared file system serves at once.
    let mut script = Script::new(vec![Reply::Holders(vec![1])]);
    script.down = vec![1];
    let s = cluster(script, Peers::default(), Shared::default());
    assert_eq!(read_all(&s, "a").unwrap(), Origin::Backing);
    assert!(tried(&s).is_empty());
}

/// Bytes a holder sent that this node's cache could not store (its disk full or read-only) are
/// no fault of the holder: it is not reported, no other holder is tried and the shared file
/// system is not read; the sink's error comes back (the reader then reads uncached).
#[test]
fn a_sink_that_cannot_store_the_bytes_blames_no_holder() {
    let s = cluster(
        Script::new(vec![Reply::Holders(vec![1, 2])]),
        Peers::default(),
        Shared::default(),
    );
    let mut full = |_: u64, _: &[u8], _: Option<u32>| -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSPC))
    };
    let e = s
        .read_into("a", version(), 0, DATA.len() as u64, &mut full)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(tried(&s), [1]);
    assert!(s.locator.pull_failed.lock().unwrap().is_empty());
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 0);
}

/// Reads `paths` as one batch; every file's bytes must be `DATA` whatever served them.
fn read_batch(s: &ClusterSource<Script, Peers, Shared>, paths: &[&str]) -> Vec<Origin> {
    let pieces: Vec<Piece> = paths
        .iter()
        .map(|p| Piece {
            path: p,
            version: version(),
            len: DATA.len() as u64,
        })
        .collect();
    let mut got: Vec<Vec<u8>> = vec![Vec::new(); paths.len()];
    let mut sink = |i: usize, off: u64, bytes: &[u8], _: Option<u32>| {
        assert_eq!(off, 0);
        got[i] = bytes.to_vec();
        Ok(())
    };
    let origins = s.read_batch(&pieces, &mut sink);
    assert!(got.iter().all(|g| g == DATA));
    origins.into_iter().map(|o| o.unwrap()).collect()
}

#[test]
fn a_batch_moves_by_holder_and_what_it_did_not_bring_comes_one_by_one() {
    let s = cluster(
        Script::new(vec![Reply::Holders(vec![2])]),
        Peers::default(),
        Shared::default(),
    );
    let origins = read_batch(&s, &["a", "b", "missing", "c"]);
    assert_eq!(origins, [Origin::Peer; 4]);
    // One batch of all four from their holder; the file it refused, located again and pulled
    // alone (it is served then), its holder reported.
    assert_eq!(*s.puller.batches.lock().unwrap(), [(2, 4)]);
    assert_eq!(tried(&s), [2]);
    assert_eq!(*s.locator.pull_failed.lock().unwrap(), [2]);
    assert_eq!(s.locator.asked.load(Ordering::Relaxed), 5);
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 0);

    // A lone file of its holder is pulled alone; a broken holder refuses the batch's files,
    // which the shared file system serves; a frozen one fails the batch as a whole.
    let s = cluster(
        Script::new(vec![
            Reply::Holders(vec![3]),
            Reply::Holders(vec![2]),
            Reply::Holders(vec![2]),
            Reply::Holders(vec![2]),
        ]),
        Peers {
            broken: [2].into(),
            ..Peers::default()
        },
        Shared::default(),
    );
    let origins = read_batch(&s, &["a", "b", "c"]);
    assert_eq!(origins, [Origin::Peer, Origin::Backing, Origin::Backing]);
    assert_eq!(*s.puller.batches.lock().unwrap(), [(2, 2)]);
    assert_eq!(tried(&s), [3, 2, 2]);
    let mut script = Script::new(vec![Reply::Holders(vec![2])]);
    script.timeout = Duration::from_millis(50);
    let s = cluster(
        script,
        Peers {
            frozen: [2].into(),
            ..Peers::default()
        },
        Shared::default(),
    );
    let origins = read_batch(&s, &["a", "b"]);
    assert_eq!(origins, [Origin::Backing; 2]);
    assert_eq!(*s.puller.batches.lock().unwrap(), [(2, 2)]);
}

#[test]
fn a_batch_to_a_suspect_holder_gets_a_short_wait() {
    // As a single pull does: a quarter of the timeout, not all that is left of it.
    let s = only_holder_frozen_and_suspect(2);
    let origins = read_batch(&s, &["a", "b"]);
    assert_eq!(origins, [Origin::Backing; 2]);
    assert_eq!(*s.puller.batches.lock().unwrap(), [(2, 2)]);
    assert_first_pull_waited_a_quarter(&s);
}

/// A large file's first page: what a random reader of it reads.
fn read_page(s: &ClusterSource<Script, Peers, Shared>) -> Origin {
    let big = Version {
        size: 16 << 20,
        mtime_ns: 1,
    };
    let mut buf = vec![0; DATA.len()];
    let origin = s.read_at("big.h5", big, 0, &mut buf).unwrap();
    assert_eq!(buf, DATA);
    origin
}

#[test]
fn holders_of_a_large_file_are_pulled_from_only_for_pages_they_say_they_have() {
    let map = |first_page: bool| PageMap {
        page: 64 << 10,
        first: 0,
        masks: vec![if first_page { 0b1 } else { 0b10 }, u32::MAX],
        fills: false,
    };
    // Holder 1 lacks the page, 2 has no copy: the shared file system serves it, nobody is
    // asked for it, the file is not located again; the maps are asked again only once stale.
    let mut script = Script::new(vec![Reply::Holders(vec![1, 2])]);
    script.maps = [(1, Some(map(false))), (2, None)].into();
    let s = cluster(script, Peers::default(), Shared::default());
    assert_eq!(read_page(&s), Origin::Backing);
    assert_eq!(read_page(&s), Origin::Backing);
    assert!(tried(&s).is_empty());
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 2);
    assert_eq!(s.locator.asked.load(Ordering::Relaxed), 2);
    assert_eq!(s.locator.maps_asked.load(Ordering::Relaxed), 2);
    // Holder 2 lacks it too but is the file's fetcher, which fills what it lacks: pulled from
    // it, not from 1, and the shared file system is not read here.
    let mut script = Script::new(vec![Reply::Holders(vec![1, 2])]);
    let fetcher = PageMap {
        fills: true,
        ..map(false)
    };
    script.maps = [(1, Some(map(false))), (2, Some(fetcher))].into();
    let s = cluster(script, Peers::default(), Shared::default());
    assert_eq!(read_page(&s), Origin::Peer);
    assert_eq!(tried(&s), [2]);
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 0);
    // Holder 1 has it: pulled from it, its map asked once.
    let mut script = Script::new(vec![Reply::Holders(vec![1])]);
    script.maps = [(1, Some(map(true)))].into();
    let s = cluster(script, Peers::default(), Shared::default());
    assert_eq!(read_page(&s), Origin::Peer);
    assert_eq!(read_page(&s), Origin::Peer);
    assert_eq!(tried(&s), [1, 1]);
    assert_eq!(s.locator.maps_asked.load(Ordering::Relaxed), 1);
    assert_eq!(s.backing.reads.load(Ordering::Relaxed), 0);
    // A holder that does not say is tried (an older release), as is every holder of a small
    // file, whose map is never asked.
    let s = cluster(
        Script::new(vec![Reply::Holders(vec![3])]),
        Peers::default(),
        Shared::default(),
    );
    assert_eq!(read_page(&s), Origin::Peer);
    assert_eq!(read_all(&s, "small").unwrap(), Origin::Peer);
    assert_eq!(s.locator.maps_asked.load(Ordering::Relaxed), 1);
}
