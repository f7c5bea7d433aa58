//! The FUSE session, made and run: the mount (its options, as the mount table shows them, and
//! who may use it), the transport its requests come by (the ring where the kernel took it at
//! INIT, else /dev/fuse), the kernel told which inodes the file system sheds, and the session
//! served until it is unmounted. The daemon describes the mount as plain data
//! ([`SessionSpec`]) and holds it through [`Mounted`] and [`Unmounter`]: fuser's types stay
//! here.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::dev::{FuseAdapter, FuseTransport};
use super::ops::{Access, Ops};
use super::ring;
use crate::core::source::Source;
use crate::fs::{DyadFs, InodeShedder};

/// What the session is asked to be: the daemon's part of a mount's configuration.
pub struct SessionSpec {
    pub mountpoint: PathBuf,
    /// The source the mount table shows: what an fstab line names (`managed`, or the dataset's
    /// directory), so `mount -a` recognises the line as mounted.
    pub source: String,
    pub read_only: bool,
    /// The FUSE mount options asked for (`-o`).
    pub options: Vec<String>,
    /// The request threads.
    pub threads: u16,
    pub transport: FuseTransport,
}

/// Why a session was not made.
#[derive(Debug)]
pub enum SessionError {
    /// One of its threads did not start.
    Start {
        what: &'static str,
        source: io::Error,
    },
    /// The kernel refused the mount, or it was unmounted again: `--fuse-transport uring` where
    /// the ring cannot be had.
    Mount(io::Error),
}

/// A mounted session, not yet served.
pub struct Mounted<S: Source> {
    session: fuser::Session<FuseAdapter<S>>,
    ops: Arc<Ops<S>>,
}

impl<S: Source> Mounted<S> {
    /// Mounts `fs` as `spec` asks, with its transport chosen and the shedding of its inodes
    /// started; requests are served once [`Mounted::run`] is called.
    pub fn mount(fs: DyadFs<S>, spec: &SessionSpec) -> Result<Self, SessionError> {
        let config = session_config(spec);
        let (adapter, ops, shedder) = adapter(fs, spec)?;
        let owner = crate::sys::euid();
        ops.set_access(match config.acl {
            fuser::SessionACL::All => Access::All,
            fuser::SessionACL::RootAndOwner => Access::RootAndOwner(owner),
            fuser::SessionACL::Owner => Access::Owner(owner),
        });
        let mut session =
            fuser::Session::new(adapter, &spec.mountpoint, &config).map_err(SessionError::Mount)?;
        ops.set_notifier(session.notifier());
        let dev = match ring::find_device() {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(error = %e, "the session's /dev/fuse not found: no passthrough, no ring");
                None
            }
        };
        start_transport(spec, &ops, &mut session, dev)?;
        start_inode_shedding(shedder, session.notifier())?;
        Ok(Mounted { session, ops })
    }

    /// Serves the mount another process made whose `/dev/fuse` descriptor is `fd` (a user's
    /// mount, made by `fusermount3` with the user's ids, served by the node service). Nobody is
    /// refused here: the kernel admits only that user to a user's mount (and others only with
    /// `allow_other`, which the node's administrator must allow), and the file system judges
    /// every caller's rights itself (`fs::rights`).
    pub fn from_fd(
        fs: DyadFs<S>,
        fd: std::os::fd::OwnedFd,
        spec: &SessionSpec,
    ) -> Result<Self, SessionError> {
        let config = session_config(spec);
        let (adapter, ops, shedder) = adapter(fs, spec)?;
        ops.set_access(Access::All);
        let dev = fd.try_clone().map_err(|source| SessionError::Start {
            what: "the device's descriptor",
            source,
        })?;
        let mut session = fuser::Session::from_fd(adapter, fd, fuser::SessionACL::All, config)
            .map_err(SessionError::Mount)?;
        ops.set_notifier(session.notifier());
        start_transport(spec, &ops, &mut session, Some(dev))?;
        start_inode_shedding(shedder, session.notifier())?;
        Ok(Mounted { session, ops })
    }

    /// The request handlers (shared with the ring's threads).
    pub fn ops(&self) -> &Arc<Ops<S>> {
        &self.ops
    }

    /// What unmounts the session from another thread.
    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter(self.session.unmount_callable())
    }

    /// Serves the session's requests until it is unmounted.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

/// The kernel adapter over a file system, its request handlers, and what sheds its inodes.
type Adapted<S> = (FuseAdapter<S>, Arc<Ops<S>>, InodeShedder);

fn adapter<S: Source>(fs: DyadFs<S>, spec: &SessionSpec) -> Result<Adapted<S>, SessionError> {
    let shedder = fs.shedder();
    let adapter = FuseAdapter::new(fs, &spec.mountpoint, spec.transport).map_err(|source| {
        SessionError::Start {
            what: "prefetch threads",
            source,
        }
    })?;
    let ops = adapter.ops();
    Ok((adapter, ops, shedder))
}

/// Unmounts a [`Mounted`] session from another thread (a stop signal's).
pub struct Unmounter(fuser::SessionUnmounter);

impl Unmounter {
    /// Unmounts the session: refused (EBUSY) while files are open on it.
    pub fn unmount(&mut self) -> io::Result<()> {
        self.0.unmount()
    }
}

/// fuser's configuration of the mount: its source and type as the mount table shows them, the
/// options every mount has, those asked for (`-o`), the request threads.
fn session_config(spec: &SessionSpec) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(spec.source.clone()),
        // The type the mount table shows, `fuse.dyadfs` (so `findmnt -t fuse.dyadfs` finds it
        // and `mount -a` sees an fstab line already mounted): fuser hands its Subtype only to
        // fusermount3; root mounts through the kernel directly, which takes it as an option.
        if crate::sys::euid() == 0 {
            fuser::MountOption::CUSTOM("subtype=dyadfs".into())
        } else {
            fuser::MountOption::Subtype("dyadfs".into())
        },
        fuser::MountOption::NoAtime,
        fuser::MountOption::DefaultPermissions,
        // Device nodes and set-id bits may be published by any node of the job: never honoured.
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
    ];
    if spec.read_only {
        config.mount_options.push(fuser::MountOption::RO);
    }
    for o in spec.options.iter().filter(|o| !o.is_empty()) {
        match o.as_str() {
            "ro" if spec.read_only => {}
            "ro" => config.mount_options.push(fuser::MountOption::RO),
            "allow_other" => config.acl = fuser::SessionACL::All,
            "allow_root" => config.acl = fuser::SessionACL::RootAndOwner,
            other => config
                .mount_options
                .push(fuser::MountOption::CUSTOM(other.into())),
        }
    }
    config.n_threads = Some(spec.threads.into());
    config.clone_fd = true;
    config
}

/// Every half second, asks the kernel to forget the inodes the daemon sheds.
fn start_inode_shedding(
    shedder: InodeShedder,
    notifier: fuser::Notifier,
) -> Result<(), SessionError> {
    std::thread::Builder::new()
        .name("inode-shed".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                for (parent, name) in shedder.candidates() {
                    // ENOENT: the kernel already dropped it. Any other error means the session
                    // is gone: stop.
                    match notifier.inval_entry(fuser::INodeNo(parent), &name) {
                        Ok(()) => {}
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                        Err(_) => return,
                    }
                }
            }
        })
        .map_err(|source| SessionError::Start {
            what: "inode-shed thread",
            source,
        })?;
    Ok(())
}

/// Finds the session's device (passthrough backing ids are registered on it) and, where the
/// kernel took the ring at INIT, starts the ring's threads; with `--fuse-transport uring` a
/// kernel that did not take it is a failed mount.
fn start_transport<S: Source>(
    spec: &SessionSpec,
    ops: &Arc<Ops<S>>,
    session: &mut fuser::Session<FuseAdapter<S>>,
    dev: Option<std::os::fd::OwnedFd>,
) -> Result<(), SessionError> {
    let dev = dev.map(Arc::new);
    if let Some(d) = &dev {
        ops.attach_device(d.clone());
    }
    let why_not = match (spec.transport, ops.ring_taken(), &dev) {
        (FuseTransport::Dev, _, _) => "--fuse-transport dev",
        (_, false, _) => {
            "the kernel does not offer it (Linux 6.14+ with \
             /sys/module/fuse/parameters/enable_uring set to Y)"
        }
        (_, true, None) => "the session's device was not found",
        (_, true, Some(d)) => {
            let per_queue = (usize::from(spec.threads) / ring::queues().unwrap_or(1)).max(1);
            let stats = ops.clone();
            let started = ring::start(ops.clone(), d.clone(), per_queue, move || {
                stats
                    .stats()
                    .fuse_transport
                    .store(1, std::sync::atomic::Ordering::Relaxed);
                tracing::info!("FUSE requests now come by io_uring");
            });
            match started {
                Ok(()) => {
                    tracing::info!(per_queue, "FUSE transport: io_uring (ring threads per CPU)");
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the ring's threads did not start");
                    "its threads did not start"
                }
            }
        }
    };
    if spec.transport == FuseTransport::Uring {
        let _ = session.unmount();
        return Err(SessionError::Mount(io::Error::other(format!(
            "no FUSE io_uring: {why_not}"
        ))));
    }
    tracing::info!(why = why_not, "FUSE transport: /dev/fuse");
    Ok(())
}
