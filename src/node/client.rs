//! The user's side of the node service: `dyadfs mount` attaching to it, and `dyadfs node
//! status`. A mount attaches when it presents a dataset (`--backing`) on one node (no peers, no
//! rendezvous) and a service answers at the socket (`--node-socket`, `DYADFS_NODE_SOCKET`, or
//! [`super::DEFAULT_SOCKET`]); `--no-node` never attaches.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::proto::{self, NodeStatus, Reply, Request};
use crate::daemon::UserError;
use crate::daemon::config::MountConfig;
use crate::fuse::fusermount;
use crate::sys::seqpacket::Conn;

/// How long a client waits for the service's answer (an attach waits for the session's start).
const ANSWER: std::time::Duration = std::time::Duration::from_secs(60);

/// The socket of the node service this mount attaches to, if it attaches.
pub fn service_for(args: &MountConfig) -> Option<PathBuf> {
    if args.no_node || args.managed || args.cluster.is_cluster() {
        return None;
    }
    if let Some(explicit) = &args.node_socket {
        return Some(explicit.clone());
    }
    let socket = std::env::var_os("DYADFS_NODE_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(super::DEFAULT_SOCKET));
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(&socket)
        .is_ok_and(|m| m.file_type().is_socket())
        .then_some(socket)
}

/// Mounts `args.mountpoint` for the calling user through `fusermount3` and hands it to the
/// node service at `socket`, which serves it; returns once it serves. A refusal leaves nothing
/// mounted.
pub fn attach(socket: &Path, args: &MountConfig) -> Result<(), UserError> {
    let mountpoint = std::fs::canonicalize(&args.mountpoint)
        .map_err(|_| UserError::NoMountPoint(args.mountpoint.clone()))?;
    if !mountpoint.is_dir() {
        return Err(UserError::MountPointNotDir(args.mountpoint.clone()));
    }
    if crate::daemon::is_mount_point(&mountpoint) {
        return Err(UserError::AlreadyMounted(args.mountpoint.clone()));
    }
    let backing = std::fs::canonicalize(&args.backing)
        .map_err(|_| UserError::NoBacking(args.backing.clone()))?;
    let conn = connect(
        socket,
        ": start it (dyadfs node serve), or mount with --no-node",
    )?;
    let fd = fusermount::mount(&mountpoint, &options(&backing, args)).map_err(|source| {
        UserError::Mount {
            path: mountpoint.clone(),
            source,
        }
    })?;
    let request = Request::Attach {
        version: proto::VERSION,
        mountpoint: mountpoint.clone(),
        backing,
    };
    let answer = exchange(&conn, &request, Some(fd.as_fd()));
    drop(fd);
    match answer {
        Ok(Reply::Attached { dataset, cache }) => {
            tracing::info!(
                mountpoint = %mountpoint.display(),
                dataset,
                cache = %cache.display(),
                "served by the node service (its options apply; dyadfs node status)"
            );
            Ok(())
        }
        Ok(Reply::Refused { message, .. }) => {
            fusermount::unmount(&mountpoint);
            Err(UserError::Node(message))
        }
        Ok(_) => {
            fusermount::unmount(&mountpoint);
            Err(UserError::Node("an answer to another question".into()))
        }
        Err(e) => {
            fusermount::unmount(&mountpoint);
            Err(UserError::Node(format!("no answer: {e}")))
        }
    }
}

/// `fusermount3`'s options: the dataset as the source the mount table shows, read-only, the
/// kernel checking the mode bits the service presents, and the user's own `-o` (`allow_other`
/// only where /etc/fuse.conf allows it; every open is judged by the service anyway).
fn options(backing: &Path, args: &MountConfig) -> Vec<String> {
    let source = backing.display().to_string();
    // fusermount3 splits its options at commas.
    let source = if source.contains([',', '\\']) {
        "dyadfs".into()
    } else {
        source
    };
    let mut options = vec![
        format!("fsname={source}"),
        "subtype=dyadfs".into(),
        "ro".into(),
        "nosuid".into(),
        "nodev".into(),
        "noatime".into(),
    ];
    if !args.node_without_kernel_checks {
        options.push("default_permissions".into());
    }
    options.extend(
        args.options
            .iter()
            .filter(|o| !o.is_empty() && *o != "ro" && *o != "rw")
            .cloned(),
    );
    options
}

/// What the node service at `socket` holds and serves.
pub fn status(socket: &Path) -> Result<NodeStatus, UserError> {
    let request = Request::Status {
        version: proto::VERSION,
    };
    match ask(socket, &request)? {
        Reply::Status(s) => Ok(s),
        _ => Err(UserError::Node("an answer to another question".into())),
    }
}

/// `dyadfs node evict KEY` (root): what it freed, and whether the dataset is gone.
pub fn evict(socket: &Path, key: &str) -> Result<(u64, u64, bool), UserError> {
    let request = Request::Evict {
        version: proto::VERSION,
        key: key.into(),
    };
    match ask(socket, &request)? {
        Reply::Evicted { files, bytes, gone } => Ok((files, bytes, gone)),
        _ => Err(UserError::Node("an answer to another question".into())),
    }
}

/// Asks the service at `socket` one question without a descriptor; a refusal is the error.
fn ask(socket: &Path, request: &Request) -> Result<Reply, UserError> {
    let conn = connect(socket, "")?;
    let reply =
        exchange(&conn, request, None).map_err(|e| UserError::Node(format!("no answer: {e}")))?;
    match reply {
        Reply::Refused { message, .. } => Err(UserError::Node(message)),
        r => Ok(r),
    }
}

/// A connection to the service at `socket`, its answers bounded by [`ANSWER`]; `hint` follows
/// the error when nothing answers.
fn connect(socket: &Path, hint: &str) -> Result<Conn, UserError> {
    let conn = Conn::connect(socket).map_err(|e| {
        UserError::Node(format!(
            "no service answers at {} ({e}){hint}",
            socket.display()
        ))
    })?;
    conn.set_timeout(ANSWER)
        .map_err(|e| UserError::Node(e.to_string()))?;
    Ok(conn)
}

/// Sends `request` (with `fd`, if any) and reads the one reply.
fn exchange(
    conn: &Conn,
    request: &Request,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<Reply> {
    conn.send(&proto::encode(request), fd)?;
    let (message, _) = conn.recv()?;
    proto::decode(&message)
}

impl NodeStatus {
    /// `dyadfs node status` as a table.
    pub fn table(&self) -> String {
        use crate::stats::human;
        let mut out = format!(
            "node cache {}, {} shared by {} dataset(s)\n",
            self.cache.display(),
            human(self.capacity),
            self.datasets.len()
        );
        if let Some(s) = &self.site {
            out.push_str(&format!(
                "node {} of a site of {} ({} down); home of {} files in its rack, {} in the site\n",
                s.node, s.members, s.members_down, s.home_rack_files, s.home_global_files
            ));
        }
        for u in &self.users {
            out.push_str(&format!(
                "user {}: {} dataset(s), {} charged\n",
                u.uid,
                u.datasets,
                human(u.bytes)
            ));
        }
        for d in &self.datasets {
            let hits = if d.opens == 0 {
                "-".to_string()
            } else {
                format!("{:.1}%", 100.0 * d.local_hits as f64 / d.opens as f64)
            };
            out.push_str(&format!(
                "{}  {}\n  {} files, {} cached of {}; {} mount(s) now; users {:?}; opens {} (hits \
                 {}); {} from the shared FS, {} from the site's other nodes, {} served to them; \
                 {} refused\n",
                d.key,
                d.backing.display(),
                d.cached_files,
                human(d.cached_bytes),
                human(d.capacity),
                d.mounts,
                d.users,
                d.opens,
                hits,
                human(d.bytes_from_backing),
                human(d.bytes_from_peers),
                human(d.bytes_served_to_peers),
                d.rights_denied
            ));
        }
        out
    }
}
