//! `mount --metrics-listen HOST:PORT`: the daemon's counters as a Prometheus (OpenMetrics) text
//! endpoint at `/metrics`, encoded by the `prometheus-client` crate. Every `dyadfs stats` key
//! is a counter or a gauge named `dyadfs_<key>` with a `node` label, with the latency
//! histograms the daemon keeps as it works ([`Latencies`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::stats::{Latencies, Snapshot};

type Labels = Vec<(String, String)>;

/// Keys of `dyadfs stats` that are levels, not counts.
const GAUGES: [&str; 15] = [
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
];

/// The text a scrape returns.
pub fn render(snap: &Snapshot, latencies: &Latencies) -> String {
    let mut registry = Registry::with_prefix("dyadfs");
    let node: Labels = vec![("node".into(), snap.node_id.to_string())];
    let value = serde_json::to_value(snap).expect("a snapshot serializes");
    for (key, v) in value.as_object().expect("an object") {
        let n = v
            .as_u64()
            .or_else(|| v.as_bool().map(u64::from))
            .unwrap_or(0);
        if GAUGES.contains(&key.as_str()) {
            let g = Family::<Labels, Gauge>::default();
            g.get_or_create(&node).set(n as i64);
            registry.register(key, key.replace('_', " "), g);
        } else {
            let c = Family::<Labels, Counter>::default();
            c.get_or_create(&node).inc_by(n);
            registry.register(key, key.replace('_', " "), c);
        }
    }
    registry.register(
        "open_seconds",
        "latency of opens (FUSE open, including a fetch at open)",
        latencies.open.clone(),
    );
    registry.register(
        "fill_seconds",
        "latency of chunk fills, by source",
        latencies.fill.clone(),
    );
    registry.register(
        "lookup_seconds",
        "latency of locator lookups, by tier",
        latencies.lookup.clone(),
    );
    let mut out = String::new();
    encode(&mut out, &registry).expect("writing to a String");
    out
}

/// Serves `/metrics` on `addr` from a thread of its own, one connection at a time (a scraper's
/// pace); returns once listening.
pub fn serve(
    addr: SocketAddr,
    scrape: impl Fn() -> String + Send + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(s) => {
                        if let Err(e) = answer(s, &scrape) {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    }
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

/// One HTTP/1.x request: `GET /metrics` is answered, anything else is a 404. The request is
/// read up to its blank line (at most 8 KiB, within 2 s).
fn answer(mut s: TcpStream, scrape: &impl Fn() -> String) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        match s.read(&mut buf)? {
            0 => break,
            n => req.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(req.split(|&b| b == b'\r').next().unwrap_or(&[]));
    let path = line.split(' ').nth(1).unwrap_or("");
    let (status, body) = if line.starts_with("GET ") && (path == "/metrics" || path == "/") {
        ("200 OK", scrape())
    } else {
        ("404 Not Found", "only /metrics here\n".to_string())
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: application/openmetrics-text; version=1.0.0; \
         charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
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
        });
        stats.latency.fill("peer", std::time::Instant::now());
        let text = render(&snap, &stats.latency);
        assert!(
            text.contains("dyadfs_bytes_from_peers_total{node=\"0\"} 42"),
            "{text}"
        );
        assert!(text.contains("dyadfs_cached_bytes{node=\"0\"} 7"), "{text}");
        assert!(
            text.contains("dyadfs_fill_seconds_count{source=\"peer\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
