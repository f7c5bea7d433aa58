//! What a mount is asked to be, as plain data: the command line (`cli.rs`) converts its
//! arguments into these, and the daemon is built from them, so nothing below the command line
//! knows clap.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::cache::MAX_PARTIAL_CHUNKS;
use crate::fs::FsConfig;

/// The empty directory in the cache directory that a managed directory presents as its
/// dataset: nothing but produced files ever appears under the mount.
pub const MANAGED_ROOT: &str = "managed-root";

#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Empty directory to mount on.
    pub mountpoint: PathBuf,
    /// Cache directory on node-local NVMe.
    pub ssd: PathBuf,
    /// Dataset directory on the shared file system; for a managed directory, the empty
    /// directory [`MANAGED_ROOT`] in the cache directory.
    pub backing: PathBuf,
    /// No dataset (`--backing` not given): DYAD's managed directory, holding only what the
    /// job's producers write.
    pub managed: bool,
    /// Bytes the cache may hold (`None`: leave 10% of its file system free).
    pub capacity: Option<u64>,
    /// Bytes of produced files one uid may hold here, written or kept (`None`: no cap).
    pub max_staged_per_user: Option<u64>,
    /// Names one uid may own in this node's tables (root: no bound).
    pub max_names_per_user: u64,
    /// Idle cache data files kept open (`None`: half the descriptor limit, at most 65536).
    pub open_files: Option<u64>,
    pub chunk_size: u64,
    /// Which cached objects are packed into segments.
    pub pack_max: PackMax,
    /// Chunks that may be partly present at once (see `CacheConfig::max_partial_chunks`;
    /// default [`MAX_PARTIAL_CHUNKS`]).
    pub max_partial_chunks: u64,
    /// How often the background scrub re-checks the cache (zero: never), and its read rate.
    pub scrub_interval: Duration,
    pub scrub_rate: u64,
    /// The filesystem's own settings.
    pub fs: FsConfig,
    /// Threads serving FUSE requests.
    pub threads: u16,
    /// The mount's readahead in bytes, set once it is up (0: the kernel's; `None`: chosen by
    /// what the kernel agreed to at INIT, see `daemon::start_kernel_readahead`).
    pub kernel_readahead: Option<u64>,
    /// How FUSE requests arrive.
    pub fuse_transport: crate::fuse::FuseTransport,
    /// Mount read-only (also asked by `-o ro`).
    pub read_only: bool,
    /// `--opens auto`: a read-only mount of a dataset of small files opens them unasked
    /// (`daemon::opens`).
    pub opens_auto: bool,
    /// FUSE mount options (`-o`).
    pub options: Vec<String>,
    /// The node service to attach to (`--node-socket`), and never to attach (`--no-node`).
    pub node_socket: Option<PathBuf>,
    pub no_node: bool,
    /// Testing: an attach leaves `default_permissions` out (the service judges alone).
    pub node_without_kernel_checks: bool,
    /// Stay in the foreground instead of daemonizing.
    pub foreground: bool,
    /// Log file of the background daemon (`None`: `<ssd>/dyadfs.log`).
    pub log_file: Option<PathBuf>,
    /// Where to serve Prometheus metrics (`/metrics`), if anywhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub cluster: ClusterConfig,
}

/// Who the other nodes are and how to reach and trust them; a mount with neither a peers file
/// nor a rendezvous is single-node.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node's id (`None`: from the launcher's rank variable).
    pub node_id: Option<u32>,
    pub peers: Option<PathBuf>,
    pub rendezvous: Option<PathBuf>,
    /// Daemons meeting in the rendezvous directory.
    pub nodes: Option<u32>,
    pub listen: Option<SocketAddr>,
    /// This node's rack (with a rendezvous).
    pub rack: String,
    /// Bound on every wait for a peer.
    pub peer_timeout: Duration,
    /// How soon a silent node is known to be down everywhere (gossip).
    pub failure_detection: Duration,
    /// Chunks up to this size come inline in a holder's reply instead of by RMA get.
    pub eager_max: u64,
    /// Threads serving peers' pull connections.
    pub serve_threads: usize,
    pub data_plane: DataPlaneKind,
    /// UCX's tcp acknowledged (`--ucx-over-tcp`): a UCX data plane may use it.
    pub ucx_over_tcp: bool,
    /// Copy what other nodes fetch in the background (`--replicate`).
    pub replicate: Replicate,
    pub secret_file: Option<PathBuf>,
    /// A second key accepted from peers while the first is rotated (the site's
    /// `--site-key-also`; see [`crate::transport::auth`]).
    pub secret_also: Option<PathBuf>,
    pub insecure: bool,
}

impl ClusterConfig {
    pub fn is_cluster(&self) -> bool {
        self.peers.is_some() || self.rendezvous.is_some()
    }
}

/// `dyadfs transport serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub root: PathBuf,
    pub listen: SocketAddr,
    pub ucx: UcxConfig,
    /// Testing only: corrupt every staged chunk after checksumming it.
    pub corrupt: bool,
}

/// `dyadfs transport pull`.
#[derive(Debug, Clone)]
pub struct PullToolConfig {
    pub peer: SocketAddr,
    pub path: String,
    pub version_of: PathBuf,
    pub out: PathBuf,
    pub offset: u64,
    pub len: Option<u64>,
    pub window: u32,
    pub eager_max: u64,
    pub ucx: UcxConfig,
}

/// When a node copies what the other nodes fetch (`--replicate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicate {
    Off,
    /// On a cluster mount of a dataset (`--backing`), up to [`AUTO_FILL`] of the capacity.
    Auto,
    /// On any cluster mount, up to [`ON_FILL`] of the capacity.
    On,
}

/// `--replicate auto` copies while the cache is under this share of its capacity: a dataset
/// that fits in half the cache is copied whole, and half the disk stays for the node's own
/// reads whatever the dataset's size.
pub const AUTO_FILL: f64 = 0.5;
/// `--replicate on` copies while the cache is under this share of its capacity.
pub const ON_FILL: f64 = 0.9;

impl Replicate {
    /// The share of the capacity copies may fill on this mount, or `None` for no copies.
    pub fn fill_limit(self, cluster: bool, backing: bool) -> Option<f64> {
        match self {
            Replicate::On if cluster => Some(ON_FILL),
            Replicate::Auto if cluster && backing => Some(AUTO_FILL),
            _ => None,
        }
    }
}

/// How chunks move between nodes (`--data-plane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPlaneKind {
    Auto,
    Ucx,
    Stream,
}

impl DataPlaneKind {
    /// Whether chunks go by UCX. `Auto`: only where the fabric checks memory keys: an RDMA
    /// device is present and UCX_TLS leaves tcp out (unset: the data-plane process is given
    /// [`RDMA_TLS`]). Elsewhere UCX would move them over tcp, emulating RMA in software.
    pub fn uses_ucx(self) -> bool {
        self.uses_ucx_with(rdma_present(), &ucx_tls_env())
    }

    fn uses_ucx_with(self, rdma: bool, tls: &str) -> bool {
        match self {
            DataPlaneKind::Ucx => true,
            DataPlaneKind::Stream => false,
            DataPlaneKind::Auto => rdma && (tls.is_empty() || !tls_allows_tcp(tls)),
        }
    }

    /// What the data-plane process's UCX may use: `Ok(Some(tls))` to set UCX_TLS to,
    /// `Ok(None)` to leave it as it is, or the one-line refusal of a mount that would expose
    /// UCX's tcp without `--ucx-over-tcp`.
    pub fn ucx_tls(self, over_tcp: bool) -> Result<Option<&'static str>, String> {
        self.ucx_tls_with(rdma_present(), &ucx_tls_env(), over_tcp)
    }

    fn ucx_tls_with(
        self,
        rdma: bool,
        tls: &str,
        over_tcp: bool,
    ) -> Result<Option<&'static str>, String> {
        if !self.uses_ucx_with(rdma, tls) {
            return Ok(None);
        }
        // `auto` never uses tcp, `--ucx-over-tcp` or not: on RDMA with UCX_TLS unset it gets
        // the RDMA transports (UCX's default list would add tcp).
        if rdma && tls.is_empty() && (self == DataPlaneKind::Auto || !over_tcp) {
            return Ok(Some(RDMA_TLS));
        }
        if over_tcp {
            return Ok(None);
        }
        if tls_allows_tcp(tls) {
            let why = if rdma {
                format!("UCX_TLS={tls} lets UCX use tcp")
            } else if tls.is_empty() {
                "this node has no RDMA device".to_string()
            } else {
                format!("this node has no RDMA device and UCX_TLS={tls} allows tcp")
            };
            return Err(format!(
                "--data-plane ucx would move chunks over UCX's tcp ({why}), where anyone who reaches \
                 the data-plane process's port can read and write its memory (they see sealed \
                 chunks and forge none, but can stop it): add --ucx-over-tcp to accept that, or \
                 use --data-plane stream"
            ));
        }
        Ok(None)
    }
}

/// The UCX transports a data-plane process uses on an RDMA node when UCX_TLS is unset: those
/// whose NIC checks memory keys (UCX's default list would add tcp, listening on every
/// interface).
pub const RDMA_TLS: &str = "rc,dc,ud";

/// Whether an RDMA device is present.
fn rdma_present() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

fn ucx_tls_env() -> String {
    std::env::var("UCX_TLS").unwrap_or_default()
}

/// Whether a UCX_TLS value lets UCX use tcp: unset (UCX's default list), `all`, an exclusion
/// list (`^...`) that does not exclude tcp, or a list that names it.
fn tls_allows_tcp(tls: &str) -> bool {
    let names = |list: &str| {
        list.split(',')
            .any(|t| matches!(t.trim(), "tcp" | "all") || t.trim().starts_with("tcp"))
    };
    match tls.strip_prefix('^') {
        _ if tls.is_empty() => true,
        Some(excluded) => !excluded.split(',').any(|t| t.trim() == "tcp"),
        None => names(tls),
    }
}

#[cfg(test)]
mod data_plane_tests {
    use super::DataPlaneKind::*;
    use super::*;

    #[test]
    fn auto_never_chooses_ucx_over_tcp() {
        assert!(Auto.uses_ucx_with(true, ""));
        assert!(Auto.uses_ucx_with(true, "rc,ud"));
        assert!(Auto.uses_ucx_with(true, "^tcp"));
        for tls in ["tcp", "all", "^ud", "rc,tcp", "tcp,sm"] {
            assert!(!Auto.uses_ucx_with(true, tls), "{tls}");
        }
        assert!(!Auto.uses_ucx_with(false, ""));
        // On RDMA with UCX_TLS unset, the data plane is given RDMA transports only.
        assert_eq!(Auto.ucx_tls_with(true, "", false), Ok(Some(RDMA_TLS)));
        assert_eq!(Auto.ucx_tls_with(true, "", true), Ok(Some(RDMA_TLS)));
        assert_eq!(Ucx.ucx_tls_with(true, "", true), Ok(None));
        assert_eq!(Auto.ucx_tls_with(true, "rc", false), Ok(None));
        assert_eq!(Stream.ucx_tls_with(false, "tcp", false), Ok(None));
    }

    #[test]
    fn ucx_over_tcp_needs_its_acknowledgement() {
        let e = Ucx.ucx_tls_with(false, "", false).unwrap_err();
        assert!(
            e.contains("no RDMA device") && e.contains("--ucx-over-tcp"),
            "{e}"
        );
        assert!(Ucx.ucx_tls_with(false, "tcp", false).is_err());
        assert!(Ucx.ucx_tls_with(true, "tcp", false).is_err());
        assert_eq!(Ucx.ucx_tls_with(false, "tcp", true), Ok(None));
        assert_eq!(Ucx.ucx_tls_with(true, "", false), Ok(Some(RDMA_TLS)));
        assert_eq!(Ucx.ucx_tls_with(true, "", true), Ok(None));
    }
}

#[derive(Debug, Clone)]
pub struct UcxConfig {
    pub data_plane: DataPlaneKind,
    pub slots: u32,
    pub slot_size: u64,
    pub timeout: Duration,
    pub node_id: u32,
}

/// Which cached objects are packed into segments (`--pack-max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackMax {
    /// Those of at most [`PackMax::AUTO_BYTES`] where the kernel cannot be handed cache files
    /// (no FUSE passthrough, or it is turned off), none where it can (decided at FUSE INIT).
    Auto,
    /// Those of at most this many bytes (0: none).
    Bytes(u64),
}

impl PackMax {
    /// What `Auto` packs where it packs.
    pub const AUTO_BYTES: u64 = 1 << 20;

    /// The largest object packed until the kernel's answer is known.
    pub fn until_init(self) -> u64 {
        match self {
            PackMax::Auto => Self::AUTO_BYTES,
            PackMax::Bytes(n) => n,
        }
    }
}
