//! `mount --metrics-listen HOST:PORT`: the daemon's counters as a Prometheus (OpenMetrics) text
//! endpoint at `/metrics`, encoded by the `prometheus-client` crate. Every `dyadfs stats` key
//! is a counter or a gauge named `dyadfs_<key>` with a `node` label, with the latency
//! histograms the daemon keeps as it works ([`Latencies`]). The node service's endpoint
//! labels the same keys by `dataset` instead ([`render_datasets`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::stats::{Latencies, Snapshot};

type Labels = Vec<(String, String)>;

/// Keys of `dyadfs stats` that are levels, not counts.
const GAUGES: [&str; 18] = [
    "cached_bytes",
    "cached_files",
    "cache_segments",
    "capacity_bytes",
    "inodes",
    "open_files",
    "members_down",
    "passthrough",
    "pid",
    "node_id",
    "node_rank",
    "members",
    "prefetch_pending",
    "home_rack_files",
    "home_global_files",
    "home_names",
    "partial_chunks",
    "kept_files",
];

/// The text a scrape returns.
pub fn render(snap: &Snapshot, latencies: &Latencies) -> String {
    let mut registry = Registry::with_prefix("dyadfs");
    let node: Labels = vec![("node".into(), snap.node_id.to_string())];
    register_keys(&mut registry, &[(node, snap)]);
    // The histograms carry the node's label too, as every counter does.
    let labelled =
        registry.sub_registry_with_label(("node".into(), snap.node_id.to_string().into()));
    labelled.register(
        "open_seconds",
        "latency of opens (FUSE open, including a fetch at open)",
        latencies.open.clone(),
    );
    labelled.register(
        "fill_seconds",
        "latency of chunk fills, by source",
        latencies.fill.clone(),
    );
    labelled.register(
        "lookup_seconds",
        "latency of locator lookups, by tier",
        latencies.lookup.clone(),
    );
    let mut out = String::new();
    encode(&mut out, &registry).expect("writing to a String");
    out
}

/// The text a scrape of the node service returns: every `dyadfs stats` key of each of its
/// datasets, labelled `dataset` with its key (no latency histograms: they are a mount's).
pub fn render_datasets(datasets: &[(String, Snapshot)]) -> String {
    let mut registry = Registry::with_prefix("dyadfs");
    let rows: Vec<(Labels, &Snapshot)> = datasets
        .iter()
        .map(|(key, snap)| (vec![("dataset".to_string(), key.clone())], snap))
        .collect();
    register_keys(&mut registry, &rows);
    let mut out = String::new();
    encode(&mut out, &registry).expect("writing to a String");
    out
}

/// Every key of the snapshots as a gauge or a counter family, a series per row's labels.
fn register_keys(registry: &mut Registry, rows: &[(Labels, &Snapshot)]) {
    let values: Vec<serde_json::Value> = rows
        .iter()
        .map(|(_, snap)| serde_json::to_value(snap).expect("a snapshot serializes"))
        .collect();
    let Some(first) = values.first().and_then(|v| v.as_object()) else {
        return;
    };
    let number = |v: &serde_json::Value| {
        v.as_u64()
            .or_else(|| v.as_bool().map(u64::from))
            .unwrap_or(0)
    };
    for key in first.keys() {
        let help = key.replace('_', " ");
        if GAUGES.contains(&key.as_str()) {
            let g = Family::<Labels, Gauge>::default();
            for ((labels, _), v) in rows.iter().zip(&values) {
                g.get_or_create(labels).set(number(&v[key]) as i64);
            }
            registry.register(key, help, g);
        } else {
            let c = Family::<Labels, Counter>::default();
            for ((labels, _), v) in rows.iter().zip(&values) {
                c.get_or_create(labels).inc_by(number(&v[key]));
            }
            registry.register(key, help, c);
        }
    }
}

/// Scrapes served at once; a connection past them is closed as soon as it is accepted.
pub const MAX_CONNECTIONS: usize = 16;
/// The whole request head must arrive within this (not each read: a client sending a byte at a
/// time would otherwise hold its thread forever), and the answer must leave within it again.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(3);
/// The most of a request head read; the rest is not looked at.
const MAX_HEAD: usize = 8192;

/// Serves `/metrics` on `addr` from a thread of its own that answers each connection on a
/// thread of its own, at most [`MAX_CONNECTIONS`] at once; returns once listening.
pub fn serve(
    addr: SocketAddr,
    scrape: impl Fn() -> String + Send + Sync + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let scrape = Arc::new(scrape);
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(s) => admit(s, &active, &scrape),
                    // Out of descriptors, say: the next scrape tries again.
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics accept failed");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })?;
    Ok(local)
}

/// Answers `s` on a thread of its own if fewer than [`MAX_CONNECTIONS`] are being answered;
/// closes it otherwise.
fn admit<F: Fn() -> String + Send + Sync + 'static>(
    s: TcpStream,
    active: &Arc<AtomicUsize>,
    scrape: &Arc<F>,
) {
    if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
        active.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!("metrics connection refused: {MAX_CONNECTIONS} being answered");
        return;
    }
    /// Gives the connection's place back however its thread ends.
    struct Slot(Arc<AtomicUsize>);
    impl Drop for Slot {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let (slot, scrape) = (Slot(active.clone()), scrape.clone());
    let spawned = std::thread::Builder::new()
        .name("metrics-conn".into())
        .spawn(move || {
            let _slot = slot;
            if let Err(e) = answer(s, &*scrape) {
                tracing::debug!(error = %e, "metrics request failed");
            }
        });
    // (The slot went with the closure and is dropped with it.)
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a thread to answer a metrics request");
    }
}

/// One HTTP/1.x request: `GET /metrics` is answered, `HEAD /metrics` with the headers alone,
/// anything else is a 404. The request is read up to its blank line (at most 8 KiB), all of it
/// within [`REQUEST_DEADLINE`]; past it the connection is closed.
fn answer(mut s: TcpStream, scrape: &impl Fn() -> String) -> std::io::Result<()> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < MAX_HEAD {
        s.set_read_timeout(Some(left(deadline)?))?;
        match s.read(&mut buf)? {
            0 => break,
            n => req.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(req.split(|&b| b == b'\r').next().unwrap_or(&[]));
    let mut words = line.split(' ');
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let known = path == "/metrics" || path == "/";
    let (status, body) = match method {
        "GET" | "HEAD" if known => ("200 OK", scrape()),
        _ => ("404 Not Found", "only /metrics here\n".to_string()),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/openmetrics-text; version=1.0.0; \
         charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        out += &body;
    }
    // The answer leaves within a deadline of its own: a client that does not read holds its
    // thread no longer than one that does not write.
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut out = out.as_bytes();
    while !out.is_empty() {
        s.set_write_timeout(Some(left(deadline)?))?;
        match s.write(out)? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => out = &out[n..],
        }
    }
    Ok(())
}

/// The time left until `deadline` (an error once it is past: a zero timeout means none).
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "request deadline passed",
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stats_key_is_exported_with_the_node_label() {
        let stats = crate::stats::Stats::default();
        stats
            .bytes_from_peers
            .fetch_add(42, std::sync::atomic::Ordering::Relaxed);
        let snap = stats.snapshot(crate::stats::Gauges {
            cached_bytes: 7,
            cached_files: 1,
            cache_segments: 1,
            capacity_bytes: 100,
            inodes: 2,
            open_files: 0,
            prefetch_pending: 0,
            kept_files: 2,
            partial_chunks: 3,
        });
        stats.latency.fill("peer", std::time::Instant::now());
        // The series taken once at the start and one made when first observed both export.
        stats.latency.lookup("global", std::time::Instant::now());
        stats.latency.lookup("global", std::time::Instant::now());
        stats.latency.lookup("elsewhere", std::time::Instant::now());
        let text = render(&snap, &stats.latency);
        for series in [
            "dyadfs_lookup_seconds_count{node=\"0\",tier=\"global\"} 2",
            "dyadfs_lookup_seconds_count{node=\"0\",tier=\"elsewhere\"} 1",
            "dyadfs_lookup_seconds_count{node=\"0\",tier=\"rack\"} 0",
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
        assert!(
            text.contains("dyadfs_bytes_from_peers_total{node=\"0\"} 42"),
            "{text}"
        );
        assert!(text.contains("dyadfs_cached_bytes{node=\"0\"} 7"), "{text}");
        // Levels are gauges (a counter must never go down).
        for level in ["kept_files", "partial_chunks"] {
            assert!(
                text.contains(&format!("# TYPE dyadfs_{level} gauge")),
                "{text}"
            );
        }
        assert!(
            text.lines()
                .filter(|l| l.starts_with("dyadfs_fill_seconds_count"))
                .all(|l| l.contains("node=\"0\"")),
            "{text}"
        );
        assert!(
            text.contains("dyadfs_fill_seconds_count{node=\"0\",source=\"peer\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn ask(addr: SocketAddr, request: &str) -> String {
        let mut s = connect(addr);
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// Whether the server closed `s` (end of file or a reset) within `within`.
    fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
        s.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) => {
                    return !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    );
                }
            }
        }
    }

    #[test]
    fn get_and_head_answer_and_other_paths_are_not_found() {
        let addr = serve("127.0.0.1:0".parse().unwrap(), || "body\n".into()).unwrap();
        let get = ask(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(get.starts_with("HTTP/1.1 200 OK\r\n"), "{get}");
        assert!(get.ends_with("Content-Length: 5\r\nConnection: close\r\n\r\nbody\n"));
        let head = ask(addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.ends_with("Content-Length: 5\r\nConnection: close\r\n\r\n"));
        let other = ask(addr, "GET /other HTTP/1.1\r\n\r\n");
        assert!(other.starts_with("HTTP/1.1 404 Not Found"), "{other}");
        let post = ask(addr, "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 404 Not Found"), "{post}");
    }

    /// A client sending its request a byte at a time is closed at the request deadline, and
    /// scrapes are answered meanwhile.
    #[test]
    fn a_slow_client_is_closed_at_the_deadline_and_holds_nobody_up() {
        let addr = serve("127.0.0.1:0".parse().unwrap(), || "body\n".into()).unwrap();
        let mut slow = connect(addr);
        let start = Instant::now();
        let mut writer = slow.try_clone().unwrap();
        std::thread::spawn(move || {
            for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" {
                if writer.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        let t = Instant::now();
        let got = ask(addr, "GET /metrics HTTP/1.1\r\n\r\n");
        assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert!(closed_within(
            &mut slow,
            REQUEST_DEADLINE + Duration::from_secs(2)
        ));
        let took = start.elapsed();
        assert!(
            took >= REQUEST_DEADLINE - Duration::from_millis(100),
            "{took:?}"
        );
        assert!(took < REQUEST_DEADLINE + Duration::from_secs(1), "{took:?}");
    }

    /// Past [`MAX_CONNECTIONS`] at once a connection is closed as soon as it is accepted; the
    /// places come back when those connections end.
    #[test]
    fn connections_past_the_bound_are_closed_at_once() {
        let addr = serve("127.0.0.1:0".parse().unwrap(), || "body\n".into()).unwrap();
        let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS).map(|_| connect(addr)).collect();
        // (Accepted in order: the extra one comes after all of them, which wait for a request
        // for the deadline.)
        let mut extra = connect(addr);
        let t = Instant::now();
        assert!(closed_within(&mut extra, Duration::from_secs(2)));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        drop(idle);
        wait_for_a_place(addr);
    }

    /// Scrapes until one is answered (the closed connections' threads end within a moment).
    fn wait_for_a_place(addr: SocketAddr) {
        let t = Instant::now();
        loop {
            let mut s = connect(addr);
            let mut out = String::new();
            let sent = s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").is_ok();
            if sent && s.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.1 200") {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no place came back");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
