//! Appends and a rewrite interleaved by shuttle's randomized scheduler (`cargo test --features
//! shuttle --lib cache::journal::shuttle_tests`; scripts/test.sh runs it): an append writes
//! outside the log's lock, and a rewrite must not replace the file between an append's place
//! and its write.

use std::collections::BTreeMap;
use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};

use shuttle::sync::Arc;
use shuttle::thread;

use super::replay::read;
use super::tests::header;
use super::{Journal, Record};
use crate::core::sync::model::{Mutex, lock};

#[test]
fn a_rewrite_between_appends_loses_none_and_keeps_their_order() {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir().join(format!("dyadfs-journal-s-{}", std::process::id()));
    const EACH: u32 = 3;
    shuttle::check_random(
        {
            let base = base.clone();
            move || {
                let run = RUN.fetch_add(1, Ordering::Relaxed);
                let dir = base.join(run.to_string());
                fs::create_dir_all(&dir).unwrap();
                let path = dir.join("index.log");
                let j = Arc::new(Journal::create(&path, []).unwrap());
                // What a rewrite keeps: the latest record made of each path.
                let latest = Arc::new(Mutex::new(BTreeMap::new()));
                let mut threads: Vec<_> = (0..2)
                    .map(|t| {
                        let (j, latest) = (j.clone(), latest.clone());
                        thread::spawn(move || {
                            let name = format!("t{t}");
                            for i in 1..=EACH {
                                j.put(|| {
                                    let r = Record::Put(header(&name, i));
                                    lock(&latest).insert(name.clone(), r.clone());
                                    Some(r)
                                })
                                .unwrap();
                            }
                        })
                    })
                    .collect();
                threads.push({
                    let (j, latest) = (j.clone(), latest.clone());
                    thread::spawn(move || {
                        j.rewrite(|| lock(&latest).values().cloned().collect::<Vec<_>>())
                            .unwrap();
                    })
                });
                for t in threads {
                    t.join().unwrap();
                }
                let mut seen = BTreeMap::<String, Vec<u32>>::new();
                for r in read(&path).unwrap() {
                    let Record::Put(h) = r else { panic!("{r:?}") };
                    seen.entry(h.path).or_default().push(h.chunks[0].unwrap());
                }
                // Each path's record kept by the rewrite (if it had one then), and all after it.
                for t in ["t0", "t1"] {
                    let got = seen.get(t).cloned().unwrap_or_default();
                    let first = got.first().copied().unwrap_or(0);
                    assert_eq!(got, (first.max(1)..=EACH).collect::<Vec<_>>(), "{t}");
                }
                fs::remove_dir_all(&dir).unwrap();
            }
        },
        1000,
    );
    let _ = fs::remove_dir_all(base);
}
