//! What a user is told when a command fails: one line naming the culprit, printed once by
//! `main`. Each variant keeps its cause (`#[source]`), so the line says why as well as what.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("no /dev/fuse: load the fuse module (modprobe fuse) or run where FUSE is available")]
    NoFuse,
    #[error(
        "cannot open /dev/fuse: {0}: a plain user's mount needs read and write on it (see ls -l \
         /dev/fuse: often the group fuse), or mount as root"
    )]
    NoFuseAccess(io::Error),
    #[error("mount point {} does not exist", .0.display())]
    NoMountPoint(PathBuf),
    /// The node service (`dyadfs node`): it could not start, or it refused a mount, saying why.
    #[error("node service: {0}")]
    Node(String),
    #[error("mount point {p} is a dead FUSE mount: run fusermount3 -u {p}", p = .0.display())]
    DeadMount(PathBuf),
    #[error("mount point {} is not a directory", .0.display())]
    MountPointNotDir(PathBuf),
    #[error("mount point {} is not empty", .0.display())]
    MountPointNotEmpty(PathBuf),
    #[error("{} is already mounted", .0.display())]
    AlreadyMounted(PathBuf),
    #[error("mount point {}: {source}", .path.display())]
    MountPoint { path: PathBuf, source: io::Error },
    #[error("backing dir {} does not exist", .0.display())]
    NoBacking(PathBuf),
    #[error("backing dir {} is not a directory", .0.display())]
    BackingNotDir(PathBuf),
    #[error("backing dir {}: {source}", .path.display())]
    Backing {
        path: PathBuf,
        source: crate::fs::Error,
    },
    #[error("cache dir {} is not writable: {source}", .path.display())]
    CacheNotWritable { path: PathBuf, source: io::Error },
    #[error("cache dir {} is inside the mount point", .0.display())]
    CacheInsideMount(PathBuf),
    #[error("cache dir {}: {source}", .path.display())]
    CacheDir { path: PathBuf, source: io::Error },
    #[error("{0}")]
    Cache(#[from] crate::cache::CacheError),
    #[error("--replicate needs other nodes: give --peers or --rendezvous")]
    ReplicateAlone,
    #[error("{0} is for a cluster: give --peers or --rendezvous, or leave {0} out")]
    NeedsCluster(&'static str),
    #[error(
        "a multi-node mount needs a job secret: --secret-file FILE (make one with `dyadfs keygen \
         FILE`), or --insecure on a closed test network"
    )]
    NoSecret,
    /// A key file or a rendezvous's secret that cannot be used (the reason names the file).
    #[error("{0}")]
    Secret(String),
    #[error("{}: {source}", .path.display())]
    KeyFile { path: PathBuf, source: io::Error },
    #[error(
        "--node-id is required (or a launcher's SLURM_NODEID, FLUX_TASK_RANK, \
         OMPI_COMM_WORLD_RANK or PMI_RANK)"
    )]
    NoNodeId,
    #[error("peers file {}: {source}", .path.display())]
    PeersFile { path: PathBuf, source: io::Error },
    #[error("peers file {}: {source}", .path.display())]
    Peers {
        path: PathBuf,
        source: crate::locator::PeersError,
    },
    #[error("--rendezvous needs --listen")]
    RendezvousNeedsListen,
    #[error("{0}")]
    Rendezvous(String),
    #[error("cannot listen on {addr}: {source}{}", listen_hint(.source))]
    Listen { addr: SocketAddr, source: io::Error },
    #[error("UCX: {0}")]
    Ucx(#[from] crate::transport::ucx::UcxError),
    #[error(
        "the job key is not this cluster's: running peers {0} answered with proofs it does not \
         check (a wrong --secret-file, or a rendezvous secret of another job?)"
    )]
    WrongKey(String),
    /// `--data-plane ucx` where no UCX library can be loaded (the line says where it looked).
    #[error("--data-plane ucx: {0}")]
    NoUcx(&'static str),
    /// A UCX data plane that would expose UCX's tcp without `--ucx-over-tcp`.
    #[error("{0}")]
    UcxOverTcp(String),
    #[error("{0}")]
    Transport(#[from] crate::transport::TransportError),
    #[error("log file {}: {source}", .path.display())]
    LogFile { path: PathBuf, source: io::Error },
    /// Starting the daemon or one of its threads failed (`what` says which step).
    #[error("{what}: {source}")]
    Start {
        what: &'static str,
        source: io::Error,
    },
    #[error("the daemon (pid {pid}) exited before the mount was ready; see {}", .log.display())]
    DaemonDied { pid: u32, log: PathBuf },
    /// The daemon's own error, reported to the waiting parent.
    #[error("{0}")]
    Daemon(String),
    #[error("cannot mount {}: {source}", .path.display())]
    Mount { path: PathBuf, source: io::Error },
    #[error("FUSE session failed: {0}")]
    Session(io::Error),
    #[error("{} is not a dyadfs mount point, nor in one", .0.display())]
    NotOurs(PathBuf),
    #[error("bad prefetch stream name {0:?} (non-empty, no ':')")]
    BadStream(String),
    #[error("{}: {source}", .path.display())]
    Stats { path: PathBuf, source: io::Error },
    #[error("unreadable stats from {}: {source}", .path.display())]
    StatsUnreadable {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: {source}", .path.display())]
    WarmRead { path: PathBuf, source: io::Error },
    #[error("{} is not under the mount point {}", .path.display(), .mountpoint.display())]
    NotUnderMount { path: PathBuf, mountpoint: PathBuf },
    #[error("interrupted after {staged} of {total} files (what was staged stays staged)")]
    WarmInterrupted { staged: usize, total: usize },
    #[error("{missing} paths not found and {failed} files unreadable (the rest is staged)")]
    WarmIncomplete { missing: usize, failed: usize },
    /// A file named by a `dyadfs transport` flag (`what`).
    #[error("{what} {}: {source}", .path.display())]
    ToolFile {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// What to check when this node cannot listen where its peers line or `--listen` says (a host
/// name resolves to the address of another node, or of no interface here).
fn listen_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EADDRNOTAVAIL) => {
            " (no interface of this node has that address: this node's line in the peers \
             file, or --listen, names another host or resolves elsewhere)"
        }
        Some(libc::EADDRINUSE) => " (another process listens there)",
        _ => "",
    }
}
