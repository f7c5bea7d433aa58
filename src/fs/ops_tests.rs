//! `DyadFs` without a kernel: its calls (lookup, create, write, release, open, read, remove,
//! rename, opendir) driven straight, over a real cache directory, an in-memory source of the
//! dataset's bytes and an in-memory namespace, checked against a model of what a file
//! system with a read-only dataset and a writable produced namespace must show (like
//! mountpoint-s3's reference tests). The real mounts (tests/mount.rs) check the fuser adapter.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;

use proptest::prelude::*;

use std::sync::Mutex;
use std::time::Duration;

use super::found::Found;
use super::*;
use crate::cache::CacheConfig;
use crate::core::NodeId;
use crate::core::mem_source::MemSource;
use crate::core::names::Name;
use crate::core::sync::lock;

/// The produced namespace, in memory (the single-node daemon's is alike; the filesystem only
/// sees the trait): the names, whether sets are refused, and what wakes a waiting lookup.
#[derive(Default)]
pub(crate) struct MemNames(
    Mutex<BTreeMap<(String, String), Name>>,
    AtomicBool,
    std::sync::Condvar,
);

impl Namespace for MemNames {
    fn get(&self, dir: &str, name: &str, wait: Duration) -> io::Result<Option<Name>> {
        let deadline = std::time::Instant::now() + wait;
        let key = (dir.to_string(), name.to_string());
        let mut names = lock(&self.0);
        loop {
            if let Some(n) = names.get(&key) {
                return Ok(Some(n.clone()));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            names = self
                .2
                .wait_timeout(names, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
    fn list(&self, dir: &str) -> io::Result<Vec<(String, Name)>> {
        let names = lock(&self.0);
        let entries = names.iter().filter(|((d, _), _)| d == dir);
        Ok(entries.map(|((_, n), v)| (n.clone(), v.clone())).collect())
    }
    fn set(&self, dir: &str, name: &str, entry: Option<Name>) -> io::Result<Option<Name>> {
        // Refusing: the name home cannot be reached.
        if self.1.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EHOSTUNREACH));
        }
        let key = (dir.to_string(), name.to_string());
        let mut names = lock(&self.0);
        let old = match entry {
            Some(e) => names.insert(key, e),
            None => names.remove(&key),
        };
        self.2.notify_all();
        Ok(old)
    }
    fn release(&self, _: NodeId, _: &str, _: u64, _: i64, _: bool) {}
    fn me(&self) -> NodeId {
        0
    }
}

static TEST_ID: AtomicU64 = AtomicU64::new(0);

/// The dataset: two files the namespace may never change.
pub(crate) const DATASET: [(&str, usize); 2] = [("b0", 3000), ("b1", 1 << 20)];
/// Names the operations use: the dataset's and free ones.
const NAMES: [&str; 5] = ["b0", "b1", "p0", "p1", "p2"];

struct World {
    fs: DyadFs<MemSource>,
    names: Arc<MemNames>,
    dir: std::path::PathBuf,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn world() -> (World, BTreeMap<String, Vec<u8>>) {
    world_capped(None)
}

/// [`world`] with `--max-staged-per-user`.
fn world_capped(max_staged_per_user: Option<u64>) -> (World, BTreeMap<String, Vec<u8>>) {
    let names = Arc::new(MemNames::default());
    let (fs, dir, model) = build(max_staged_per_user, Duration::ZERO, names.clone());
    (World { fs, names, dir }, model)
}

/// A file system over a fresh temp backing tree of [`DATASET`] (read through a [`MemSource`])
/// and cache, its produced names in `names`; its directory, and the dataset's bytes.
pub(crate) fn build(
    max_staged_per_user: Option<u64>,
    wait: Duration,
    names: Arc<dyn Namespace>,
) -> (
    DyadFs<MemSource>,
    std::path::PathBuf,
    BTreeMap<String, Vec<u8>>,
) {
    let dir = std::env::temp_dir().join(format!(
        "dyadfs-ops-test-{}-{}",
        std::process::id(),
        TEST_ID.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let (backing, ssd) = (dir.join("backing"), dir.join("ssd"));
    std::fs::create_dir_all(&backing).unwrap();
    let mut model = BTreeMap::new();
    let source = Arc::new(MemSource::default());
    for (i, (name, len)) in DATASET.iter().enumerate() {
        let data: Vec<u8> = (0..*len).map(|j| (j * 7 + i) as u8).collect();
        let path = backing.join(name);
        std::fs::write(&path, &data).unwrap();
        let version = crate::core::version_of(&std::fs::metadata(&path).unwrap());
        // Every read of a dataset file must come through the source.
        assert_eq!(
            source.add_version(name, data.clone(), version.mtime_ns),
            version
        );
        model.insert(name.to_string(), data);
    }
    let backing = Arc::new(crate::backing::BackingStore::new(backing));
    let fs = fs_over(&ssd, backing, source, names, (max_staged_per_user, wait));
    (fs, dir, model)
}

/// A file system over `backing` (its bytes from `source`) with its cache in `ssd`, its
/// produced names in `names`, with `--max-staged-per-user` and `--wait`.
pub(crate) fn fs_over(
    ssd: &std::path::Path,
    backing: Arc<dyn crate::backing::SharedFs>,
    source: Arc<MemSource>,
    names: Arc<dyn Namespace>,
    (max_staged_per_user, wait): (Option<u64>, Duration),
) -> DyadFs<MemSource> {
    let stats = Arc::new(Stats::default());
    let config = CacheConfig {
        dir: ssd.to_path_buf(),
        chunk_size: 256 << 10,
        capacity: Some(64 << 20),
        open_files: 8,
        // Files of a quarter chunk or less are packed in segments, the rest have files.
        pack_max: 64 << 10,
        max_partial_chunks: crate::cache::MAX_PARTIAL_CHUNKS,
    };
    let cache = Arc::new(Cache::open(&config, stats.clone()).unwrap());
    let quota = quota::Quota::new(max_staged_per_user, stats.clone());
    let producer = Arc::new(Producer::open(ssd, cache.clone(), 0, quota).unwrap());
    let fs_config = FsConfig {
        metadata_ttl: Duration::from_secs(1),
        pack_auto: false,
        passthrough: false,
        passthrough_min: 0,
        direct_large: true,
        readahead_threads: 1,
        wait,
        max_waits_per_user: 1024,
        max_inodes: 1024,
        backing_stat_cache: 1 << 20,
        prefetch_threads: 1,
        prefetch_window: 16,
        no_open: false,
    };
    DyadFs::new(backing, names, producer, source, cache, stats, fs_config).unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// Create (or truncate) and write a whole file, then close it.
    Write(usize, Vec<u8>),
    Read(usize),
    Remove(usize),
    Rename(usize, usize),
    List,
}

fn op() -> impl Strategy<Value = Op> {
    let name = 0..NAMES.len();
    prop_oneof![
        (
            name.clone(),
            proptest::collection::vec(any::<u8>(), 0..70_000)
        )
            .prop_map(|(n, d)| Op::Write(n, d)),
        name.clone().prop_map(Op::Read),
        name.clone().prop_map(Op::Remove),
        (name.clone(), name).prop_map(|(a, b)| Op::Rename(a, b)),
        Just(Op::List),
    ]
}

fn is_dataset(name: &str) -> bool {
    DATASET.iter().any(|(n, _)| *n == name)
}

fn read_whole(fs: &DyadFs<MemSource>, name: &str) -> Result<Vec<u8>, Error> {
    let attr = fs.lookup(
        ROOT_INO,
        OsStr::new(name),
        &crate::fs::caller::Unknown::ROOT,
    )?;
    let opened = fs.open(attr.ino, false, false)?;
    let mut out = Vec::new();
    loop {
        let bytes = fs.read(opened.fh, out.len() as u64, 128 << 10)?;
        if bytes.is_empty() {
            break;
        }
        out.extend_from_slice(&bytes);
    }
    fs.release(opened.fh)?;
    assert_eq!(attr.size, out.len() as u64, "{name}: size and bytes agree");
    Ok(out)
}

/// Runs `op` on the file system and the model; they must agree.
fn check(fs: &DyadFs<MemSource>, model: &mut BTreeMap<String, Vec<u8>>, op: Op) {
    match op {
        Op::Write(n, data) => {
            let name = NAMES[n];
            let r = fs
                .create(ROOT_INO, OsStr::new(name), 0o644, (false, true), (0, 0))
                .and_then(|(_, opened)| {
                    let written = fs.write(opened.fh, 0, &data)?;
                    assert_eq!(written as usize, data.len());
                    // close(): the kernel flushes, then releases.
                    fs.flush(opened.fh)?;
                    fs.release(opened.fh)
                });
            if is_dataset(name) {
                assert!(matches!(r, Err(Error::ReadOnly)), "{name}: {r:?}");
            } else {
                r.unwrap();
                model.insert(name.to_string(), data);
            }
        }
        Op::Read(n) => {
            let name = NAMES[n];
            match (read_whole(fs, name), model.get(name)) {
                (Ok(got), Some(want)) => assert!(got == *want, "{name}: wrong bytes"),
                (Err(Error::NotFound), None) => {}
                (got, want) => panic!(
                    "{name}: read {:?}, model {:?}",
                    got.map(|g| g.len()),
                    want.map(Vec::len)
                ),
            }
        }
        Op::Remove(n) => {
            let name = NAMES[n];
            let r = fs.remove(ROOT_INO, OsStr::new(name), false);
            match (r, model.contains_key(name)) {
                (Err(Error::ReadOnly), true) if is_dataset(name) => {}
                (Ok(()), true) if !is_dataset(name) => {
                    model.remove(name);
                }
                (Err(Error::NotFound), false) => {}
                (r, known) => panic!("remove {name}: {r:?} (in model: {known})"),
            }
        }
        Op::Rename(a, b) => {
            let (from, to) = (NAMES[a], NAMES[b]);
            let r = fs.rename(ROOT_INO, OsStr::new(from), ROOT_INO, OsStr::new(to), false);
            if !model.contains_key(from) {
                assert!(matches!(r, Err(Error::NotFound)), "{from} -> {to}: {r:?}");
            } else if from == to {
                r.unwrap();
            } else if is_dataset(from) || (is_dataset(to) && model.contains_key(to)) {
                assert!(matches!(r, Err(Error::ReadOnly)), "{from} -> {to}: {r:?}");
            } else {
                r.unwrap();
                let data = model.remove(from).unwrap();
                model.insert(to.to_string(), data);
            }
        }
        Op::List => {
            let fh = fs.opendir(ROOT_INO).unwrap();
            let mut names: Vec<String> = fs
                .listing(fh)
                .unwrap()
                .iter()
                .map(|e| e.name.to_string_lossy().into_owned())
                .filter(|n| n != "." && n != "..")
                .collect();
            fs.releasedir(fh);
            names.sort();
            let want: Vec<String> = model.keys().cloned().collect();
            assert_eq!(names, want);
        }
    }
}

#[test]
fn dataset_bytes_come_through_the_source_once() {
    let (w, model) = world();
    for _ in 0..3 {
        assert!(read_whole(&w.fs, "b1").unwrap() == model["b1"]);
    }
    // Fetched whole (one source read of its four chunks) at the first read, then served from
    // the cache.
    assert_eq!(w.fs.files.reader.source.reads.load(Ordering::Relaxed), 1);
}

#[test]
fn a_close_seals_and_reports_what_publishing_met() {
    let (w, _) = world();
    let create = |name: &str| {
        w.fs.create(ROOT_INO, OsStr::new(name), 0o644, (false, true), (0, 0))
            .unwrap()
            .1
    };
    // The close publishes: readable as soon as flush returns, before the release.
    let a = create("p0");
    w.fs.write(a.fh, 0, b"hello").unwrap();
    w.fs.flush(a.fh).unwrap();
    assert!(w.fs.produce.producer.staged("p0").is_none());
    assert_eq!(read_whole(&w.fs, "p0").unwrap(), b"hello");
    // The handle takes no more writes (a dup of the closed descriptor): EBADF.
    let late = w.fs.write(a.fh, 5, b"!").unwrap_err();
    assert_eq!(late.errno(), libc::EBADF);
    w.fs.release(a.fh).unwrap();
    assert_eq!(read_whole(&w.fs, "p0").unwrap(), b"hello");

    // Two writable handles: the first close leaves it staged, the last one publishes.
    let b1 = create("p1");
    let b2 = w.fs.open(
        w.fs.lookup(
            ROOT_INO,
            OsStr::new("p1"),
            &crate::fs::caller::Unknown::ROOT,
        )
        .unwrap()
        .ino,
        true,
        false,
    );
    let b2 = b2.unwrap();
    w.fs.write(b1.fh, 0, b"one").unwrap();
    w.fs.flush(b1.fh).unwrap();
    w.fs.release(b1.fh).unwrap();
    assert!(
        w.fs.produce.producer.staged("p1").is_some(),
        "still open for writing"
    );
    w.fs.write(b2.fh, 3, b"two").unwrap();
    w.fs.flush(b2.fh).unwrap();
    assert_eq!(read_whole(&w.fs, "p1").unwrap(), b"onetwo");
    w.fs.release(b2.fh).unwrap();

    // A close before any write (a shell's `> file`: open, dup2 onto stdout, close the
    // original, then write through the dup) seals nothing; the close after the write does.
    let d = create("p3");
    w.fs.flush(d.fh).unwrap();
    assert!(
        w.fs.produce.producer.staged("p3").is_some(),
        "sealed before a byte was written"
    );
    w.fs.write(d.fh, 0, b"late").unwrap();
    w.fs.flush(d.fh).unwrap();
    assert!(w.fs.produce.producer.staged("p3").is_none());
    w.fs.release(d.fh).unwrap();
    assert_eq!(read_whole(&w.fs, "p3").unwrap(), b"late");

    // A name home that cannot be reached: close() says so.
    w.names.1.store(true, Ordering::Relaxed);
    let c = create("p2");
    w.fs.write(c.fh, 0, b"lost?").unwrap();
    let e = w.fs.flush(c.fh).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    w.fs.release(c.fh).unwrap();
}

/// An open for writing that resolved a file being written just before its last close finished
/// it must not join it: its writes would land in the sealed object, and its release would
/// finish the file a second time. It opens the published version instead.
#[test]
fn an_open_that_reaches_a_finished_file_opens_its_published_version() {
    let (w, _) = world();
    let (attr, a) =
        w.fs.create(ROOT_INO, OsStr::new("f"), 0o644, (false, true), (0, 0))
            .unwrap();
    w.fs.write(a.fh, 0, b"first").unwrap();
    // The open resolves the name while the file is being written ...
    let (path, found) =
        w.fs.tree
            .resolve_node(&w.fs.tree.node(attr.ino).unwrap())
            .unwrap();
    assert!(matches!(found, Found::Staged(_)));
    // ... and the writer's last release finishes it before the open gets further.
    w.fs.release(a.fh).unwrap();
    assert!(w.fs.produce.producer.staged("f").is_none());
    let handles = w.fs.tree.handles.count();
    assert!(
        w.fs.produce
            .open_found(path, found, false)
            .unwrap()
            .is_none()
    );
    assert_eq!(
        w.fs.tree.handles.count(),
        handles,
        "no handle on the sealed file"
    );
    // The whole open resolves again: a new version, started from the published bytes.
    let b = w.fs.open(attr.ino, true, false).unwrap();
    w.fs.write(b.fh, 0, b"FIRST, then more").unwrap();
    w.fs.release(b.fh).unwrap();
    assert_eq!(read_whole(&w.fs, "f").unwrap(), b"FIRST, then more");
    assert_eq!(w.fs.stats().files_produced.load(Ordering::Relaxed), 2);
}

/// `--max-staged-per-user`: the write that would take a uid past its cap fails with EDQUOT
/// there, the file keeps what it held and publishes it; what that uid published here counts
/// until it is removed; another uid writes on.
#[test]
fn a_uid_past_its_cap_is_refused_at_the_crossing_write() {
    let (w, _) = world_capped(Some(1000));
    let create = |name: &str, uid: u32| {
        w.fs.create(ROOT_INO, OsStr::new(name), 0o644, (false, true), (uid, uid))
            .unwrap()
            .1
    };
    let a = create("p0", 1000);
    w.fs.write(a.fh, 0, &[1; 600]).unwrap();
    let e = w.fs.write(a.fh, 600, &[2; 401]).unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT, "{e}");
    // Another uid is not held by the first one's bytes.
    let b = create("p1", 1001);
    w.fs.write(b.fh, 0, &[3; 1000]).unwrap();
    // Refused a write, the file is failed (issue 69): its close says why, it is never
    // published, and it holds nothing against its owner after.
    assert_eq!(w.fs.flush(a.fh).unwrap_err().errno(), libc::EDQUOT);
    let _ = w.fs.release(a.fh);
    assert!(read_whole(&w.fs, "p0").is_err());
    let a = create("p0", 1000);
    w.fs.write(a.fh, 0, &[1; 1000]).unwrap();
    w.fs.flush(a.fh).unwrap();
    w.fs.release(a.fh).unwrap();
    assert_eq!(read_whole(&w.fs, "p0").unwrap(), vec![1; 1000]);

    // What it published here counts: no room for a byte more, by write or by truncate.
    let c = create("p2", 1000);
    assert_eq!(w.fs.write(c.fh, 0, b"x").unwrap_err().errno(), libc::EDQUOT);
    let grow = Changes {
        size: Some(10),
        ..Changes::default()
    };
    let c_ino =
        w.fs.lookup(
            ROOT_INO,
            OsStr::new("p2"),
            &crate::fs::caller::Unknown::ROOT,
        )
        .unwrap()
        .ino;
    let e = w.fs.setattr(c_ino, &grow).unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT, "{e}");
    // Removed, it is given back.
    w.fs.remove(ROOT_INO, OsStr::new("p0"), false).unwrap();
    w.fs.write(c.fh, 0, &[4; 1000]).unwrap();
    // A truncate gives back too; emptied, the file (failed at its refused write) holds no
    // failed write's bytes any more, and may be published again.
    let shrink = Changes {
        size: Some(0),
        ..Changes::default()
    };
    w.fs.setattr(c_ino, &shrink).unwrap();
    w.fs.write(c.fh, 0, &[5; 1000]).unwrap();
    assert_eq!(w.fs.stats().quota_refusals.load(Ordering::Relaxed), 3);
    for h in [b, c] {
        w.fs.flush(h.fh).unwrap();
        w.fs.release(h.fh).unwrap();
    }
    // A restarted daemon charges what it keeps to the same uids (the kept log says whose).
    let again = quota::Quota::new(Some(1000), Arc::new(Stats::default()));
    let cache = w.fs.cache().clone();
    Producer::open(&w.dir.join("ssd"), cache, 0, again.clone()).unwrap();
    assert_eq!((again.held(1000), again.held(1001)), (1000, 1000));
}

/// The kernel forgetting an inode no longer costs a stat of the shared file system at the
/// name's next lookup within the metadata TTL (a metadata server's round trip per sample and
/// epoch on a parallel file system); once the TTL has passed, the lookup asks again.
#[test]
fn a_forgotten_name_is_looked_up_again_without_the_shared_fs_within_the_ttl() {
    let (w, _) = world();
    let stats = || {
        let s = w.fs.stats();
        (
            s.backing_stats.load(Ordering::Relaxed),
            s.backing_stats_remembered.load(Ordering::Relaxed),
        )
    };
    let name = OsStr::new(DATASET[0].0);
    let ttl = w.fs.config.metadata_ttl;
    let first =
        w.fs.lookup(ROOT_INO, name, &crate::fs::caller::Unknown::ROOT)
            .unwrap();
    let (asked, remembered) = stats();
    std::thread::sleep(ttl * 6 / 10);
    w.fs.forget(first.ino, 1);
    assert_eq!(w.fs.inode_count(), 1, "only the root is left");
    let again =
        w.fs.lookup(ROOT_INO, name, &crate::fs::caller::Unknown::ROOT)
            .unwrap();
    assert_eq!((again.size, again.mtime), (first.size, first.mtime));
    assert_eq!(
        stats(),
        (asked, remembered + 1),
        "the shared FS was asked again"
    );
    // The node made from the remembered stat is trusted only as long as the stat was: its
    // TTL counts from the read, not from the second lookup.
    std::thread::sleep(ttl * 5 / 10);
    w.fs.getattr(again.ino).unwrap();
    assert_eq!(
        stats(),
        (asked + 1, remembered + 1),
        "a stat past its TTL was trusted"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn operations_match_the_model(ops in proptest::collection::vec(op(), 1..30)) {
        let (w, mut model) = world();
        for op in ops {
            check(&w.fs, &mut model, op);
        }
        // Everything the model holds reads back at the end.
        for (name, data) in &model {
            prop_assert!(read_whole(&w.fs, name).unwrap() == *data, "{}", name);
        }
    }
}
