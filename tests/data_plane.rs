//! Nobody without the job key reads, writes or crashes a daemon through its data plane. Real
//! daemons on 127.0.0.1 (UCX over tcp, where UCX emulates RMA in software and its handlers read
//! and write any address), attacked by real clients: a keyless UCX client aimed at every TCP
//! port any dyadfs process listens on, a relay without the key that rewrites frames in flight,
//! and a flood of strangers' sockets.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::attack::*;
use common::*;

/// Node `i`'s control port, from the cluster's peers file.
fn control_port(c: &Cluster, i: usize) -> u16 {
    c.addr(i).port()
}

/// The job secret's text, as the daemons hold it in memory.
fn secret_text(c: &Cluster) -> Vec<u8> {
    fs::read_to_string(&c.secret)
        .unwrap()
        .trim()
        .as_bytes()
        .to_vec()
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// A field of /proc/PID/status (its first value).
fn status_field(pid: u32, field: &str) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next().map(str::to_string))
}

fn rss_kib(pid: u32) -> u64 {
    status_field(pid, "VmRSS:").unwrap().parse().unwrap()
}

/// The data-plane processes a daemon runs (main first, then the background one).
fn data_planes(pid: u32) -> Vec<u32> {
    let mut kids: Vec<(bool, u32)> = child_pids(pid)
        .into_iter()
        .filter_map(|k| {
            let cmd = fs::read(format!("/proc/{k}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains("data-plane")
                .then_some((cmd.contains("--background"), k))
        })
        .collect();
    kids.sort();
    kids.into_iter().map(|(_, k)| k).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Waits until `f` holds (at most `t`).
fn eventually(t: Duration, what: &str, f: impl FnMut() -> bool) {
    wait_until(what, t, f);
}

/// Writes `name` to the shared FS, has node `holder` read it (so it holds it), and checks
/// that node `reader` reads it byte-exact; returns what the reader got from peers for it.
fn hand_over(c: &Cluster, name: &str, seed: u64, holder: usize, reader: usize) -> u64 {
    let data = pattern(4 * MIB, seed);
    fs::write(c.backing.join(name), &data).unwrap();
    let homes = c.total("home_global_files");
    assert!(fs::read(c.nodes[holder].path(name)).unwrap() == data);
    // Publishes are batched: the reader finds the holder once the file's home knows it.
    eventually(Duration::from_secs(10), "the publish", || {
        c.total("home_global_files") > homes
    });
    let before = c.nodes[reader].stat("bytes_from_peers");
    assert!(
        fs::read(c.nodes[reader].path(name)).unwrap() == data,
        "{name} read wrong on node {reader}"
    );
    c.nodes[reader].stat("bytes_from_peers") - before
}

/// With the default configuration on tcp no dyadfs process listens with UCX at all: the only
/// port is the control port, which a UCX client cannot speak to. The keyless client aimed at
/// every port gets nothing: no byte of the heap or of the job secret, no put, no crash.
#[test]
fn by_default_a_keyless_ucx_client_reads_writes_and_crashes_nothing() {
    let mut c = Cluster::new("keyless", 2);
    c.start(2);
    assert_eq!(
        hand_over(&c, "x", 1, 0, 1),
        4 * MIB as u64,
        "pulled from node 0"
    );
    let client = build_attack_client();
    let secret = secret_text(&c);
    for (i, node) in c.nodes.iter().enumerate() {
        let pid = node.pid;
        let at = find_in_memory(pid, &secret).expect("the daemon holds the job secret");
        let (heap, _) = heap_range(pid).expect("a heap");
        assert_eq!(
            process_tree(pid),
            vec![pid],
            "no data-plane process by default"
        );
        let ports = tree_listen_ports(pid);
        assert_eq!(
            ports,
            vec![control_port(&c, i)],
            "only the control port listens"
        );
        for port in ports {
            let r = attack(
                &client,
                port,
                &[(at, secret.len()), (heap, 64), (0x1000, 8)],
                &[(heap + 4096, b"ATTACK-PUT".to_vec())],
            );
            assert!(r.refused(), "port {port}: {}", r.raw);
            assert!(!r.raw.contains(&hex(&secret)), "{}", r.raw);
        }
        assert!(alive(pid), "node {i} died");
        assert_eq!(find_in_memory(pid, b"ATTACK-PUT"), None, "a put landed");
    }
    // Both still serve each other.
    assert_eq!(hand_over(&c, "y", 2, 1, 0), 4 * MIB as u64);
}

/// With UCX opted in (`--data-plane ucx`), UCX listens only in the data-plane processes:
/// unprivileged, without the secret. What the keyless client reaches there holds no secret; a
/// get at an unmapped address kills that process only, reads go on meanwhile, and it is
/// restarted and moves bytes again.
#[test]
fn with_ucx_only_the_unprivileged_data_plane_is_reachable_and_it_comes_back() {
    let mut c = Cluster::new("ucx", 2);
    c.extra = ["--data-plane", "ucx", "--ucx-over-tcp", "--eager-max", "0"]
        .map(String::from)
        .to_vec();
    c.start(2);
    assert_eq!(hand_over(&c, "x", 1, 0, 1), 4 * MIB as u64, "pulled by RMA");
    let client = build_attack_client();
    let secret = secret_text(&c);
    let pid = c.nodes[0].pid;
    let at = find_in_memory(pid, &secret).expect("the daemon holds the job secret");
    assert_eq!(tcp_listen_ports(pid), vec![control_port(&c, 0)]);
    let planes = data_planes(pid);
    assert_eq!(
        planes.len(),
        2,
        "a main and a background data-plane process"
    );
    for &p in &planes {
        assert_eq!(
            status_field(p, "Uid:").as_deref(),
            Some("65534"),
            "runs as nobody"
        );
        assert_eq!(status_field(p, "NoNewPrivs:").as_deref(), Some("1"));
        assert_eq!(
            find_in_memory(p, &secret),
            None,
            "no secret in the data plane"
        );
        let ports = tcp_listen_ports(p);
        assert!(!ports.is_empty(), "UCX listens in the data-plane process");
        // What the client reaches there is that process's own memory: no secret in it.
        let (heap, end) = heap_range(p).expect("a heap");
        let r = attack(
            &client,
            ports[0],
            &[(heap, (end - heap).min(1 << 20) as usize)],
            &[],
        );
        assert!(r.connected, "the keyless client reaches UCX: {}", r.raw);
        assert!(!r.raw.contains(&hex(&secret)), "{}", r.raw);
    }
    // Aimed at where the secret sits in the daemon: that address means nothing in the data
    // plane (at best unmapped: the process dies); then at 0x1000, which kills it for sure.
    let main = planes[0];
    let port = tcp_listen_ports(main)[0];
    let r = attack(&client, port, &[(at, secret.len()), (0x1000, 8)], &[]);
    // The daemon's address may be mapped in the data plane too (other bytes there: CI once
    // read 64 bytes of code): never the secret, and 0x1000 is never mapped.
    assert!(!r.raw.contains(&hex(&secret)), "{}", r.raw);
    if let Some(bytes) = &r.gets[0] {
        assert_ne!(&bytes[..], &secret[..], "{}", r.raw);
    }
    assert!(r.gets.get(1).is_none_or(Option::is_none), "{}", r.raw);
    eventually(Duration::from_secs(10), "the data plane dies", || {
        !data_planes(pid).contains(&main)
    });
    assert!(alive(pid), "the daemon lives on");
    // Reads on the other node go on (from the holder once it is back, or the shared FS).
    for (i, name) in ["y1", "y2", "y3"].into_iter().enumerate() {
        hand_over(&c, name, 10 + i as u64, 0, 1);
    }
    eventually(Duration::from_secs(10), "a new data plane", || {
        data_planes(pid).len() == 2
    });
    assert!(!data_planes(pid).contains(&main));
    // And UCX moves bytes again.
    assert_eq!(
        hand_over(&c, "z", 20, 0, 1),
        4 * MIB as u64,
        "pulled after the restart"
    );
    assert!(is_mounted(&c.nodes[0].mnt) && is_mounted(&c.nodes[1].mnt));
}

/// Copies bytes one way until either side closes; while `tamper` is set, one byte of every
/// read is flipped, as an on-path writer without the key would.
fn pump(mut from: TcpStream, mut to: TcpStream, tamper: Arc<AtomicBool>, n: Arc<AtomicUsize>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let got = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(got) => got,
        };
        if tamper.load(Ordering::Relaxed) {
            buf[got / 2] ^= 0x01;
            n.fetch_add(1, Ordering::Relaxed);
        }
        if to.write_all(&buf[..got]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// A relay at `listen` for the node at `to`: TCP connections are forwarded (and their frames
/// tampered with while `tamper` is set), UDP datagrams (gossip) passed on as they are.
fn relay(listen: SocketAddr, to: SocketAddr, tamper: Arc<AtomicBool>) -> Arc<AtomicUsize> {
    let tampered = Arc::new(AtomicUsize::new(0));
    let l = TcpListener::bind(listen).unwrap();
    let t = tampered.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(client) = s else { continue };
            let Ok(server) = TcpStream::connect(to) else {
                continue;
            };
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (t1, t2) = (t.clone(), t.clone());
            let (on1, on2) = (tamper.clone(), tamper.clone());
            std::thread::spawn(move || pump(client, server, on1, t1));
            std::thread::spawn(move || pump(s2, c2, on2, t2));
        }
    });
    let u = UdpSocket::bind(listen).unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, _)) = u.recv_from(&mut buf) {
            let _ = u.send_to(&buf[..n], to);
        }
    });
    tampered
}

/// A relay on node 0's address in node 1's peers file, without the key: passing bytes on, it
/// lets the nodes work; changing bytes in flight (either way, on connections old and new) makes
/// the receiver drop the connection, and node 1 reads from the shared FS instead. Nothing
/// tampered is ever taken, and nobody crashes.
#[test]
fn a_relay_without_the_key_can_change_nothing() {
    let mut c = Cluster::new("relay", 2);
    let real = c.peers.clone();
    let relay_addr = SocketAddr::from(([127, 0, 0, 1], free_ports(1)[0]));
    let text = fs::read_to_string(&real).unwrap();
    let relayed = c.root.join("peers-relayed");
    fs::write(
        &relayed,
        text.replacen(&peer_addr(&real, 0).to_string(), &relay_addr.to_string(), 1),
    )
    .unwrap();
    let tamper = Arc::new(AtomicBool::new(false));
    let tampered = relay(relay_addr, peer_addr(&real, 0), tamper.clone());
    c.start_node(0);
    c.peers = relayed;
    c.start_node(1);
    c.peers = real;
    assert_eq!(
        hand_over(&c, "x", 1, 0, 1),
        4 * MIB as u64,
        "through the relay"
    );
    tamper.store(true, Ordering::Relaxed);
    for (i, name) in ["y1", "y2", "y3"].into_iter().enumerate() {
        assert_eq!(hand_over(&c, name, 10 + i as u64, 0, 1), 0, "{name}");
    }
    assert!(
        tampered.load(Ordering::Relaxed) > 0,
        "the relay changed frames"
    );
    assert!(alive(c.nodes[0].pid) && alive(c.nodes[1].pid));
    tamper.store(false, Ordering::Relaxed);
    // Untouched again, new connections work again (after the first failures, node 1 may try
    // the shared FS for a while; the bytes are right either way).
    hand_over(&c, "z", 20, 0, 1);
}

fn raise_nofile(n: u64) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setting this process's own descriptor limit (root may raise the hard one).
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

/// 5,000 strangers' sockets on a node's control port, half of them silent, half announcing a
/// maximal frame and sending part of it: the node's memory grows by at most 64 MiB, and the
/// other node's reads of files only this node holds all succeed meanwhile, each within its
/// timeout (from the holder, or the shared FS when a handshake was pushed out).
#[test]
fn a_flood_of_strangers_costs_bounded_memory_and_fails_no_read() {
    let mut c = Cluster::new("flood", 2);
    c.start(2);
    // Warm up node 0's serving path (threads, slab pages) before the baseline.
    for i in 0..4 {
        hand_over(&c, &format!("warm{i}"), i, 0, 1);
    }
    let names: Vec<String> = (0..8).map(|i| format!("f{i}")).collect();
    let files: Vec<Vec<u8>> = (0..8).map(|i| pattern(4 * MIB, 100 + i)).collect();
    for (n, d) in names.iter().zip(&files) {
        fs::write(c.backing.join(n), d).unwrap();
        assert!(fs::read(c.nodes[0].path(n)).unwrap() == *d);
    }
    let pid = c.nodes[0].pid;
    let before = rss_kib(pid);
    raise_nofile(20_000);
    let target = c.addr(0);
    let mut held = Vec::new();
    for i in 0..5000 {
        let Ok(mut s) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else {
            continue;
        };
        if i % 2 == 1 {
            // A frame of 16 MiB announced, and its first 64 KiB.
            let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = s.write_all(&(16u32 << 20).to_be_bytes());
            let _ = s.write_all(&[0x81; 64 << 10]);
        }
        held.push(s);
    }
    assert!(held.len() > 4000, "only {} sockets opened", held.len());
    let mut peak = rss_kib(pid);
    for (n, d) in names.iter().zip(&files) {
        let t = Instant::now();
        assert!(fs::read(c.nodes[1].path(n)).unwrap() == *d, "{n}");
        // Within one --peer-timeout (2 s) per wait a read may make, with room for the VM.
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{n}: {:?}",
            t.elapsed()
        );
        peak = peak.max(rss_kib(pid));
    }
    let grew = peak.saturating_sub(before);
    eprintln!(
        "flood: {} sockets, RSS {before} -> {peak} KiB (+{grew} KiB)",
        held.len()
    );
    assert!(grew <= 64 << 10, "RSS grew by {grew} KiB");
    drop(held);
    assert!(alive(pid));
    assert_eq!(hand_over(&c, "after", 7, 0, 1), 4 * MIB as u64);
}

/// The 8 bytes to write over the start of `chunk` so that its first 4 bytes become `head` and
/// its crc32c stays what it was: crc32c is affine in the bytes, so the next 4 are solved for
/// (Gaussian elimination over GF(2)). What a keyless attacker does to a chunk checked by crc
/// alone.
fn crc_preserving_forgery(chunk: &[u8], head: [u8; 4]) -> [u8; 8] {
    let crc_with = |first: [u8; 8]| {
        let mut c = chunk.to_vec();
        c[..8].copy_from_slice(&first);
        crc32c::crc32c(&c)
    };
    let mut start = [0u8; 8];
    start[..4].copy_from_slice(&head);
    let (zero, target) = (crc_with(start), crc32c::crc32c(chunk));
    // Each bit of bytes 4..8 flips the crc by a fixed vector: a basis of them, by top bit.
    let mut basis: [Option<(u32, u32)>; 32] = [None; 32];
    for j in 0..32 {
        let mut x = start;
        x[4 + j / 8] ^= 1 << (j % 8);
        let (mut v, mut combo) = (crc_with(x) ^ zero, 1u32 << j);
        while v != 0 {
            let top = 31 - v.leading_zeros() as usize;
            match basis[top] {
                Some((bv, bc)) => {
                    v ^= bv;
                    combo ^= bc;
                }
                None => {
                    basis[top] = Some((v, combo));
                    break;
                }
            }
        }
    }
    let (mut want, mut combo) = (target ^ zero, 0u32);
    while want != 0 {
        let top = 31 - want.leading_zeros() as usize;
        let (bv, bc) = basis[top].expect("4 bytes reach every crc");
        want ^= bv;
        combo ^= bc;
    }
    let mut out = start;
    out[4..].copy_from_slice(&combo.to_le_bytes());
    out
}

/// A keyless client that reaches a holder's data-plane process over UCX's tcp writes into the
/// chunk staged there for a puller, keeping its crc32c (the puller's data plane is stopped
/// meanwhile, so the staged chunk waits in the slab). What it reads there is no file's bytes,
/// and what it wrote is dropped: the puller's file reads byte-exact, the forgery is counted,
/// and the copy cached on the puller stays exact after the page cache is dropped. Before the
/// staged chunks were sealed, the forged bytes were served and cached (crc32c is not a MAC).
#[test]
fn a_keyless_client_cannot_forge_a_staged_chunk() {
    let mut c = Cluster::new("forge", 2);
    c.extra = ["--data-plane", "ucx", "--ucx-over-tcp", "--eager-max", "0"]
        .map(String::from)
        .to_vec();
    // Room for the holder to stage a chunk while the whole test suite loads the machine (it
    // once took longer than 1.5 s), and for the puller's gets to wait out the forgery.
    c.peer_timeout = "6s";
    c.start(2);
    // A first pull connects node 1 to node 0 (control stream and UCX endpoint), so the one
    // below needs nothing of node 1's data plane but its gets.
    assert_eq!(hand_over(&c, "warm", 40, 0, 1), 4 * MIB as u64);
    let chunk = 2 * MIB;
    let data = pattern(2 * chunk, 41);
    fs::write(c.backing.join("x"), &data).unwrap();
    let homes = c.total("home_global_files");
    assert!(fs::read(c.nodes[0].path("x")).unwrap() == data);
    eventually(Duration::from_secs(10), "the publish", || {
        c.total("home_global_files") > homes
    });
    let client = build_attack_client();
    let holder = data_planes(c.nodes[0].pid)[0];
    let puller = data_planes(c.nodes[1].pid)[0];
    let slab = maps(holder)
        .into_iter()
        .find(|m| m.path.contains("dyadfs-slab"))
        .expect("the holder's data plane maps the shared slab");
    let port = tcp_listen_ports(holder)[0];
    let slots = (slab.end - slab.start) as usize / chunk;
    let head = |at: usize| read_memory(holder, slab.start + (at * chunk) as u64, 64);
    // The slab as it is before the pull starts: taken after it, a chunk staged meanwhile
    // (quickly, on a quiet machine) was part of the baseline and never seen as staged.
    let before: Vec<_> = (0..slots).map(head).collect();
    let staged = |at: usize| head(at) != before[at];
    // The puller's gets wait while its data plane is stopped (within the 6 s peer timeout).
    // SAFETY: stopping and resuming a process this test's cluster started.
    assert_eq!(unsafe { libc::kill(puller as i32, libc::SIGSTOP) }, 0);
    let reader = {
        let p = c.nodes[1].path("x");
        std::thread::spawn(move || fs::read(p).unwrap())
    };
    let t = Instant::now();
    let mut found = Vec::new();
    while found.is_empty() && t.elapsed() < Duration::from_millis(4000) {
        found = (0..slots).filter(|&i| staged(i)).collect();
    }
    let mut forged = 0;
    for &i in &found {
        let addr = slab.start + (i * chunk) as u64;
        let r = attack(&client, port, &[(addr, 64 << 10)], &[]);
        let Some(Some(seen)) = r.gets.first().cloned() else {
            panic!("the keyless get failed: {}", r.raw);
        };
        assert!(
            !data.chunks(chunk).any(|d| d[..64] == seen[..64]),
            "a file's bytes are readable in the shared slab"
        );
        // The whole staged chunk (the attacker gets it in pieces; read here in one).
        let whole = read_memory(holder, addr, chunk).unwrap();
        let bytes = crc_preserving_forgery(&whole, *b"EVIL");
        let r = attack(&client, port, &[], &[(addr, bytes.to_vec())]);
        if r.puts == [true] {
            forged += 1;
        }
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(puller as i32, libc::SIGCONT) }, 0);
    let got = reader.join().unwrap();
    assert!(
        forged > 0,
        "no staged chunk was found to forge ({found:?}); the puller read {} bytes from peers, {} \
         from the shared FS",
        c.nodes[1].stat("bytes_from_peers"),
        c.nodes[1].stat("bytes_from_backing")
    );
    assert!(got == data, "the puller served forged bytes");
    assert!(c.nodes[1].stat("forged_chunks") >= 1);
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert!(fs::read(c.nodes[1].path("x")).unwrap() == data);
}

/// UCX over tcp exposes the data-plane process to anyone who reaches its port: a mount that
/// asks for UCX where it would go over tcp is refused with one line naming the flag that
/// accepts it, and `auto` there moves no chunk by UCX (no data-plane process at all).
#[test]
fn ucx_over_tcp_must_be_acknowledged_and_auto_never_takes_it() {
    let mut c = Cluster::new("tcpack", 2);
    c.extra = ["--data-plane", "ucx"].map(String::from).to_vec();
    let out = c.mount_cmd(0).output().unwrap();
    refused_in_one_line(&out, &c.root.join("m0"), &["--ucx-over-tcp", "tcp"]);
    c.extra = ["--data-plane", "auto"].map(String::from).to_vec();
    c.start(2);
    for m in &c.nodes {
        assert_eq!(data_planes(m.pid), Vec::<u32>::new(), "auto started UCX");
    }
    assert_eq!(hand_over(&c, "x", 3, 0, 1), 4 * MIB as u64);
}

/// Whether process `pid` has a UCX library mapped.
fn maps_ucx(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .any(|l| l.contains("libucp") || l.contains("libucs"))
}

/// The binary links no UCX: a default mount's daemon maps none. Where no UCX library can be
/// loaded, `--data-plane ucx` is refused with one line saying where it looked, while default
/// mounts with the same environment move files as before; where one can, the UCX data plane
/// loads it and moves a file by it.
#[test]
fn ucx_is_loaded_only_for_a_ucx_data_plane_and_its_absence_is_one_line() {
    let mut c = Cluster::new("noucx", 2);
    let missing = "/nonexistent/dyadfs-test/libucp.so.0";
    c.extra = ["--data-plane", "ucx", "--ucx-over-tcp"]
        .map(String::from)
        .to_vec();
    let out = c
        .mount_cmd(0)
        .env("DYADFS_UCX_LIB", missing)
        .output()
        .unwrap();
    refused_in_one_line(
        &out,
        &c.root.join("m0"),
        &["--data-plane ucx", missing, "UCX_DIR"],
    );
    c.extra.clear();
    for i in 0..2 {
        let out = c
            .mount_cmd(i)
            .env("DYADFS_UCX_LIB", missing)
            .output()
            .unwrap();
        c.nodes.push(mounted_at(&c.root.join(format!("m{i}")), out));
    }
    assert_eq!(hand_over(&c, "x", 5, 0, 1), 4 * MIB as u64);
    for m in &c.nodes {
        assert!(!maps_ucx(m.pid), "a stream data plane's daemon mapped UCX");
    }
    drop(c);
    // The project's UCX (the build's): loaded by the data-plane process, bytes moved by it.
    let mut c = Cluster::new("ucxload", 2);
    c.extra = ["--data-plane", "ucx", "--ucx-over-tcp"]
        .map(String::from)
        .to_vec();
    c.start(2);
    assert_eq!(hand_over(&c, "y", 6, 0, 1), 4 * MIB as u64);
    let planes = data_planes(c.nodes[1].pid);
    assert!(!planes.is_empty(), "no UCX data-plane process");
    assert!(maps_ucx(planes[0]), "the UCX data plane mapped no UCX");
}
