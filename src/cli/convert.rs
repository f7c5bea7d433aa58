//! The conversions of the command line into the daemon's plain config structs: nothing below
//! the command line knows clap.

use super::*;
use crate::daemon::config::{
    ClusterConfig, DataPlaneKind, MANAGED_ROOT, MountConfig, PullToolConfig, Replicate,
    ServeConfig, UcxConfig,
};
use crate::fs::FsConfig;
use crate::fuse::FuseTransport;

impl From<WarmArgs> for crate::client::warm::WarmConfig {
    fn from(a: WarmArgs) -> Self {
        crate::client::warm::WarmConfig {
            mountpoint: a.mountpoint,
            paths: a.paths,
            list: a.list,
            threads: a.threads as usize,
            cluster: a.cluster,
        }
    }
}

impl From<PrefetchArgs> for crate::client::prefetch::PrefetchConfig {
    fn from(a: PrefetchArgs) -> Self {
        crate::client::prefetch::PrefetchConfig {
            mountpoint: a.mountpoint,
            list: a.list,
            stream: a.stream,
        }
    }
}

impl From<MountArgs> for MountConfig {
    fn from(a: MountArgs) -> MountConfig {
        let backing = a.backing.clone();
        let no_open = a.no_open || a.opens == OpensArg::Unasked;
        MountConfig {
            mountpoint: a.mountpoint,
            managed: backing.is_none(),
            backing: backing.unwrap_or_else(|| a.ssd.join(MANAGED_ROOT)),
            ssd: a.ssd,
            capacity: a.capacity,
            max_staged_per_user: a.max_staged_per_user,
            max_names_per_user: a.max_names_per_user,
            open_files: a.open_files,
            chunk_size: a.chunk_size,
            pack_max: a.pack_max,
            max_partial_chunks: a.max_partial_chunks,
            scrub_interval: a.scrub_interval,
            scrub_rate: a.scrub_rate,
            fs: FsConfig {
                metadata_ttl: a.metadata_ttl,
                passthrough: !a.no_passthrough && !no_open,
                pack_auto: a.pack_max == PackMax::Auto,
                passthrough_min: a.passthrough_min,
                direct_large: !a.page_cache_large_files,
                readahead_threads: a.readahead_threads.into(),
                wait: a.wait,
                max_waits_per_user: a.max_waits_per_user as usize,
                max_inodes: a.max_inodes as usize,
                backing_stat_cache: a.backing_stat_cache,
                prefetch_threads: a.prefetch_threads.into(),
                prefetch_window: a.prefetch_window as usize,
                no_open,
            },
            opens_auto: a.opens == OpensArg::Auto && !no_open,
            threads: a.threads,
            kernel_readahead: a.kernel_readahead,
            fuse_transport: match a.fuse_transport {
                FuseTransportArg::Auto => FuseTransport::Auto,
                FuseTransportArg::Uring => FuseTransport::Uring,
                FuseTransportArg::Dev => FuseTransport::Dev,
            },
            read_only: a.read_only || no_open,
            options: a.options,
            node_socket: a.node_socket,
            no_node: a.no_node,
            node_without_kernel_checks: a.node_without_kernel_checks,
            metrics_listen: a.metrics_listen,
            foreground: a.foreground,
            log_file: a.log_file,
            cluster: ClusterConfig {
                node_id: a.node_id,
                peers: a.peers,
                rendezvous: a.rendezvous,
                nodes: a.nodes,
                listen: a.listen,
                rack: a.rack,
                peer_timeout: a.peer_timeout,
                eager_max: a.eager_max,
                serve_threads: a.serve_threads as usize,
                data_plane: a.data_plane.into(),
                ucx_over_tcp: a.ucx_over_tcp,
                failure_detection: a.failure_detection,
                replicate: a.replicate.into(),
                secret_file: a.secret_file,
                secret_also: None,
                insecure: a.insecure,
            },
        }
    }
}

impl From<ReplicateArg> for Replicate {
    fn from(a: ReplicateArg) -> Replicate {
        match a {
            ReplicateArg::Off => Replicate::Off,
            ReplicateArg::Auto => Replicate::Auto,
            ReplicateArg::On => Replicate::On,
        }
    }
}

impl From<DataPlaneArg> for DataPlaneKind {
    fn from(a: DataPlaneArg) -> DataPlaneKind {
        match a {
            DataPlaneArg::Auto => DataPlaneKind::Auto,
            DataPlaneArg::Ucx => DataPlaneKind::Ucx,
            DataPlaneArg::Stream => DataPlaneKind::Stream,
        }
    }
}

impl From<UcxArgs> for UcxConfig {
    fn from(a: UcxArgs) -> UcxConfig {
        UcxConfig {
            data_plane: a.data_plane.into(),
            slots: a.slots,
            slot_size: a.slot_size,
            timeout: a.timeout,
            node_id: a.node_id,
        }
    }
}

impl From<ServeArgs> for ServeConfig {
    fn from(a: ServeArgs) -> ServeConfig {
        ServeConfig {
            root: a.root,
            listen: a.listen,
            ucx: a.ucx.into(),
            corrupt: a.corrupt,
        }
    }
}

impl From<PullArgs> for PullToolConfig {
    fn from(a: PullArgs) -> PullToolConfig {
        PullToolConfig {
            peer: a.peer,
            path: a.path,
            version_of: a.version_of,
            out: a.out,
            offset: a.offset,
            len: a.len,
            window: a.window,
            eager_max: a.eager_max,
            ucx: a.ucx.into(),
        }
    }
}
