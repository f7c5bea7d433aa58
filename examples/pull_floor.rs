//! What moving a small file between two nodes costs with no dyadfs in the way: the floor under
//! `scripts/bench_small_pull.sh`'s CPU per pulled file.
//!
//! A holder thread and a puller thread per stream, on one loopback TCP connection each, do for
//! every file what a pull must do at least: the puller asks for it by number; the holder reads it
//! from disk (`O_DIRECT`, as a holder reads its cache), checks a crc32c, seals it with
//! AES-128-GCM (as the stream data plane does) and sends it; the puller receives it, opens the
//! seal, checks the crc and stores it: a new file each (create, write, close), an append into one
//! preallocated segment file, or nowhere. No locate, no FUSE request, no publish, no wake-up of
//! another thread: what is left is the bytes' own cost on this machine. The first configuration
//! sends from memory (the network alone); one runs the holder in a process of its own (as two
//! daemons are; `--holder` is that child's mode). Every configuration runs
//! RUNS times, interleaved run by run, each run printed, medians with their spread at the end.
//!
//! `cargo run --release --example pull_floor -- DIR [FILES] [SIZE] [STREAMS] [RUNS]`
//! (DIR: where the holder's files and the puller's stores go, e.g. the cache file system under
//! test; default 2048 files of 262144 bytes, 4 streams, 5 runs). Root drops the page cache before
//! each run, as the benchmark does.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use ring::aead::{AES_128_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

const TAG: usize = 16;

/// Where a file's bytes come from.
#[derive(Clone, Copy, PartialEq)]
enum Source {
    /// The holder sends what its buffer holds: the network alone.
    Memory,
    /// The holder reads each file from disk (`O_DIRECT`) and sends it.
    Disk,
    /// No holder: the puller reads the file itself (buffered, as a fill reads the shared FS).
    Fill,
}

/// Where the puller puts what it received.
#[derive(Clone, Copy, PartialEq)]
enum Store {
    Nowhere,
    FileEach,
    Segment,
}

#[derive(Clone, Copy)]
struct Config {
    from: Source,
    seal: bool,
    store: Store,
    /// The holder in a process of its own, as two daemons are: a switch between the holder
    /// and the puller (or the readers) then changes address spaces, which a switch between
    /// two threads of one process does not.
    apart: bool,
}

impl Config {
    fn name(&self) -> String {
        let store = match self.store {
            Store::Nowhere => "not stored",
            Store::FileEach => "a new file each",
            Store::Segment => "appended to a segment",
        };
        let from = match self.from {
            Source::Memory => "memory",
            Source::Disk => "disk",
            Source::Fill => "filled from disk",
        };
        let seal = if self.seal { "sealed" } else { "plain" };
        let apart = if self.apart { ", two processes" } else { "" };
        format!("{from}, {seal}, {store}{apart}")
    }
}

/// One run's figures: wall time, the CPU time of the holder's and the puller's threads and
/// their context switches, per file.
struct Run {
    secs: f64,
    holder: Usage,
    puller: Usage,
}

/// What a thread used: CPU time in microseconds (user and system, as schedstat counts it) and
/// context switches (voluntary and not: a wait for the network or the disk is one).
#[derive(Clone, Copy, Default)]
struct Usage {
    us: f64,
    switches: f64,
}

impl Usage {
    /// The calling thread's so far.
    fn now() -> Usage {
        // SAFETY: an all-zero rusage is a valid value of the plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid, writable rusage for the call's duration.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        assert_eq!(rc, 0, "getrusage(RUSAGE_THREAD)");
        Usage {
            us: thread_cpu_us(),
            switches: (ru.ru_nvcsw + ru.ru_nivcsw) as f64,
        }
    }

    fn since(self, start: Usage) -> Usage {
        Usage {
            us: self.us - start.us,
            switches: self.switches - start.switches,
        }
    }

    fn add(self, o: Usage) -> Usage {
        Usage {
            us: self.us + o.us,
            switches: self.switches + o.switches,
        }
    }

    fn per(self, files: u32) -> Usage {
        Usage {
            us: self.us / files as f64,
            switches: self.switches / files as f64,
        }
    }
}

/// CPU time of the calling thread in microseconds (user and system, as schedstat counts it).
fn thread_cpu_us() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}

/// A buffer aligned for `O_DIRECT` (4 KiB), `len` rounded up to it.
struct Aligned {
    mem: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let len = len.div_ceil(4096) * 4096;
        let mem = vec![0u8; len + 4096];
        let at = mem.as_ptr().align_offset(4096);
        Aligned { mem, at, len }
    }
    fn bytes(&mut self) -> &mut [u8] {
        &mut self.mem[self.at..self.at + self.len]
    }
}

/// A throwaway key, the same for every stream (whose nonces each count from 0): the floor
/// measures what the cipher costs, not what it keeps secret.
fn key() -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &[7u8; 16]).expect("a 16-byte key"))
}

fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; NONCE_LEN];
    b[4..].copy_from_slice(&n.to_be_bytes());
    Nonce::assume_unique_for_key(b)
}

/// Serves the numbered files of `src` until the puller closes the connection; returns what
/// its thread used.
fn hold(mut conn: TcpStream, src: PathBuf, size: usize, cfg: Config) -> Usage {
    let start = Usage::now();
    let key = key();
    let mut buf = Aligned::new(size + 4 + TAG);
    let mut ask = [0u8; 4];
    let mut sent = 0u64;
    while conn.read_exact(&mut ask).is_ok() {
        let i = u32::from_be_bytes(ask);
        // The file at the aligned start (O_DIRECT), then the tag if sealed, then the crc.
        let out = buf.bytes();
        if cfg.from == Source::Disk {
            let f = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(src.join(format!("{i:05}.bin")))
                .expect("open a holder's file");
            let n = f
                .read_at(&mut out[..size.div_ceil(4096) * 4096], 0)
                .expect("O_DIRECT read");
            assert_eq!(n, size, "a holder's file is SIZE bytes");
        }
        let crc = crc32c::crc32c(&out[..size]);
        let mut len = size;
        if cfg.seal {
            let tag = key
                .seal_in_place_separate_tag(nonce(sent), Aad::from(b"floor"), &mut out[..size])
                .expect("seal");
            out[size..size + TAG].copy_from_slice(tag.as_ref());
            len += TAG;
        }
        out[len..len + 4].copy_from_slice(&crc.to_be_bytes());
        conn.write_all(&out[..len + 4]).expect("send a file");
        sent += 1;
    }
    Usage::now().since(start)
}

/// Asks for `files` in turn, receives and stores each; returns what its thread used.
fn pull(
    mut conn: TcpStream,
    files: Vec<u32>,
    size: usize,
    cfg: Config,
    (src, dst): (&Path, &Path),
    segment: &File,
) -> Usage {
    let start = Usage::now();
    let key = key();
    let mut buf = vec![0u8; size + TAG + 4];
    let len = size + if cfg.seal { TAG } else { 0 };
    for (n, i) in files.into_iter().enumerate() {
        let body = if cfg.from == Source::Fill {
            File::open(src.join(format!("{i:05}.bin")))
                .and_then(|mut f| f.read_exact(&mut buf[..size]))
                .expect("read a source file");
            // The crc a fill records for what it stores.
            std::hint::black_box(crc32c::crc32c(&buf[..size]));
            &mut buf[..size]
        } else {
            conn.write_all(&i.to_be_bytes()).expect("ask for a file");
            conn.read_exact(&mut buf[..len + 4])
                .expect("receive a file");
            let crc = u32::from_be_bytes(buf[len..len + 4].try_into().expect("4 bytes"));
            let body = if cfg.seal {
                key.open_in_place(nonce(n as u64), Aad::from(b"floor"), &mut buf[..len])
                    .expect("open the seal")
            } else {
                &mut buf[..len]
            };
            assert_eq!(crc32c::crc32c(body), crc, "crc of a received file");
            body
        };
        match cfg.store {
            Store::Nowhere => {}
            Store::FileEach => {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(dst.join(format!("{i:05}.bin")))
                    .expect("create a cache file");
                f.write_all(body).expect("write a cache file");
            }
            Store::Segment => segment
                .write_all_at(body, i as u64 * size as u64)
                .expect("append to the segment"),
        }
    }
    Usage::now().since(start)
}

fn drop_caches() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    // Only root may; others measure with whatever the page cache holds.
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

fn one_run(dir: &Path, files: u32, size: usize, streams: u32, cfg: Config) -> Run {
    let dst = dir.join("dst");
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir(&dst).expect("create the puller's directory");
    let segment = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst.join("segment"))
        .expect("create the segment");
    if cfg.store == Store::Segment {
        // SAFETY: a valid open descriptor; fallocate only reserves blocks.
        let rc = unsafe { libc::fallocate(segment.as_raw_fd(), 0, 0, files as i64 * size as i64) };
        assert_eq!(rc, 0, "preallocate the segment");
    }
    drop_caches();
    let src_dir = &dir.join("src");
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
    // Apart: a child process serves, on a listener of its own, and reports what it used.
    let mut apart = cfg
        .apart
        .then(|| HolderProcess::start(src_dir, size, streams, cfg));
    let addr = match &mut apart {
        Some(child) => child.addr,
        None => listener.local_addr().expect("its address"),
    };
    let wall = Instant::now();
    let (holder, puller) = std::thread::scope(|s| {
        let mut holders = Vec::new();
        let mut pullers = Vec::new();
        for k in 0..streams {
            let conn = TcpStream::connect(addr).expect("connect");
            conn.set_nodelay(true).expect("nodelay");
            if !cfg.apart {
                let (served, _) = listener.accept().expect("accept");
                served.set_nodelay(true).expect("nodelay");
                holders.push(s.spawn(move || hold(served, src_dir.clone(), size, cfg)));
            }
            // Stream k pulls every streams-th file, as 4 readers split a shuffled list.
            let mine: Vec<u32> = (k..files).step_by(streams as usize).collect();
            let (dirs, segment) = ((src_dir.as_path(), dst.as_path()), &segment);
            pullers.push(s.spawn(move || pull(conn, mine, size, cfg, dirs, segment)));
        }
        let sum = |hs: Vec<std::thread::ScopedJoinHandle<Usage>>| {
            hs.into_iter()
                .map(|h| h.join().expect("a stream's thread"))
                .fold(Usage::default(), Usage::add)
        };
        let puller = sum(pullers);
        let holder = match apart.take() {
            Some(child) => child.finish(),
            None => sum(holders),
        };
        (holder, puller)
    });
    let secs = wall.elapsed().as_secs_f64();
    Run {
        secs,
        holder: holder.per(files),
        puller: puller.per(files),
    }
}

/// A holder in a child process (this program with `--holder`), serving one run's streams.
struct HolderProcess {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    addr: std::net::SocketAddr,
}

impl HolderProcess {
    fn start(src: &Path, size: usize, streams: u32, cfg: Config) -> HolderProcess {
        let mut child = std::process::Command::new(std::env::current_exe().expect("this program"))
            .arg("--holder")
            .arg(src)
            .args([size.to_string(), streams.to_string()])
            .args([u8::from(cfg.from == Source::Disk), u8::from(cfg.seal)].map(|b| b.to_string()))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the holder's process");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let addr = read_line(&mut out)
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .expect("the holder's address");
        HolderProcess { child, out, addr }
    }

    /// What its threads used, once the pullers closed their connections.
    fn finish(mut self) -> Usage {
        let line = read_line(&mut self.out);
        let used: Vec<f64> = line
            .strip_prefix("used ")
            .map(|u| u.split(' ').filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default();
        assert!(self.child.wait().expect("the holder's exit").success());
        match used[..] {
            [us, switches] => Usage { us, switches },
            _ => panic!("the holder's process reported {line:?}"),
        }
    }
}

fn read_line(from: &mut impl std::io::BufRead) -> String {
    let mut line = String::new();
    from.read_line(&mut line).expect("read the holder's output");
    line.trim_end().to_string()
}

/// The child's side of [`HolderProcess`]: `--holder SRC SIZE STREAMS DISK SEAL` serves STREAMS
/// connections on a loopback listener whose address it prints, then prints what it used.
fn holder_process(args: &[String]) {
    let [src, size, streams, disk, seal] = args else {
        panic!("--holder SRC SIZE STREAMS DISK SEAL");
    };
    let number = |s: &String| s.parse::<usize>().expect("a number");
    let cfg = Config {
        from: if number(disk) == 1 {
            Source::Disk
        } else {
            Source::Memory
        },
        seal: number(seal) == 1,
        store: Store::Nowhere,
        apart: false,
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
    println!("listening {}", listener.local_addr().expect("its address"));
    std::io::stdout().flush().expect("tell the puller");
    let (src, size) = (PathBuf::from(src), number(size));
    let used = std::thread::scope(|s| {
        let served: Vec<_> = (0..number(streams))
            .map(|_| {
                let (conn, _) = listener.accept().expect("accept");
                conn.set_nodelay(true).expect("nodelay");
                let src = src.clone();
                s.spawn(move || hold(conn, src, size, cfg))
            })
            .collect();
        served
            .into_iter()
            .map(|h| h.join().expect("a holder"))
            .fold(Usage::default(), Usage::add)
    });
    println!("used {} {}", used.us, used.switches);
}

fn median_spread(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    format!(
        "{:.1} ({:.1}-{:.1})",
        v[(v.len() - 1) / 2],
        v[0],
        v[v.len() - 1]
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--holder") {
        return holder_process(&args[1..]);
    }
    let Some(dir) = args.first().map(PathBuf::from) else {
        eprintln!("usage: pull_floor DIR [FILES] [SIZE] [STREAMS] [RUNS]");
        std::process::exit(2);
    };
    let arg = |n: usize, default: u64| {
        args.get(n)
            .map_or(default, |s| s.parse().expect("a number"))
    };
    let (files, size) = (arg(1, 2048) as u32, arg(2, 262144) as usize);
    let (streams, runs) = (arg(3, 4) as u32, arg(4, 5) as usize);
    let src = dir.join("src");
    std::fs::create_dir_all(&src).expect("create DIR/src");
    for i in 0..files {
        let p = src.join(format!("{i:05}.bin"));
        if std::fs::metadata(&p).map(|m| m.len() as usize).ok() != Some(size) {
            let bytes: Vec<u8> = (0..size)
                .map(|b| (b as u32 ^ i.wrapping_mul(2654435761)) as u8)
                .collect();
            std::fs::write(&p, bytes).expect("write a holder's file");
        }
    }
    // Each adds one cost to the one before it (the segment differs from the file each only in
    // the store, the two processes only in the holder's process).
    let cfg = |from, seal, store, apart| Config {
        from,
        seal,
        store,
        apart,
    };
    let configs = [
        cfg(Source::Memory, false, Store::Nowhere, false),
        cfg(Source::Disk, false, Store::Nowhere, false),
        cfg(Source::Disk, true, Store::Nowhere, false),
        cfg(Source::Disk, true, Store::FileEach, false),
        cfg(Source::Disk, true, Store::Segment, false),
        cfg(Source::Disk, true, Store::FileEach, true),
        cfg(Source::Fill, false, Store::FileEach, false),
    ];
    println!(
        "{files} files of {size} bytes, {streams} streams, {runs} runs, in {}",
        dir.display()
    );
    let mut results: Vec<Vec<Run>> = configs.iter().map(|_| Vec::new()).collect();
    for run in 1..=runs {
        for (c, cfg) in configs.iter().enumerate() {
            let r = one_run(&dir, files, size, streams, *cfg);
            println!(
                "run {run} {:<38} {:>8.0} files/s  holder {:>6.1} us/file {:>4.1} switches  \
                 puller {:>6.1} us/file {:>4.1} switches",
                cfg.name(),
                files as f64 / r.secs,
                r.holder.us,
                r.holder.switches,
                r.puller.us,
                r.puller.switches,
            );
            results[c].push(r);
        }
    }
    let _ = std::fs::remove_dir_all(dir.join("dst"));
    println!("medians (min-max) of {runs} runs:");
    for (cfg, rs) in configs.iter().zip(results) {
        let median = |f: &dyn Fn(&Run) -> f64| median_spread(rs.iter().map(f).collect());
        println!(
            "  {:<38} files/s {}  holder {} us, {} switches  puller {} us, {} switches",
            cfg.name(),
            median(&|r| files as f64 / r.secs),
            median(&|r| r.holder.us),
            median(&|r| r.holder.switches),
            median(&|r| r.puller.us),
            median(&|r| r.puller.switches),
        );
    }
}
