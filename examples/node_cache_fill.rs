//! Fills one dataset's cache of a stopped node service with many small files through the
//! cache's own fill path (entries, packed segments, the header log, as a fill from the shared
//! FS writes them), so that `scripts/bench_node_restart.sh` can time a restart with 14 million
//! files cached without reading them all through FUSE first (a million took 191 s that way).
//! The files are `d<i % DIRS>/<i>.bin` for i in FROM..N, 1-4 KiB each, their bytes made from
//! their names (no shared FS holds them: a benchmark's fixture, never served to a reader).
//! Files already cached are left as they are. The cache's capacity is CAPACITY bytes (the
//! service's `--capacity`; a smaller one at the service's start would evict).
//! Usage: node_cache_fill DATASET_CACHE_DIR FROM N DIRS CAPACITY

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use dyadfs::cache::{Cache, CacheConfig, MAX_PARTIAL_CHUNKS};
use dyadfs::core::Version;
use dyadfs::core::source::{Origin, Source};
use dyadfs::fill::Reader;
use dyadfs::stats::Stats;

/// Files handed to one batch fill.
const BATCH: u64 = 512;

/// The made-up file `i`: its path and version.
fn file(i: u64, dirs: u64) -> (String, Version) {
    let size = 1024 + (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % 3073;
    let version = Version { size, mtime_ns: 1 };
    (format!("d{}/{i}.bin", i % dirs), version)
}

/// Bytes made from a file's name.
struct Made;

impl Source for Made {
    fn read_at(&self, path: &str, _: Version, offset: u64, buf: &mut [u8]) -> io::Result<Origin> {
        let seed = path
            .bytes()
            .fold(offset, |h, b| h.rotate_left(5) ^ u64::from(b));
        for (k, byte) in buf.iter_mut().enumerate() {
            *byte = (seed.wrapping_add(k as u64 * 31) >> 3) as u8;
        }
        Ok(Origin::Backing)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 6 {
        eprintln!("usage: node_cache_fill DATASET_CACHE_DIR FROM N DIRS CAPACITY");
        std::process::exit(2);
    }
    let number = |i: usize| -> u64 { args[i].parse().expect("a number") };
    let (from, n, dirs, capacity) = (number(2), number(3), number(4), number(5));
    // The node service's defaults: 2 MiB chunks, samples up to 1 MiB packed.
    let config = CacheConfig {
        dir: args[1].clone().into(),
        chunk_size: 2 << 20,
        capacity: Some(capacity),
        open_files: 256,
        pack_max: 1 << 20,
        max_partial_chunks: MAX_PARTIAL_CHUNKS,
    };
    let stats = Arc::new(Stats::default());
    let cache = Arc::new(Cache::open(&config, stats.clone()).expect("the dataset's cache"));
    let reader = Reader {
        cache,
        stats,
        source: Arc::new(Made),
    };
    let next = AtomicU64::new(from);
    let done = AtomicU64::new(0);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..std::thread::available_parallelism().map_or(2, |p| p.get()) {
            s.spawn(|| {
                loop {
                    let start = next.fetch_add(BATCH, Ordering::Relaxed);
                    if start >= n {
                        return;
                    }
                    let entries: Vec<_> = (start..(start + BATCH).min(n))
                        .map(|i| {
                            let (path, version) = file(i, dirs);
                            reader.cache.entry(&path, version).expect("an entry")
                        })
                        .collect();
                    reader.fill_batch(&entries);
                    let batch = entries.len() as u64;
                    let total = done.fetch_add(batch, Ordering::Relaxed) + batch;
                    if total / 1_000_000 != (total - batch) / 1_000_000 {
                        eprintln!("{total} files done, {:.0} s", t0.elapsed().as_secs_f64());
                    }
                }
            });
        }
    });
    eprintln!(
        "{} files done in {:.0} s; {} cached",
        done.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64(),
        reader.cache.cached_files()
    );
}
