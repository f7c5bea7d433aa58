use std::fs::{self, File};

use super::parallel::{Replayed, replay_sharded};
use super::record::{MAGIC, PUT, Record, encode};
use super::replay::{WINDOW, Window, decode, decode_each, read};
use super::writer::Journal;
use crate::cache::format::{FORMAT_V1, FORMAT_VERSION, Header, PartialRecord};
use crate::cache::segments::Place;
use crate::core::Version;
use crate::core::sync::model::{Mutex, lock};

pub(super) fn header(path: &str, crc: u32) -> Header {
    Header {
        chunk_size: 1 << 20,
        version: Version {
            size: 10,
            mtime_ns: 7,
        },
        path: path.into(),
        chunks: vec![Some(crc)],
        partial: Vec::new(),
    }
}

#[test]
fn records_come_back_in_order_a_torn_tail_is_ignored_and_a_corrupt_one_skipped() {
    let dir = std::env::temp_dir().join(format!("dyadfs-journal-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("index.log");
    let j = Journal::create(&path, [Record::Put(header("a", 1))]).unwrap();
    j.put(|| Some(Record::Put(header("b", 2)))).unwrap();
    j.put(|| None).unwrap();
    j.drop_path("a").unwrap();
    j.put(|| Some(Record::Put(header("b", 3)))).unwrap();
    let want = vec![
        Record::Put(header("a", 1)),
        Record::Put(header("b", 2)),
        Record::Drop("a".into()),
        Record::Put(header("b", 3)),
    ];
    assert_eq!(read(&path).unwrap(), want);
    // Every cut inside the last record (a crash mid-append) keeps exactly the others.
    let bytes = fs::read(&path).unwrap();
    let last = encode(PUT, &header("b", 3).encode()).len();
    for cut in 1..last {
        assert_eq!(decode(&bytes[..bytes.len() - cut]), want[..3]);
    }
    // A flipped byte in a record (in its length, its payload or its checksum) loses that
    // record only: the ones after it are found again.
    let first = encode(PUT, &header("a", 1).encode()).len();
    for at in [12, 12 + 2, 12 + 9, 12 + first - 1] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x41;
        assert_eq!(decode(&bad), want[1..], "byte {at} flipped");
    }
    let second = 12 + first;
    let mut bad = bytes.clone();
    bad[second + 6] ^= 1;
    assert_eq!(
        decode(&bad),
        [want[0].clone(), want[2].clone(), want[3].clone()]
    );
    j.rewrite(|| vec![Record::Put(header("b", 3))]).unwrap();
    j.drop_path("b").unwrap();
    assert_eq!(
        read(&path).unwrap(),
        vec![Record::Put(header("b", 3)), Record::Drop("b".into())]
    );
    assert_eq!(read(&dir.join("missing")).unwrap(), vec![]);
    let _ = fs::remove_dir_all(dir);
}

/// Appends write outside the log's lock at the places they took, and rewrites come between
/// them: every record reaches the log it was placed in, in the order they were made.
#[test]
fn appends_from_many_threads_and_rewrites_between_them_keep_every_record_in_order() {
    let dir = std::env::temp_dir().join(format!("dyadfs-journal-t-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("index.log");
    let j = Journal::create(&path, []).unwrap();
    j.set_slack(1024);
    // The latest record made of each path: what a rewrite keeps.
    let latest = Mutex::new(std::collections::BTreeMap::new());
    const EACH: u32 = 2000;
    std::thread::scope(|s| {
        for t in 0..4 {
            let (j, latest) = (&j, &latest);
            s.spawn(move || {
                let name = format!("dir/t{t}");
                for i in 1..=EACH {
                    j.put(|| {
                        let r = Record::Put(header(&name, i));
                        lock(latest).insert(name.clone(), r.clone());
                        Some(r)
                    })
                    .unwrap();
                    if j.wants_rewrite() {
                        j.rewrite(|| lock(latest).values().cloned().collect::<Vec<_>>())
                            .unwrap();
                    }
                }
            });
        }
    });
    let mut seen = std::collections::BTreeMap::<String, Vec<u32>>::new();
    for r in read(&path).unwrap() {
        let Record::Put(h) = r else { panic!("{r:?}") };
        seen.entry(h.path).or_default().push(h.chunks[0].unwrap());
    }
    assert_eq!(seen.len(), 4);
    // The last rewrite kept each path's latest record, and every one made after it follows.
    for (name, crcs) in &seen {
        let first = crcs[0];
        assert_eq!(*crcs, (first..=EACH).collect::<Vec<_>>(), "{name}");
    }
    // It was rewritten along the way (else the test shows nothing about rewrites).
    let appended = 4 * EACH as u64 * Record::Put(header("dir/t0", 1)).encode().len() as u64;
    assert!(
        j.bytes() < appended / 4,
        "{} of {appended} bytes",
        j.bytes()
    );
    assert_eq!(fs::metadata(&path).unwrap().len(), j.bytes());
    let _ = fs::remove_dir_all(dir);
}

/// An append whose write fails gives its place back when it was the last one taken, so a
/// full disk leaves no gap and does not grow the log's length.
#[test]
fn a_failed_append_gives_its_place_back() {
    let dir = std::env::temp_dir().join(format!("dyadfs-journal-f-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("index.log");
    let j = Journal::create(&path, [Record::Put(header("a", 1))]).unwrap();
    let before = j.bytes();
    // The log's file read-only: every write fails (EBADF), as on a full disk (ENOSPC).
    let writable = std::mem::replace(&mut *j.file.write().unwrap(), File::open(&path).unwrap());
    assert!(j.put(|| Some(Record::Put(header("b", 2)))).is_err());
    assert!(j.drop_path("a").is_err());
    assert_eq!(j.bytes(), before);
    *j.file.write().unwrap() = writable;
    j.put(|| Some(Record::Put(header("c", 3)))).unwrap();
    assert_eq!(
        read(&path).unwrap(),
        [Record::Put(header("a", 1)), Record::Put(header("c", 3))]
    );
    assert_eq!(fs::metadata(&path).unwrap().len(), j.bytes());
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_log_longer_than_the_window_is_replayed_whole_across_its_boundaries() {
    let dir = std::env::temp_dir().join(format!("dyadfs-journal-w-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("index.log");
    // Small records that straddle every window boundary, and one record longer than a
    // window (a file of 400,000 chunks).
    let mut want: Vec<Record> = (0..40_000)
        .map(|i| Record::Put(header(&format!("dir/{i:06}.bin"), i)))
        .collect();
    let mut big = header("big", 0);
    big.chunks = (0..400_000).map(Some).collect();
    want.insert(20_000, Record::Put(big));
    Journal::create(&path, want.clone()).unwrap();
    assert!(fs::metadata(&path).unwrap().len() > 3 * WINDOW as u64);
    assert_eq!(read(&path).unwrap(), want);
    // A corrupt byte just before the second window loses only its record.
    let mut bytes = fs::read(&path).unwrap();
    let (i, at) = want
        .iter()
        .scan(12usize, |at, r| {
            let start = *at;
            *at += r.encode().len();
            Some(start)
        })
        .enumerate()
        .find(|(_, start)| *start + 60 > WINDOW)
        .unwrap();
    bytes[at + 8] ^= 0x41;
    fs::write(&path, &bytes).unwrap();
    let mut lost = want.clone();
    lost.remove(i);
    assert_eq!(read(&path).unwrap(), lost);
    let _ = fs::remove_dir_all(dir);
}

fn packed() -> Record {
    Record::Packed(
        Place {
            segment: 0x0102_0304,
            page: 0x0a0b_0c0d,
        },
        header("train/00001.bin", 0xdead_beef),
    )
}

fn pages() -> Record {
    Record::Pages {
        path: "train/rows.h5".into(),
        version: Version {
            size: 5 << 30,
            mtime_ns: 1_700_000_000_123_456_789,
        },
        part: PartialRecord {
            chunk: 0x0102,
            pages: 1 << 100 | 0b0110,
            crcs: vec![0xdead_beef, 0x0bad_f00d, 0x1234_5678],
        },
    }
}

/// A log of format 1's framing (as this release starts one) holding `golden`, then `then`.
fn log_of(golden: &[u8], then: &[Record]) -> Vec<u8> {
    let mut log = MAGIC.to_vec();
    log.extend_from_slice(&FORMAT_V1.to_le_bytes());
    log.extend_from_slice(golden);
    for r in then {
        log.extend_from_slice(&r.encode());
    }
    log
}

/// `record` encodes to `golden`, the bytes of `fixtures/cache/<name>` (rewritten from it
/// first under DYADFS_REGENERATE_FIXTURES); in a log before a packed record, both read back;
/// torn anywhere, it is never taken.
fn golden_record(name: &str, golden: &[u8], record: Record) {
    if std::env::var_os("DYADFS_REGENERATE_FIXTURES").is_some() {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/cache");
        fs::write(file.join(name), record.encode()).unwrap();
    }
    assert_eq!(
        record.encode(),
        golden,
        "the journal's record {name} changed: bump FORMAT_VERSION and regenerate the fixture"
    );
    assert_eq!(decode(&log_of(golden, &[packed()])), vec![record, packed()]);
    let log = log_of(golden, &[]);
    for cut in 1..golden.len() {
        assert_eq!(decode(&log[..log.len() - cut]), vec![]);
    }
}

#[test]
fn pages_record_golden_bytes() {
    let golden = include_bytes!("../../../fixtures/cache/pages-record-v2.bin");
    golden_record("pages-record-v2.bin", golden, pages());
    // A page count its crcs do not match is no record.
    let Record::Pages { mut part, .. } = pages() else {
        unreachable!()
    };
    part.pages |= 1;
    let bad = Record::Pages {
        path: "train/rows.h5".into(),
        version: Version {
            size: 1,
            mtime_ns: 1,
        },
        part,
    };
    assert_eq!(decode(&log_of(&bad.encode(), &[])), vec![]);
}

/// The pages record of 32 pages per chunk (kind 4) is skipped whole, and what follows it
/// read: its checksums cannot vouch for this release's smaller pages.
#[test]
fn a_retired_pages_record_is_skipped_whole() {
    let mut log = MAGIC.to_vec();
    log.extend_from_slice(&FORMAT_V1.to_le_bytes());
    log.extend_from_slice(include_bytes!(
        "../../../fixtures/cache/pages-record-v1.bin"
    ));
    log.extend_from_slice(&packed().encode());
    let mut n = 0;
    let skipped = decode_each(Window::new(&log[..], log.len() as u64), |r| {
        assert_eq!(r, packed());
        n += 1;
    })
    .unwrap();
    assert_eq!((n, skipped), (1, 0));
}

fn chunks() -> Record {
    Record::Chunks {
        path: "train/rows.h5".into(),
        version: Version {
            size: 5 << 30,
            mtime_ns: 1_700_000_000_123_456_789,
        },
        chunks: vec![(0x0102, 0xdead_beef), (0x0103, 0x0bad_f00d)],
    }
}

#[test]
fn chunks_record_golden_bytes() {
    let golden = include_bytes!("../../../fixtures/cache/chunks-record-v1.bin");
    golden_record("chunks-record-v1.bin", golden, chunks());
    // A count its pairs do not fill is no record.
    let mut body = golden[4..golden.len() - 4].to_vec();
    body[17..21].copy_from_slice(&3u32.to_le_bytes());
    assert_eq!(decode(&log_of(&encode(body[0], &body[1..]), &[])), vec![]);
}

#[test]
fn packed_record_golden_bytes() {
    let golden = include_bytes!("../../../fixtures/cache/packed-record-v1.bin");
    golden_record("packed-record-v1.bin", golden, packed());
    // Also in a log of the header format's number.
    let mut log = MAGIC.to_vec();
    log.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    log.extend_from_slice(golden);
    assert_eq!(decode(&log), vec![packed()]);
}

/// The threads of a parallel replay hand over what one reader does, in the log's order, across
/// batches, past a record longer than a batch, a corrupt byte and a torn tail.
#[test]
fn a_parallel_replay_hands_over_what_a_sequential_one_reads() {
    let dir = std::env::temp_dir().join(format!("dyadfs-journal-p-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("index.log");
    let mut want: Vec<Record> = (0..20_000)
        .map(|i| match i % 7 {
            3 => Record::Drop(format!("dir/{:06}.bin", i - 1)),
            _ => Record::Put(header(&format!("dir/{i:06}.bin"), i)),
        })
        .collect();
    let mut big = header("big", 0);
    big.chunks = (0..40_000).map(Some).collect();
    want.insert(9_000, Record::Put(big));
    Journal::create(&path, want.clone()).unwrap();
    // Each shard's records in the log's order: here, by a path's length.
    let shard_of = |r: &Record| match r {
        Record::Put(h) => h.path.len() % 3,
        Record::Drop(p) => p.len() % 3,
        _ => 0,
    };
    let parallel = |threads| {
        let mut got: Vec<Vec<Record>> = vec![Vec::new(); 3];
        let read = replay_sharded(
            &path,
            threads,
            3,
            |r| (shard_of(&r), r),
            |batch| {
                for (shard, parts) in batch.into_iter().enumerate() {
                    got[shard].extend(parts.into_iter().flatten());
                }
            },
        )
        .unwrap();
        (got, read)
    };
    let by_shard = |records: &[Record]| {
        let mut shards: Vec<Vec<Record>> = vec![Vec::new(); 3];
        for r in records {
            shards[shard_of(r)].push(r.clone());
        }
        shards
    };
    let len = fs::metadata(&path).unwrap().len();
    for threads in [1, 2, 3, 8] {
        let (got, read) = parallel(threads);
        assert!(got == by_shard(&want), "{threads} threads");
        assert_eq!(
            read,
            Replayed {
                bytes: len,
                records: want.len() as u64,
                skipped: 0
            }
        );
        assert!(read.whole());
    }
    // A corrupt byte in the middle and a torn tail: what the careful reader keeps.
    let mut bytes = fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x41;
    bytes.truncate(bytes.len() - 3);
    fs::write(&path, &bytes).unwrap();
    let kept = read(&path).unwrap();
    assert!(kept.len() < want.len() && kept.len() > want.len() - 3);
    let (got, read) = parallel(2);
    assert!(got == by_shard(&kept));
    assert!(read.skipped > 0 && !read.whole());
    assert_eq!(
        replay_sharded(&dir.join("missing"), 2, 1, |r| (0, r), |_| {}).unwrap(),
        Replayed::default()
    );
    let _ = fs::remove_dir_all(dir);
}
