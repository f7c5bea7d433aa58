//! `dyadfs warm`: stages files into a running mount's cache before a job reads them. It reads
//! them through the mount, so each is fetched the way a reader would fetch it: pulled from a
//! peer that holds it, or read from the shared file system by one node of the cluster while
//! the others wait for it (the locator's exactly-once). What it staged stays staged whatever
//! stops it.

use std::io::{BufRead, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::daemon::UserError;
use crate::stats::{Snapshot, counted, short as human};

pub struct WarmConfig {
    pub mountpoint: PathBuf,
    pub paths: Vec<PathBuf>,
    pub list: Option<PathBuf>,
    pub threads: usize,
    pub cluster: bool,
}

/// Set by SIGINT/SIGTERM: the workers finish the file they read and stop.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// The files to stage: every file under each path (directories walked), in list order.
fn expand(
    roots: &[PathBuf],
    files: &mut Vec<PathBuf>,
    missing: &mut Vec<PathBuf>,
) -> Result<(), UserError> {
    for root in roots {
        let meta = match std::fs::metadata(root) {
            Ok(m) => m,
            Err(_) => {
                missing.push(root.clone());
                continue;
            }
        };
        if meta.is_file() {
            files.push(root.clone());
        } else if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(root)
                .map_err(|source| UserError::WarmRead {
                    path: root.clone(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            entries.sort();
            expand(&entries, files, missing)?;
        }
    }
    Ok(())
}

/// A path as given (absolute, or relative to the current directory), checked to be under the
/// mount.
fn under_mount(mnt: &Path, p: &Path) -> Result<PathBuf, UserError> {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|source| UserError::WarmRead {
                path: p.to_path_buf(),
                source,
            })?
            .join(p)
    };
    if abs.starts_with(mnt) {
        Ok(abs)
    } else {
        Err(UserError::NotUnderMount {
            path: p.to_path_buf(),
            mountpoint: mnt.to_path_buf(),
        })
    }
}

/// What a run moved, from the daemon's counters before and after.
fn summary(before: &Snapshot, after: &Snapshot, files: usize, secs: f64) -> String {
    let d = |a: u64, b: u64| a.saturating_sub(b);
    format!(
        "staged {} in {secs:.1} s: {} from the shared file system, {} from peers, \
         {} already cached here; cache now {} in {}",
        counted(files as u64, "file"),
        human(d(after.bytes_from_backing, before.bytes_from_backing)),
        human(d(after.bytes_from_peers, before.bytes_from_peers)),
        counted(d(after.local_hits, before.local_hits), "file"),
        human(after.cached_bytes),
        counted(after.cached_files, "file"),
    )
}

/// Reads `path` whole (and tells the kernel to drop its pages: the cache disk holds it now);
/// returns its size.
fn stage(path: &Path, buf: &mut [u8]) -> std::io::Result<u64> {
    let mut f = std::fs::File::open(path)?;
    let mut n = 0u64;
    loop {
        match f.read(buf)? {
            0 => break,
            k => n += k as u64,
        }
    }
    // SAFETY: a valid descriptor; advice only.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(n)
}

pub fn warm(cfg: WarmConfig) -> Result<(), UserError> {
    let given = std::fs::canonicalize(&cfg.mountpoint)
        .map_err(|_| UserError::NotOurs(cfg.mountpoint.clone()))?;
    // A directory under a mount names both the mount and what to stage (`dyadfs warm
    // /dyad/train`): the mount is the nearest mount point above it.
    let mnt = given
        .ancestors()
        .find(|a| crate::daemon::is_mount_point(a))
        .unwrap_or(&given)
        .to_path_buf();
    // The mount found above a path that is not in one (`/`, say) is not what was asked about.
    let before = super::stats(&mnt).map_err(|e| match e {
        UserError::NotOurs(_) => UserError::NotOurs(cfg.mountpoint.clone()),
        e => e,
    })?;
    let roots = roots(&cfg, &mnt, &given)?;
    let (mut files, mut missing) = (Vec::new(), Vec::new());
    expand(&roots, &mut files, &mut missing)?;
    for m in &missing {
        eprintln!("dyadfs warm: no such file or directory: {}", m.display());
    }
    if cfg.cluster {
        // This node's share: the same split on every node, by the path under the mount.
        let (rank, n) = (before.node_rank, before.members.max(1));
        files.retain(|f| {
            let rel = f.strip_prefix(&mnt).unwrap_or(f).to_string_lossy();
            crate::core::path_hash(&rel) % n == rank
        });
    }
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let started = Instant::now();
    let (staged, failed) = stage_all(&files, cfg.threads);
    let after = super::stats(&mnt)?;
    println!(
        "{}",
        summary(&before, &after, staged, started.elapsed().as_secs_f64())
    );
    for (f, e) in &failed {
        eprintln!("dyadfs warm: {}: {e}", f.display());
    }
    if STOP.load(Ordering::Relaxed) {
        return Err(UserError::WarmInterrupted {
            staged,
            total: files.len(),
        });
    }
    if !missing.is_empty() || !failed.is_empty() {
        return Err(UserError::WarmIncomplete {
            missing: missing.len(),
            failed: failed.len(),
        });
    }
    Ok(())
}

/// What to stage, as the command line names it: the paths given, the lines of `--list` (`-`:
/// standard input), the directory under the mount the command was given, else the whole mount.
fn roots(cfg: &WarmConfig, mnt: &Path, given: &Path) -> Result<Vec<PathBuf>, UserError> {
    let mut roots = Vec::new();
    if mnt != given && cfg.paths.is_empty() && cfg.list.is_none() {
        roots.push(given.to_path_buf());
    }
    for p in &cfg.paths {
        roots.push(under_mount(mnt, p)?);
    }
    if let Some(list) = &cfg.list {
        let read = |source| UserError::WarmRead {
            path: list.clone(),
            source,
        };
        let reader: Box<dyn BufRead> = if list == Path::new("-") {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(list).map_err(read)?,
            ))
        };
        for line in reader.lines() {
            let line = line.map_err(read)?;
            let line = line.trim();
            if !line.is_empty() {
                roots.push(under_mount(mnt, Path::new(line))?);
            }
        }
    }
    if roots.is_empty() && cfg.paths.is_empty() && cfg.list.is_none() {
        roots.push(mnt.to_path_buf());
    }
    Ok(roots)
}

/// Reads `files` through the mount on `threads` threads, with progress, until done or a signal
/// stops them; returns how many were read (failed ones included) and the failures.
fn stage_all(files: &[PathBuf], threads: usize) -> (usize, Vec<(PathBuf, std::io::Error)>) {
    let total_bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let bar = progress(files.len() as u64, total_bytes);
    let next = AtomicUsize::new(0);
    let done_files = AtomicU64::new(0);
    let failed: Mutex<Vec<(PathBuf, std::io::Error)>> = Mutex::default();
    std::thread::scope(|s| {
        for _ in 0..threads.min(files.len().max(1)) {
            s.spawn(|| {
                let mut buf = vec![0u8; 1 << 20];
                while !STOP.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(f) = files.get(i) else { break };
                    match stage(f, &mut buf) {
                        Ok(n) => bar.inc_bytes(n),
                        Err(e) => crate::core::sync::lock(&failed).push((f.clone(), e)),
                    }
                    done_files.fetch_add(1, Ordering::Relaxed);
                    bar.inc_file();
                }
            });
        }
        // The progress of a run whose output is not a terminal: a plain line every 2 s.
        s.spawn(|| {
            while done_files.load(Ordering::Relaxed) < files.len() as u64
                && !STOP.load(Ordering::Relaxed)
            {
                std::thread::sleep(Duration::from_millis(200));
                bar.tick_plain();
            }
        });
    });
    bar.finish();
    let failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
    (done_files.load(Ordering::Relaxed) as usize, failed)
}

/// A live bar (files, bytes, rate, ETA) on a terminal; plain lines otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    files: (AtomicU64, u64),
    bytes: (AtomicU64, u64),
    started: Instant,
    last_line: Mutex<Instant>,
}

fn progress(files: u64, bytes: u64) -> Progress {
    use std::io::IsTerminal;
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(bytes);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} \
                 {binary_bytes_per_sec} ETA {eta} {msg}",
            )
            .expect("a valid template"),
        );
        b
    });
    Progress {
        bar,
        files: (AtomicU64::new(0), files),
        bytes: (AtomicU64::new(0), bytes),
        started: Instant::now(),
        last_line: Mutex::new(Instant::now()),
    }
}

impl Progress {
    fn inc_bytes(&self, n: u64) {
        self.bytes.0.fetch_add(n, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    fn inc_file(&self) {
        let done = self.files.0.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(b) = &self.bar {
            b.set_message(format!("{done}/{} files", self.files.1));
        }
    }

    fn tick_plain(&self) {
        if self.bar.is_some() {
            return;
        }
        let mut last = crate::core::sync::lock(&self.last_line);
        if last.elapsed() >= Duration::from_secs(2) {
            *last = Instant::now();
            eprintln!("{}", self.line());
        }
    }

    fn line(&self) -> String {
        let (files, bytes) = (
            self.files.0.load(Ordering::Relaxed),
            self.bytes.0.load(Ordering::Relaxed),
        );
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = bytes as f64 / secs;
        let eta = if rate > 0.0 {
            format!("{:.0} s", self.bytes.1.saturating_sub(bytes) as f64 / rate)
        } else {
            "?".into()
        };
        format!(
            "warm: {files}/{} files, {} of {}, {}/s, ETA {eta}",
            self.files.1,
            human(bytes),
            human(self.bytes.1),
            human(rate as u64),
        )
    }

    fn finish(&self) {
        match &self.bar {
            Some(b) => b.finish_and_clear(),
            None => eprintln!("{}", self.line()),
        }
    }
}
