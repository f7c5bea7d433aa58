//! `dyadfs node`: the node service's commands, and their conversion into its configuration.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::MountArgs;
use super::units::parse_capacity;
use crate::node::NodeConfig;

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Run the node service in the foreground (as root: a systemd unit, or a prolog): it owns
    /// the cache directory across jobs and serves every user's `dyadfs mount ... --backing`
    /// on this node, one cache per dataset shared by every user who may read it
    Serve(Box<NodeServeArgs>),
    /// What the node service holds: its datasets, their cached files and bytes, mounts, users,
    /// hits and refusals
    Status(NodeStatusArgs),
    /// Root: drop a dataset from the node's cache (`dyadfs node status` lists the keys): all
    /// of it when no mount serves it, else its files not open now
    Evict(NodeEvictArgs),
}

/// The service's socket, as every `dyadfs node` command names it.
#[derive(Debug, Args)]
pub struct NodeSocket {
    /// The service's socket (`serve`: where it listens, made mode 0666: every user may ask;
    /// each is judged by the kernel's word of who they are)
    #[arg(
        long,
        value_name = "PATH",
        env = "DYADFS_NODE_SOCKET",
        default_value = crate::node::DEFAULT_SOCKET
    )]
    pub socket: PathBuf,
}

#[derive(Debug, Args)]
pub struct NodeEvictArgs {
    /// The dataset's key
    pub key: String,
    #[command(flatten)]
    pub service: NodeSocket,
}

#[derive(Debug, Args)]
pub struct NodeServeArgs {
    /// The node's cache directory on its NVMe (made, mode 0700, if missing)
    #[arg(long, value_name = "DIR")]
    pub ssd: PathBuf,
    #[command(flatten)]
    pub service: NodeSocket,
    /// Most bytes the node's cache may hold, shared equally by its datasets [default: leave 10%
    /// of the cache file system free]
    #[arg(long, value_name = "SIZE", value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// The most one dataset may hold, however few share the node (a quota per dataset)
    /// [default: its share alone]
    #[arg(long, value_name = "SIZE", value_parser = parse_capacity)]
    pub dataset_max: Option<u64>,
    /// The most one user's datasets may hold together (a quota per user): the node's capacity
    /// is shared equally by the users who read datasets on it, then by each user's datasets, a
    /// dataset several users read holding all their parts [default: its equal part alone]
    #[arg(long, value_name = "SIZE", value_parser = parse_capacity)]
    pub user_max: Option<u64>,
    /// Serve every dataset's counters (the keys of `dyadfs stats`, labelled `dataset`) as
    /// Prometheus metrics at http://HOST:PORT/metrics
    #[arg(long, value_name = "HOST:PORT", value_parser = super::host_port)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Threads serving each mount's FUSE requests
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    #[command(flatten)]
    pub site: SiteArgs,
}

/// The site: the node services of the cluster's nodes, serving each other's cached datasets.
#[derive(Debug, Args)]
#[group(requires_all = ["site_peers", "node_id", "site_key"], multiple = true)]
pub struct SiteArgs {
    /// The site's node services, one per line: `ID HOST:PORT RACK` (the peers file of `dyadfs
    /// mount`): each serves the datasets it caches to the others and pulls theirs, so a job on
    /// other nodes, of any user with the rights, reads a dataset's files from their holders
    /// instead of the shared file system [default: no site, this node alone]
    #[arg(long, value_name = "FILE", help_heading = "Site")]
    pub site_peers: Option<PathBuf>,
    /// This node's ID in the site's peers file
    #[arg(long, value_name = "N", help_heading = "Site")]
    pub node_id: Option<u32>,
    /// The site key every service proves on every connection (`dyadfs keygen`, root's, mode
    /// 0600, the same file on every node; docs/OPERATIONS.md says how to rotate it). A job's
    /// own key never opens the site, nor does the site key open a job's port
    #[arg(long, value_name = "FILE", help_heading = "Site")]
    pub site_key: Option<PathBuf>,
    /// While the site key is rotated: a second key this service accepts from the other
    /// services, which may prove with either (same rules as --site-key). A rolling rotation
    /// restarts every service with `--site-key OLD --site-key-also NEW`, then each with
    /// `--site-key NEW --site-key-also OLD`, then each with `--site-key NEW` alone
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "Site",
        requires = "site_key"
    )]
    pub site_key_also: Option<PathBuf>,
    /// How chunks move between the services (see `dyadfs mount --help`)
    #[arg(
        long,
        value_enum,
        value_name = "KIND",
        default_value = "auto",
        help_heading = "Site"
    )]
    pub data_plane: super::DataPlaneArg,
    /// Bound on every wait for another node's service: a holder that went away costs a file
    /// this, once
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        help_heading = "Site"
    )]
    pub peer_timeout: String,
    /// Most bytes per second this node serves the site's other nodes (e.g. 500M); a pull over
    /// it waits its turn, up to a second, else goes to another holder or the shared FS
    /// [default: no bound]
    #[arg(long, value_name = "SIZE", value_parser = super::parse_size, help_heading = "Site")]
    pub site_serve_rate: Option<u64>,
    /// Threads that serve the site's other nodes, at the lowest CPU priority: this node's own
    /// readers come first
    #[arg(long, value_name = "N", default_value_t = 16, help_heading = "Site",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub site_serve_threads: u32,
    /// Let a UCX data plane use UCX's tcp transport (see `dyadfs mount --help`)
    #[arg(long, help_heading = "Site")]
    pub ucx_over_tcp: bool,
    /// Chunks up to this size travel inline in the holder's reply, larger ones by UCX RMA (see
    /// `dyadfs mount --help`)
    #[arg(long, value_name = "SIZE", default_value = "1M", help_heading = "Site")]
    pub eager_max: String,
}

#[derive(Debug, Args)]
pub struct NodeStatusArgs {
    #[command(flatten)]
    pub service: NodeSocket,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

/// `dyadfs mount`'s defaults, parsed as clap parses them: every mount the service serves is one
/// (then made read-only, its opens asked, with the node's capacity and threads).
#[derive(Debug, Parser)]
struct Defaults {
    #[command(flatten)]
    mount: MountArgs,
}

impl TryFrom<NodeServeArgs> for NodeConfig {
    type Error = String;

    /// The service's configuration; `Err` names what is wrong with the site's arguments (which
    /// `dyadfs mount`'s own parser checks).
    fn try_from(a: NodeServeArgs) -> Result<NodeConfig, String> {
        let ssd = a.ssd.to_string_lossy().into_owned();
        let mut argv: Vec<String> = ["mount", "/", "--ssd", &ssd, "--backing", "/"]
            .map(String::from)
            .into();
        let site = &a.site;
        if let (Some(peers), Some(id), Some(key)) = (&site.site_peers, site.node_id, &site.site_key)
        {
            let data_plane = clap::ValueEnum::to_possible_value(&site.data_plane)
                .expect("no variant is skipped");
            argv.extend([
                "--peers".into(),
                peers.display().to_string(),
                "--node-id".into(),
                id.to_string(),
                "--secret-file".into(),
                key.display().to_string(),
                "--data-plane".into(),
                data_plane.get_name().into(),
                "--peer-timeout".into(),
                site.peer_timeout.clone(),
                "--eager-max".into(),
                site.eager_max.clone(),
            ]);
            if site.ucx_over_tcp {
                argv.push("--ucx-over-tcp".into());
            }
        }
        let defaults = Defaults::try_parse_from(argv).map_err(|e| e.to_string())?;
        let mut template: crate::daemon::config::MountConfig = defaults.mount.into();
        template.capacity = a.capacity;
        template.threads = a.threads;
        template.cluster.secret_also = a.site.site_key_also;
        template.read_only = true;
        template.opens_auto = false;
        template.fs.no_open = false;
        Ok(NodeConfig {
            ssd: a.ssd,
            socket: a.service.socket,
            template,
            dataset_max: a.dataset_max,
            user_max: a.user_max,
            metrics_listen: a.metrics_listen,
            serving: crate::node::site::ServingBudget {
                rate: a.site.site_serve_rate,
                threads: a.site.site_serve_threads as usize,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_serves_read_only_asked_mounts_with_its_capacity() {
        let args = NodeServeArgs {
            ssd: "/nvme".into(),
            service: NodeSocket {
                socket: crate::node::DEFAULT_SOCKET.into(),
            },
            capacity: Some(1 << 30),
            dataset_max: None,
            user_max: None,
            metrics_listen: None,
            threads: 4,
            site: SiteArgs {
                site_peers: None,
                node_id: None,
                site_key: None,
                site_key_also: None,
                data_plane: crate::cli::DataPlaneArg::Auto,
                peer_timeout: "10s".into(),
                site_serve_rate: None,
                site_serve_threads: 16,
                ucx_over_tcp: false,
                eager_max: "1M".into(),
            },
        };
        let c = NodeConfig::try_from(args).unwrap();
        assert!(c.template.read_only && !c.template.opens_auto && !c.template.fs.no_open);
        assert_eq!(
            (c.template.capacity, c.template.threads),
            (Some(1 << 30), 4)
        );
        assert!(!c.template.managed);
    }

    #[test]
    fn a_site_is_a_cluster_under_the_site_key_and_bad_values_are_refused() {
        #[derive(Parser)]
        struct Serve {
            #[command(flatten)]
            args: NodeServeArgs,
        }
        let parse = |extra: &[&str]| {
            let mut argv = vec!["serve", "--ssd", "/nvme"];
            argv.extend(extra);
            NodeConfig::try_from(Serve::try_parse_from(argv).unwrap().args)
        };
        let site = [
            "--site-peers",
            "/etc/dyadfs/site.peers",
            "--node-id",
            "3",
            "--site-key",
            "/etc/dyadfs/site.key",
        ];
        let c = parse(&site).unwrap();
        let cluster = &c.template.cluster;
        assert!(cluster.is_cluster());
        assert_eq!(cluster.node_id, Some(3));
        assert_eq!(
            cluster.secret_file.as_deref(),
            Some(std::path::Path::new("/etc/dyadfs/site.key"))
        );
        assert!(!parse(&[]).unwrap().template.cluster.is_cluster());
        let mut rotating = site.to_vec();
        rotating.extend(["--site-key-also", "/etc/dyadfs/site.next"]);
        assert_eq!(
            parse(&rotating).unwrap().template.cluster.secret_also,
            Some(std::path::PathBuf::from("/etc/dyadfs/site.next"))
        );
        let alone = Serve::try_parse_from(["serve", "--ssd", "/n", "--site-key-also", "/k"]);
        assert!(alone.is_err(), "a second key without a site is refused");
        let mut bad = site.to_vec();
        bad.extend(["--peer-timeout", "soon"]);
        assert!(parse(&bad).is_err(), "mount's own parser refuses it");
    }
}
