//! The kernel adapter's handlers without a kernel: `Ops` over a real `DyadFs` (a temp backing
//! tree, the in-memory source and namespace of `fs::ops_tests`), answering into
//! [`Recorder`], a reply that writes down what it was told. What the kernel would do with the
//! answers is the integration tests' part; the rules the handlers apply are tested here.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use super::ops::{Caller, Ops};
use super::passthrough::Passthrough;
use super::reply::*;
use crate::core::Kind;
use crate::core::mem_source::MemSource;
use crate::core::names::Namespace;
use crate::fs::ops_tests::{DATASET, MemNames, build};
use crate::fs::{Attr, ROOT_INO};

/// The kernel adapter's handlers over [`build`](crate::fs::ops_tests::build)'s file system (its lookups wait, `--wait`),
/// for `fuse::ops_tests`.
struct AdapterWorld {
    ops: Arc<Ops<MemSource>>,
    names: Arc<MemNames>,
    model: BTreeMap<String, Vec<u8>>,
    dir: std::path::PathBuf,
}

impl Drop for AdapterWorld {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn adapter_world(wait: Duration) -> AdapterWorld {
    let names = Arc::new(MemNames::default());
    let (fs, dir, model) = build(None, wait, names.clone());
    let ops = Ops::new(fs, &dir.join("not-mounted")).unwrap();
    AdapterWorld {
        ops: Arc::new(ops),
        names,
        model,
        dir,
    }
}

/// What a reply was told.
#[derive(Debug, Clone, PartialEq)]
enum Said {
    Error(i32),
    Entry(u64),
    Attr(u64),
    Data(Vec<u8>),
    Opened { fh: u64, flags: u32 },
    Passthrough { fh: u64 },
    Created { ino: u64, fh: u64 },
    Written(u32),
    Ok,
    Statfs,
    XattrSize(u32),
    XattrData(Vec<u8>),
    Listed(Vec<String>),
}

/// A reply that sends what it is told to a channel; `may_leave: false` stands for a ring
/// entry whose thread lets no more replies go elsewhere.
struct Recorder {
    to: Sender<Said>,
    may_leave: bool,
    listed: Vec<String>,
}

fn recorder(may_leave: bool) -> (Recorder, Receiver<Said>) {
    let (to, said) = channel();
    let r = Recorder {
        to,
        may_leave,
        listed: Vec::new(),
    };
    (r, said)
}

impl Recorder {
    fn say(&self, s: Said) {
        let _ = self.to.send(s);
    }
}

impl Fail for Recorder {
    fn error(self, errno: i32) {
        self.say(Said::Error(errno));
    }

    fn may_leave(&self) -> bool {
        self.may_leave
    }
}

impl EntryReply for Recorder {
    fn entry(self, attr: &Attr, _ttl: Duration) {
        self.say(Said::Entry(attr.ino));
    }
}

impl AttrReply for Recorder {
    fn attr(self, attr: &Attr, _ttl: Duration) {
        self.say(Said::Attr(attr.ino));
    }
}

impl DataReply for Recorder {
    fn data(self, bytes: &[u8]) {
        self.say(Said::Data(bytes.to_vec()));
    }
}

impl OpenReply for Recorder {
    fn opened(self, fh: u64, flags: u32) {
        self.say(Said::Opened { fh, flags });
    }

    fn opened_passthrough(self, fh: u64, _flags: u32, _file: &Passthrough) {
        self.say(Said::Passthrough { fh });
    }
}

impl CreateReply for Recorder {
    fn created(self, attr: &Attr, _ttl: Duration, fh: u64, _flags: u32) {
        self.say(Said::Created { ino: attr.ino, fh });
    }
}

impl WriteReply for Recorder {
    fn written(self, n: u32) {
        self.say(Said::Written(n));
    }
}

impl EmptyReply for Recorder {
    fn ok(self) {
        self.say(Said::Ok);
    }
}

impl StatfsReply for Recorder {
    fn statfs(self, _s: &libc::statvfs) {
        self.say(Said::Statfs);
    }
}

impl XattrReply for Recorder {
    fn xattr_size(self, n: u32) {
        self.say(Said::XattrSize(n));
    }

    fn xattr_data(self, bytes: &[u8]) {
        self.say(Said::XattrData(bytes.to_vec()));
    }
}

impl DirReply for Recorder {
    fn add(&mut self, _ino: u64, _next: u64, _kind: Kind, name: &OsStr) -> bool {
        self.listed.push(name.to_string_lossy().into_owned());
        false
    }

    fn done(self) {
        self.say(Said::Listed(self.listed.clone()));
    }
}

/// This test thread as the caller (root).
fn me() -> Caller {
    Caller {
        uid: 0,
        gid: 0,
        pid: std::process::id(),
    }
}

/// What the reply was told, at once (the handler answered before it returned).
fn at_once(said: &Receiver<Said>) -> Said {
    said.try_recv()
        .expect("answered before the handler returned")
}

fn lookup<S: crate::core::source::Source>(ops: &Ops<S>, name: &str) -> Said {
    let (r, said) = recorder(true);
    ops.lookup(me(), ROOT_INO, OsStr::new(name), r);
    at_once(&said)
}

/// Creates `name` in the root as this thread (0644, for writing) and writes `data` at its
/// start; its inode and handle, still open.
fn create_and_write<S: crate::core::source::Source>(
    ops: &Ops<S>,
    name: &str,
    data: &[u8],
) -> (u64, u64) {
    let (r, said) = recorder(true);
    ops.create(
        me(),
        ROOT_INO,
        OsStr::new(name),
        0o644,
        0o022,
        libc::O_WRONLY,
        r,
    );
    let Said::Created { ino, fh } = at_once(&said) else {
        panic!("{name} not created")
    };
    let (r, said) = recorder(true);
    ops.write(fh, 0, data, r);
    assert_eq!(at_once(&said), Said::Written(data.len() as u32));
    (ino, fh)
}

#[test]
fn a_backing_file_is_looked_up_opened_read_and_released_and_a_missing_one_is_enoent() {
    let w = adapter_world(Duration::ZERO);
    let ops = &w.ops;
    assert_eq!(lookup(ops, "missing"), Said::Error(libc::ENOENT));
    let (name, len) = DATASET[0];
    let Said::Entry(ino) = lookup(ops, name) else {
        panic!("no entry for {name}")
    };
    let (r, said) = recorder(true);
    ops.open(me(), ino, libc::O_RDONLY, r);
    let Said::Opened { fh, .. } = at_once(&said) else {
        panic!("not opened")
    };
    let (r, said) = recorder(true);
    ops.read(ino, fh, 0, 4096, r);
    assert_eq!(
        at_once(&said),
        Said::Data(w.model[name][..4096.min(len)].to_vec())
    );
    let (r, said) = recorder(true);
    ops.release(ino, fh, r);
    assert_eq!(at_once(&said), Said::Ok);
}

#[test]
fn a_backing_file_opened_to_write_is_read_only() {
    let w = adapter_world(Duration::ZERO);
    let Said::Entry(ino) = lookup(&w.ops, DATASET[0].0) else {
        panic!()
    };
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        let (r, said) = recorder(true);
        w.ops.open(me(), ino, flags, r);
        assert_eq!(at_once(&said), Said::Error(libc::EROFS), "flags {flags:#o}");
    }
}

#[test]
fn a_created_file_is_written_and_named_at_its_last_release() {
    let w = adapter_world(Duration::ZERO);
    let ops = &w.ops;
    let (ino, fh) = create_and_write(ops, "made", b"bytes");
    assert_eq!(w.names.get("", "made", Duration::ZERO).unwrap(), None);
    let (r, said) = recorder(true);
    ops.release(ino, fh, r);
    assert_eq!(at_once(&said), Said::Ok);
    let named = w.names.get("", "made", Duration::ZERO).unwrap();
    assert_eq!(named.map(|n| n.size), Some(5));
}

/// A prefetch list is read on a thread of its own; where its reply may not leave the request's
/// thread (a ring thread with no entry to spare), it is refused at once (EBUSY) instead.
#[test]
fn a_prefetch_list_is_read_elsewhere_only_where_the_reply_may_leave() {
    let w = adapter_world(Duration::ZERO);
    let request = format!("{}s:/nonexistent/list", crate::fs::prefetch::PREFETCH_XATTR);
    let (r, said) = recorder(false);
    w.ops.getxattr(me(), ROOT_INO, OsStr::new(&request), 0, r);
    assert_eq!(at_once(&said), Said::Error(libc::EBUSY));
    let (r, said) = recorder(true);
    w.ops.getxattr(me(), ROOT_INO, OsStr::new(&request), 0, r);
    let answer = said
        .recv_timeout(Duration::from_secs(10))
        .expect("answered");
    assert!(
        matches!(answer, Said::Error(e) if e != libc::EBUSY),
        "{answer:?}"
    );
}

/// With `--wait`, a reader's open of a file another process is still writing here waits (on a
/// thread of its own) until the file is finished, then opens it; where the reply may not
/// leave (a ring thread's places are taken) it fails at once, counted.
#[test]
fn a_readers_open_waits_for_a_file_being_written_unless_its_reply_may_not_leave() {
    let w = adapter_world(Duration::from_secs(10));
    let ops = &w.ops;
    let (ino, fh) = create_and_write(ops, "being", b"0123456789");
    // Another process (init) opens it to read.
    let other = Caller {
        uid: 0,
        gid: 0,
        pid: 1,
    };
    let (r, refused) = recorder(false);
    ops.open(other, ino, libc::O_RDONLY, r);
    assert_eq!(at_once(&refused), Said::Error(libc::ENOENT));
    assert_eq!(ops.stats().name_waits_refused.load(Ordering::Relaxed), 1);
    let (r, waiting) = recorder(true);
    ops.open(other, ino, libc::O_RDONLY, r);
    assert!(waiting.try_recv().is_err(), "it waits");
    let (r, said) = recorder(true);
    ops.release(ino, fh, r);
    assert_eq!(at_once(&said), Said::Ok);
    let opened = waiting
        .recv_timeout(Duration::from_secs(10))
        .expect("woken");
    let Said::Opened { fh: rfh, .. } = opened else {
        panic!("{opened:?}")
    };
    let (r, said) = recorder(true);
    ops.read(ino, rfh, 0, 100, r);
    assert_eq!(at_once(&said), Said::Data(b"0123456789".to_vec()));
}
