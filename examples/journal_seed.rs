//! Writes the journal fuzz target's seed, `fixtures/fuzz/journal_decode/seed.log`: a header log
//! with a put, a second put, a packed object and a drop, as the cache writes them (a fixture generator, run by
//! hand after a change of the journal's format: `cargo run --example journal_seed`).

use std::fs;
use std::path::Path;

use dyadfs::cache::format::Header;
use dyadfs::cache::journal::{self, Record};
use dyadfs::cache::segments::Place;

fn main() {
    let seed = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fuzz/journal_decode/seed.log");
    let dir = std::env::temp_dir().join(format!("dyadfs-journal-seed-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let log = dir.join("index.log");
    let header = |path: &str, chunks| Header {
        chunk_size: 1 << 20,
        version: dyadfs::core::Version {
            size: 3 << 20,
            mtime_ns: 42,
        },
        path: path.into(),
        chunks,
        partial: Vec::new(),
    };
    let j = journal::Journal::create(
        &log,
        [Record::Put(header("a/b.npz", vec![Some(1), None, Some(3)]))],
    )
    .unwrap();
    j.put(|| {
        Some(Record::Put(header(
            "c.bin",
            vec![Some(7), Some(8), Some(9)],
        )))
    })
    .unwrap();
    let place = Place {
        segment: 2,
        page: 64,
    };
    let small = Header {
        version: dyadfs::core::Version {
            size: 256 << 10,
            mtime_ns: 42,
        },
        ..header("d.bin", vec![Some(11)])
    };
    j.put(|| Some(Record::Packed(place, small))).unwrap();
    j.drop_path("a/b.npz").unwrap();
    drop(j);
    fs::copy(&log, &seed).unwrap();
    let _ = fs::remove_dir_all(dir);
    println!("wrote {}", seed.display());
}
