//! The node service (`dyadfs node serve`): one root process per node that owns the node's NVMe
//! cache and outlives jobs, so a dataset read by one job, or one user, is read from the shared
//! file system once and served to every later job and every user with the rights to it.
//!
//! A user's `dyadfs mount /dyad --ssd ... --backing DIR` finds the service's socket
//! ([`DEFAULT_SOCKET`]), has `fusermount3` mount `/dyad` for the user (the user's mount, which
//! only that user may use and unmount) and hands the service its `/dev/fuse` descriptor with the
//! dataset's path ([`client`]). The service knows the caller from the socket, opens the dataset
//! as that user (a directory the user cannot reach is refused), keys it by the shared
//! directory's identity (its file system's id, inode and birth time), so two users' mounts of
//! one dataset share one cache, and serves the mount read-only, asking the shared file system
//! as the caller at every open and lookup whether the caller may ([`rights`]), whatever the
//! cache holds ([`attach`]).
//! With no service running, `dyadfs mount` runs its own daemon as before.

pub mod attach;
pub mod client;
pub mod proto;
mod publishing;
mod rights;
mod share;
pub mod site;
mod state;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::daemon::UserError;
use crate::sys::seqpacket::{Conn, Listener};
use proto::{Reply, Request};
use state::Node;
pub use state::NodeConfig;

/// Where the service listens unless told otherwise (`--socket`; `DYADFS_NODE_SOCKET`).
pub const DEFAULT_SOCKET: &str = "/run/dyadfs/node.sock";

/// Requests handled at once; past it a request is refused (EBUSY) at once.
const MAX_IN_FLIGHT: usize = 64;

/// Runs the service until SIGTERM, SIGINT or SIGHUP.
pub fn serve(mut config: NodeConfig) -> Result<(), UserError> {
    if crate::sys::euid() != 0 {
        return Err(UserError::Node(
            "the node service runs as root (it serves every user's mounts)".into(),
        ));
    }
    let signals = crate::sys::StopSignals::block();
    // As a mount's daemon does (`daemon::wiring`): each session's request buffers mapped, not
    // heap; descriptors as many as allowed, a quarter of them idle cache files per dataset.
    crate::sys::fix_mmap_threshold();
    let limit = crate::sys::raise_descriptor_limit();
    let open_files = &mut config.template.open_files;
    open_files.get_or_insert((limit / 4).clamp(8, 65536));
    prepare(&config.ssd)?;
    let listener = listen(&config.socket)?;
    // Before the datasets load: each is published to the site as it opens.
    let site = match config.template.cluster.is_cluster() {
        true => Some(site::Site::join(
            &config.template,
            &config.serving,
            Arc::new(crate::stats::Stats::default()),
        )?),
        false => None,
    };
    let node = Arc::new(Node::new(config, site));
    node.load()
        .map_err(|r| UserError::Node(format!("loading the node's cache: {}", r.1)))?;
    if let Some(addr) = node.config.metrics_listen {
        let scraped = node.clone();
        let local = crate::metrics::serve(addr, move || scraped.metrics())
            .map_err(|source| UserError::Listen { addr, source })?;
        tracing::info!(%local, "serving every dataset's metrics at /metrics");
    }
    let socket = node.config.socket.clone();
    std::thread::Builder::new()
        .name("node-signals".into())
        .spawn(move || {
            let sig = signals.wait();
            tracing::info!(
                signal = sig,
                "stopping: the mounts served go with the service"
            );
            let _ = std::fs::remove_file(&socket);
            std::process::exit(0);
        })
        .map_err(|source| UserError::Start {
            what: "signal thread",
            source,
        })?;
    tracing::info!(
        socket = %node.config.socket.display(),
        cache = %node.config.ssd.display(),
        "node service ready"
    );
    loop {
        let conn = match listener.accept() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        };
        if node.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
            node.in_flight.fetch_sub(1, Ordering::AcqRel);
            refuse(&conn, libc::EBUSY, "the node service is busy: try again");
            continue;
        }
        let handler = node.clone();
        let spawned = std::thread::Builder::new()
            .name("node-request".into())
            .spawn(move || {
                handle(&handler, &conn);
                handler.in_flight.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            // (The connection went with the closure: its client sees it closed.)
            node.in_flight.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "no thread for a request");
        }
    }
}

fn refuse(conn: &Conn, errno: i32, message: &str) {
    let reply = Reply::Refused {
        errno,
        message: message.into(),
    };
    let _ = conn.send(&proto::encode(&reply), None);
}

/// Answers one connection's request.
fn handle(node: &Arc<Node>, conn: &Conn) {
    // A client that says nothing holds a thread for this long at most.
    let _ = conn.set_timeout(std::time::Duration::from_secs(30));
    let (message, fd) = match conn.recv() {
        // The client left without asking (its fusermount3 failed, and it said so).
        Ok((m, None)) if m.is_empty() => return,
        Ok(m) => m,
        Err(e) => return refuse(conn, libc::EINVAL, &e.to_string()),
    };
    let reply = match proto::decode::<Request>(&message) {
        Ok(Request::Attach {
            version,
            mountpoint,
            backing,
        }) if version == proto::VERSION => match fd {
            Some(fd) => attach::attach(node, conn, &mountpoint, &backing, fd),
            None => Reply::Refused {
                errno: libc::EINVAL,
                message: "an attach comes with its /dev/fuse descriptor".into(),
            },
        },
        Ok(Request::Status { version }) if version == proto::VERSION => {
            Reply::Status(node.status())
        }
        Ok(Request::Evict { version, key }) if version == proto::VERSION => match conn.peer() {
            Ok((_, ids)) if ids.uid == 0 => node.evict(&key).unwrap_or_else(Into::into),
            _ => Reply::Refused {
                errno: libc::EPERM,
                message: "only root evicts".into(),
            },
        },
        Ok(_) => Reply::Refused {
            errno: libc::EPROTO,
            message: format!(
                "this node service speaks protocol {}: use its dyadfs",
                proto::VERSION
            ),
        },
        Err(e) => Reply::Refused {
            errno: libc::EINVAL,
            message: format!("not a request: {e}"),
        },
    };
    if let Err(e) = conn.send(&proto::encode(&reply), None) {
        tracing::info!(error = %e, "a client left before its reply");
    }
}

/// The cache directory: root's, private, with its `datasets/` and a fresh `mounts/` (a mount's
/// own state does not outlive the service that served it).
fn prepare(ssd: &Path) -> Result<(), UserError> {
    use std::os::unix::fs::DirBuilderExt;
    let err = |source| UserError::CacheDir {
        path: ssd.to_path_buf(),
        source,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(ssd) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e)),
    }
    crate::sys::private::check_private_dir(ssd).map_err(err)?;
    let mounts = ssd.join("mounts");
    match std::fs::remove_dir_all(&mounts) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    for dir in [ssd.join("datasets"), mounts] {
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(e)),
        }
    }
    Ok(())
}

/// Listens at `socket` (mode 0666: every user of the node may ask; the service judges each by
/// the kernel's word). A socket file nobody answers at is a dead service's, replaced; one that
/// answers is another service's: refused.
fn listen(socket: &Path) -> Result<Listener, UserError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |source: std::io::Error| UserError::Node(format!("{}: {source}", socket.display()));
    if let Some(dir) = socket.parent() {
        match std::fs::DirBuilder::new().mode(0o755).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(e)),
        }
        crate::sys::private::check_private_dir(dir).map_err(err)?;
    }
    if socket.exists() {
        if Conn::connect(socket).is_ok() {
            return Err(UserError::Node(format!(
                "a node service already listens at {}",
                socket.display()
            )));
        }
        std::fs::remove_file(socket).map_err(err)?;
    }
    let listener = Listener::bind(socket).map_err(err)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).map_err(err)?;
    Ok(listener)
}
