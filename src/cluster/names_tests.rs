//! The produced namespace's waits through members in one process (`locator::loopback`): a
//! reader waiting for a name is not told "no such file" before its deadline because its
//! directory's home failed to answer for a while.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::names::{CALLS_AT_ONCE, ClusterNames};
use crate::core::names::{Name, Namespace};
use crate::locator::loopback::{Fault, Net};
use crate::locator::membership::Membership;
use crate::locator::service::{Hooks, LocatorService};

const PEERS: &str = "0 127.0.0.1:1 a\n1 127.0.0.1:2 a\n";

/// Member `id`'s namespace on `net`.
fn member(net: &Arc<Net>, id: u32) -> Arc<ClusterNames> {
    let m = Membership::parse(PEERS, id).unwrap();
    let timeout = Duration::from_millis(300);
    let s = LocatorService::new(
        m,
        timeout,
        Default::default(),
        net.port(id),
        Hooks::default(),
    );
    net.join(&s);
    Arc::new(ClusterNames {
        locator: s,
        runtime: net.handle().clone(),
        failover_wait: Duration::from_millis(200),
        refresher: Default::default(),
        calls: tokio::sync::Semaphore::new(CALLS_AT_ONCE),
        registering: Default::default(),
    })
}

#[test]
fn a_wait_whose_home_did_not_answer_for_a_while_still_gets_its_name() {
    let net = Net::new();
    let (reader, home) = (member(&net, 0), member(&net, 1));
    let dir = (0..1000)
        .map(|i| format!("run{i}"))
        .find(|d| reader.locator.global_home(d) == 1)
        .unwrap();
    // The home refuses every call for a while (its process gone, or its connections full):
    // longer than a name question waits for a failover, and it is suspect at the reader after.
    net.fault(1, Some(Fault::Dead));
    let started = Instant::now();
    let waiting = std::thread::spawn({
        let (reader, dir) = (reader.clone(), dir.clone());
        move || reader.get(&dir, "f", Duration::from_secs(20))
    });
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        !waiting.is_finished(),
        "the reader gave up before its deadline"
    );
    net.fault(1, None);
    let name = Name {
        object: "//produced/1/a-1".into(),
        size: 3,
        mtime_ns: 1,
        mode: 0o644,
        holder: 1,
        ..Name::default()
    };
    home.set(&dir, "f", Some(name.clone())).unwrap();
    let got = waiting.join().unwrap().unwrap();
    assert_eq!(got.map(|n| n.object), Some(name.object));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken {:?} after it started waiting",
        started.elapsed()
    );
}

/// Waits that hold no thread (`Namespace::watch`), registered in one message with a home that
/// did not answer at first: each is woken by its own name, one published before its watch at
/// once, and none after its watch is dropped.
#[test]
fn watches_are_registered_together_and_woken_by_their_names() {
    let net = Net::new();
    let (reader, home) = (member(&net, 0), member(&net, 1));
    let dir = (0..1000)
        .map(|i| format!("run{i}"))
        .find(|d| reader.locator.global_home(d) == 1)
        .unwrap();
    let name = |i: u32| Name {
        object: format!("//produced/1/a-{i}"),
        size: 3,
        mtime_ns: 1,
        mode: 0o644,
        holder: 1,
        ..Name::default()
    };
    home.set(&dir, "f0", Some(name(0))).unwrap();
    net.fault(1, Some(Fault::Dead));
    let (tx, rx) = std::sync::mpsc::channel();
    let until = Instant::now() + Duration::from_secs(20);
    let watches: Vec<_> = (0..100)
        .map(|i| {
            let tx = tx.clone();
            let wake = Box::new(move |n: std::io::Result<Name>| tx.send((i, n.unwrap())).unwrap());
            reader
                .watch(&dir, &format!("f{i}"), until, wake)
                .ok()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        rx.try_recv().is_err(),
        "woken by a home that did not answer"
    );
    net.fault(1, None);
    let (i, n) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((i, n.object), (0, name(0).object), "published already");
    let mut watches = watches.into_iter().map(Some).collect::<Vec<_>>();
    watches[2] = None;
    // (Registered by now: the published name came with the registration's answer.)
    for i in 1..4 {
        home.set(&dir, &format!("f{i}"), Some(name(i))).unwrap();
    }
    let mut woken: Vec<_> = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap().0)
        .collect();
    woken.sort_unstable();
    assert_eq!(woken, [1, 3], "each by its own name, none once dropped");
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    drop(watches);
    assert_eq!(reader.locator.waiting.readers(), 0);
}
