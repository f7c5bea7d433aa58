//! The life of a mount: checking the user's input, daemonizing (the parent returns once the
//! mount is ready), running the FUSE session, and unmounting on SIGTERM/SIGINT/SIGHUP or
//! `fusermount3 -u`. [`wiring`] builds the parts of a mount (cache, filesystem, and in a
//! cluster the locator, control server and pullers), which this module mounts and serves
//! through `fuse::session`; [`tool`] runs the data plane alone.

pub mod config;
mod error;
pub(crate) mod members;
mod mountinfo;
mod opens;
pub use mountinfo::is_mount_point;
use mountinfo::mount_device;
mod stop;
mod takeover;
mod tool;
mod undo;
mod version;
pub(crate) mod wiring;

pub use error::UserError;

pub use tool::{pull, serve as serve_transport};
pub use version::long_version;

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::fs::DyadFs;
use crate::fuse::ops::Ops;
use crate::fuse::session::{Mounted, SessionError, SessionSpec};
use crate::transport::auth::Secret;
use config::{MountConfig, Replicate};
use wiring::{Built, Wired};

/// Environment variable through which a background daemon reports readiness to its parent.
const READY_FD_ENV: &str = "DYADFS_READY_FD";

/// Checks everything that can be checked before mounting, so bad input fails fast with a
/// message naming the culprit and nothing is left mounted.
pub fn validate(args: &MountConfig) -> Result<(), UserError> {
    check_dev_fuse()?;
    let canonical = check_mount_point(&args.mountpoint)?;
    let ssd = cache_dir_path(args)?;
    if ssd.starts_with(&canonical) {
        return Err(UserError::CacheInsideMount(args.ssd.clone()));
    }
    check_cluster_args(args)?;
    let not_writable = |source| UserError::CacheNotWritable {
        path: args.ssd.clone(),
        source,
    };
    if !args.managed {
        match fs::metadata(&args.backing) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(UserError::BackingNotDir(args.backing.clone())),
            Err(_) => return Err(UserError::NoBacking(args.backing.clone())),
        }
    }
    // Everything that could be checked without it is: now the cache dir. A refusal from here
    // on leaves it as it was: `mount` undoes what this call made (see `undo`).
    match fs::DirBuilder::new().mode(0o700).create(&args.ssd) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(not_writable(e)),
    }
    prepare_cache_dir(args)
}

/// /dev/fuse is there, and a plain user may open it.
fn check_dev_fuse() -> Result<(), UserError> {
    match fs::metadata("/dev/fuse") {
        Ok(m) if m.file_type().is_char_device() => {}
        _ => {
            return Err(UserError::NoFuse);
        }
    }
    // A plain user's mount opens /dev/fuse itself first: said with the path and the fix, not
    // as a bare "Permission denied" after the cache dir was made.
    if crate::sys::euid() != 0
        && let Err(e) = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/fuse")
    {
        return Err(UserError::NoFuseAccess(e));
    }
    Ok(())
}

/// The mount point is an empty directory nothing is mounted on (a dead mount said as such);
/// its canonical path.
fn check_mount_point(mnt: &PathBuf) -> Result<PathBuf, UserError> {
    let meta = match fs::metadata(mnt) {
        Ok(m) => m,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)) => {
            return Err(UserError::DeadMount(mnt.clone()));
        }
        // A mount point that cannot be looked at is a mount whose daemon is gone (the
        // io_uring transport may say so otherwise than ENOTCONN).
        Err(_) if std::path::absolute(mnt).is_ok_and(|a| is_mount_point(&a)) => {
            return Err(UserError::DeadMount(mnt.clone()));
        }
        Err(_) => return Err(UserError::NoMountPoint(mnt.clone())),
    };
    if !meta.is_dir() {
        return Err(UserError::MountPointNotDir(mnt.clone()));
    }
    let mount_point = |source| UserError::MountPoint {
        path: mnt.clone(),
        source,
    };
    let canonical = fs::canonicalize(mnt).map_err(mount_point)?;
    if is_mount_point(&canonical) {
        // A stat may be answered from what the kernel kept of a daemon that died; a listing
        // needs the daemon, so it tells a dead mount from a live one.
        return Err(match fs::read_dir(mnt) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => UserError::DeadMount(mnt.clone()),
            _ => UserError::AlreadyMounted(mnt.clone()),
        });
    }
    let mut listing = fs::read_dir(mnt).map_err(mount_point)?;
    if listing.next().is_some() {
        return Err(UserError::MountPointNotEmpty(mnt.clone()));
    }
    Ok(canonical)
}

/// Where the cache dir is or will be: only its last component may be missing (a typo in its
/// parent is an error, not a chain of new directories). It must not be inside the mount.
fn cache_dir_path(args: &MountConfig) -> Result<PathBuf, UserError> {
    let not_writable = |source| UserError::CacheNotWritable {
        path: args.ssd.clone(),
        source,
    };
    match fs::canonicalize(&args.ssd) {
        Ok(real) => Ok(real),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (Some(parent), Some(name)) = (args.ssd.parent(), args.ssd.file_name()) else {
                return Err(not_writable(e));
            };
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            Ok(fs::canonicalize(parent).map_err(not_writable)?.join(name))
        }
        Err(e) => Err(not_writable(e)),
    }
}

/// A cluster's options hold together (the data plane, the node id, the peers file); cluster
/// options on a single node are refused; a job secret given loads.
fn check_cluster_args(args: &MountConfig) -> Result<(), UserError> {
    if args.cluster.is_cluster() {
        args.cluster
            .data_plane
            .ucx_tls(args.cluster.ucx_over_tcp)
            .map_err(UserError::UcxOverTcp)?;
        let id = members::node_id(args)?;
        if let Some(file) = &args.cluster.peers {
            members::membership(file, id)?;
        }
    } else if args.cluster.replicate == Replicate::On {
        return Err(UserError::ReplicateAlone);
    } else if args.cluster.listen.is_some() {
        // A cluster's address on a single node would be ignored: said instead.
        return Err(UserError::NeedsCluster("--listen"));
    }
    // Checked on a single node too: `DYADFS_SECRET_FILE` may be set for every mount of a job.
    if let Some(file) = &args.cluster.secret_file {
        Secret::load(file).map_err(UserError::Secret)?;
    } else if args.cluster.is_cluster()
        && args.cluster.rendezvous.is_none()
        && !args.cluster.insecure
    {
        return Err(UserError::NoSecret);
    }
    Ok(())
}

/// Checks the cache dir is private and writable, and makes a managed directory's root in it.
fn prepare_cache_dir(args: &MountConfig) -> Result<(), UserError> {
    let not_writable = |source| UserError::CacheNotWritable {
        path: args.ssd.clone(),
        source,
    };
    // Root writes, trusts and serves what is in the cache dir: nobody else may be able to
    // plant anything in it (a symlink, a forged index) or move it.
    crate::sys::private::check_private_dir(&args.ssd).map_err(|source| UserError::CacheDir {
        path: args.ssd.clone(),
        source,
    })?;
    let probe = args.ssd.join(".dyadfs-write-probe");
    let _ = fs::remove_file(&probe);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&probe)
        .and_then(|mut f| f.write_all(b"probe"))
        .map_err(not_writable)?;
    let _ = fs::remove_file(&probe);
    if args.managed {
        managed_root(&args.backing).map_err(not_writable)?;
    }
    Ok(())
}

/// The empty directory a managed directory presents as its dataset: created if missing, mode
/// 1777 like /tmp (the mount's root, where any user's producer may create its files and only
/// remove its own), and never anything in it (nothing is ever written there: produced files live
/// in the cache).
fn managed_root(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    match fs::create_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // Checked and changed through one descriptor, never a symlink: a swap of the path between
    // the check and the chmod cannot make root open up another directory.
    let not_ours = || {
        let me = crate::sys::euid();
        std::io::Error::other(format!("{} is not a directory of uid {me}", path.display()))
    };
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) => not_ours(),
            _ => e,
        })?;
    let meta = dir.metadata()?;
    if !meta.is_dir() || meta.uid() != crate::sys::euid() {
        return Err(not_ours());
    }
    if fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?
        .next()
        .is_some()
    {
        return Err(std::io::Error::other(format!(
            "{} must be empty (a managed directory's files live in the cache)",
            path.display()
        )));
    }
    dir.set_permissions(fs::Permissions::from_mode(0o1777))
}

/// `dyadfs mount`: validate, then run in the foreground or spawn the daemon and wait for it.
pub fn mount(args: MountConfig) -> Result<(), UserError> {
    let before = undo::Before::take(&args.ssd);
    let ssd = args.ssd.clone();
    let log = args
        .log_file
        .clone()
        .unwrap_or_else(|| args.ssd.join("dyadfs.log"));
    let result = mount_checked(args);
    match &result {
        // A daemon that served ends as it likes: what it made is the cache.
        _ if SERVED.load(std::sync::atomic::Ordering::Relaxed) => {}
        Ok(()) => {}
        // Its log is the only account of a daemon that died without a word.
        Err(UserError::DaemonDied { .. }) => before.undo(&ssd, Some(&log)),
        Err(_) => before.undo(&ssd, None),
    }
    result
}

/// Set once this process's mount is ready: a failure after that undoes nothing.
static SERVED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// [`mount`], leaving its undoing to the caller.
fn mount_checked(args: MountConfig) -> Result<(), UserError> {
    validate(&args)?;
    if args.foreground {
        return run(args);
    }
    let log = args
        .log_file
        .clone()
        .unwrap_or_else(|| args.ssd.join("dyadfs.log"));
    // It holds every user's paths: 0600, never through a symlink, never another user's file.
    let log_file =
        crate::sys::private::open_private(&log, true).map_err(|source| UserError::LogFile {
            path: log.clone(),
            source,
        })?;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let source = std::io::Error::last_os_error();
        return Err(UserError::Start {
            what: "pipe",
            source,
        });
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let start = |what| move |source| UserError::Start { what, source };
    let exe = std::env::current_exe().map_err(start("cannot find own executable"))?;
    let write_fd = fds[1];
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .arg("--foreground")
        .env(READY_FD_ENV, write_fd.to_string())
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().map_err(start("log file"))?)
        .stderr(log_file);
    // SAFETY: the closure runs in the forked child before exec and only calls the
    // async-signal-safe setsid and fcntl.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            // Let the readiness pipe survive exec.
            libc::fcntl(write_fd, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(start("cannot start the daemon"))?;
    drop(write_end);
    let mut msg = String::new();
    let _ = fs::File::from(read_end).read_to_string(&mut msg);
    if msg.trim() != "ready" {
        // A refused mount leaves nothing: not even the daemon, still letting go of the cache
        // directory's lock (the next mount of it was refused as "in use", now and then).
        let deadline = std::time::Instant::now() + STOP_GRACE;
        while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    match msg.trim() {
        "ready" => Ok(()),
        "" => Err(UserError::DaemonDied {
            pid: child.id(),
            log,
        }),
        err => Err(UserError::Daemon(err.to_string())),
    }
}

/// Reports the outcome of startup to a waiting parent, if there is one.
fn report(outcome: &str) {
    if let Some(fd) = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    {
        // SAFETY: the parent passed us this descriptor, which nothing else in this process uses;
        // taking ownership closes it after the write.
        let mut f = unsafe { fs::File::from_raw_fd(fd) };
        let _ = f.write_all(outcome.as_bytes());
        // SAFETY: removing our own environment variable before any other thread reads it.
        unsafe { std::env::remove_var(READY_FD_ENV) };
    }
}

/// Runs the daemon until unmounted. Exits 0 on a clean unmount.
fn run(mut args: MountConfig) -> Result<(), UserError> {
    if std::env::var_os(READY_FD_ENV).is_some() {
        // A daemon must not pin the directory it was started from (it may be unmounted).
        for p in [&mut args.mountpoint, &mut args.ssd, &mut args.backing]
            .into_iter()
            .chain(args.cluster.peers.as_mut())
        {
            if let Ok(abs) = fs::canonicalize(&*p) {
                *p = abs;
            }
        }
        // Against the caller's directory too, but with their final symlink kept: the secret
        // and the rendezvous directory are checked for one when they are opened.
        for p in args
            .cluster
            .secret_file
            .iter_mut()
            .chain(args.cluster.rendezvous.as_mut())
        {
            if let Ok(abs) = std::path::absolute(&*p) {
                *p = abs;
            }
        }
        let _ = std::env::set_current_dir("/");
    }
    opens::decide(&mut args);
    let result = wiring::build(&args).and_then(|wired| match wired {
        Wired::Single(built) => run_session(&args, built),
        Wired::Cluster(built) => run_session(&args, built),
    });
    if let Err(e) = &result {
        report(&e.to_string());
    }
    result
}

/// How long a daemon told to stop waits for its requests before it exits without them.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(5);

/// Mounts what was built, reports readiness, and serves until unmounted; a cluster's control
/// runtime stops after the session.
fn run_session<S: crate::core::source::Source>(
    args: &MountConfig,
    built: Built<S>,
) -> Result<(), UserError> {
    let Built {
        fs,
        signals,
        runtime,
    } = built;
    let result = serve_session(args, fs, signals);
    if let Some(runtime) = runtime {
        runtime.shutdown_timeout(wiring::RUNTIME_GRACE);
    }
    result
}

/// Mounts `fs`, reports readiness, and serves until unmounted.
fn serve_session<S: crate::core::source::Source>(
    args: &MountConfig,
    fs: DyadFs<S>,
    set: crate::sys::StopSignals,
) -> Result<(), UserError> {
    let mut mounted = Mounted::mount(fs, &session_spec(args)).map_err(|e| match e {
        SessionError::Start { what, source } => UserError::Start { what, source },
        SessionError::Mount(source) => UserError::Mount {
            path: args.mountpoint.clone(),
            source,
        },
    })?;
    let running = mounted.ops().running().clone();
    stop::start_stop_on_signal(set, mounted.unmounter(), &args.mountpoint, running)?;
    start_kernel_readahead(args, mounted.ops().clone())?;
    tracing::info!(
        mountpoint = %args.mountpoint.display(),
        backing = %args.backing.display(),
        ssd = %args.ssd.display(),
        "mounted"
    );
    SERVED.store(true, std::sync::atomic::Ordering::Relaxed);
    report("ready");
    mounted.run().map_err(UserError::Session)?;
    tracing::info!("unmounted; exiting");
    Ok(())
}

/// What the FUSE session is asked to be, from the mount's configuration.
fn session_spec(args: &MountConfig) -> SessionSpec {
    SessionSpec {
        mountpoint: args.mountpoint.clone(),
        // The source an fstab line names (`managed`, or the dataset's directory), so `mount -a`
        // recognises the line as mounted.
        source: if args.managed {
            "managed".into()
        } else {
            args.backing.display().to_string()
        },
        read_only: args.read_only,
        options: args.options.clone(),
        threads: args.threads,
        transport: args.fuse_transport,
    }
}

/// The kernel reads ahead of a daemon-served file (a packed sample, a large file not passed
/// through, `--no-open`) and around a fault in a mapped file it does not pass through as far as
/// its readahead, which INIT sets to at most 128 KiB, in READs of at most MAX_REQUEST: a 256 KiB
/// sample takes two READs. Set to --kernel-readahead once INIT is done (the stat waits for it);
/// by default to [`MAPPED_READAROUND`] where complete files pass through and large ones are
/// read by direct I/O, which leaves mapped large files as almost all the readahead does.
fn start_kernel_readahead<S: crate::core::source::Source>(
    args: &MountConfig,
    ops: std::sync::Arc<Ops<S>>,
) -> Result<(), UserError> {
    if args.kernel_readahead == Some(0) {
        return Ok(());
    }
    let (mountpoint, asked) = (args.mountpoint.clone(), args.kernel_readahead);
    std::thread::Builder::new()
        .name("readahead".into())
        .spawn(move || {
            // Nothing here asks the mount itself: a request to its own daemon that one of the
            // daemon's threads has taken is waited out uninterruptibly, so a daemon killed
            // meanwhile would never exit (a stat of the mount point did that).
            let Some(dev) = mount_device(&mountpoint) else {
                tracing::info!("the mount's device not found: its readahead stays the kernel's");
                return;
            };
            // INIT says what the kernel agreed to; its reply, processed once `init` returns,
            // lowers the readahead to what the daemon asked at most, so it is set after that
            // and set again if that came later.
            let start = Instant::now();
            while !ops.initialised() {
                if start.elapsed() > Duration::from_secs(60) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let bytes = match asked {
                Some(b) => b,
                None if ops.reads_large_files_directly() => MAPPED_READAROUND,
                None => return,
            };
            let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
            for wait in [50, 500] {
                std::thread::sleep(Duration::from_millis(wait));
                if crate::sys::readahead_kib(dev).is_ok_and(|k| k == kib) {
                    continue;
                }
                match crate::sys::set_readahead_kib(dev, kib) {
                    Ok(()) => tracing::debug!(kib, "readahead of the mount set"),
                    // Not root (mounted through fusermount3): reads keep the kernel's 128 KiB.
                    Err(e) => {
                        tracing::info!(error = %e, "the mount's readahead stays the kernel's");
                        return;
                    }
                }
            }
        })
        .map_err(|source| UserError::Start {
            what: "readahead thread",
            source,
        })?;
    Ok(())
}

/// The mount's readahead by default where complete files pass through and large files are
/// read by direct I/O: how far the kernel reads around a fault in a mapped large file not
/// cached whole. 2,000 random 110 KiB records of a 2 GiB file mapped without advice fetched
/// 2.89x their bytes at the kernel's 128 KiB, 1.57x at 32K, 1.48x at 24K, 1.28x at 16K; a cold
/// 1 GiB file mapped and read in order took from as long as at 128K to 24% longer at 24K
/// (two alternated series), 1.6x at 16K (docs/BENCHMARKS.md).
const MAPPED_READAROUND: u64 = 24 << 10;
