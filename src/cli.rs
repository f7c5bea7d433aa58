//! Command-line interface: clap definitions (here) and their conversion into config structs
//! (`convert`). The command and flag names are a contract with scripts outside the project.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::daemon::config::PackMax;

mod convert;
mod node;
mod units;
pub use node::NodeCommand;
use units::{parse_capacity, parse_chunk_size, parse_readahead, parse_wait};
pub use units::{parse_duration, parse_size};

/// `--pack-max`: a size, or `auto`.
fn parse_pack_max(s: &str) -> Result<PackMax, String> {
    if s == "auto" {
        Ok(PackMax::Auto)
    } else {
        parse_size(s).map(PackMax::Bytes)
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "dyadfs",
    version,
    about = "A FUSE filesystem on node-local NVMe: DYAD's managed directory, and a cache of \
shared-FS datasets",
    long_about = "dyadfs mounts a directory on every node of a job, kept on the node's local \
NVMe. Without --backing it is a managed directory: empty at first and the same on every node, \
where files that producers write on one node are read by consumers on others (a consumer's open \
waits for a file not produced yet with --wait). With --backing it also presents a dataset that \
lives on a slow shared file system (Lustre, GPFS), keeping every file read through it in an \
inclusive, chunked, checksummed cache, so later epochs read local copies.\n\n\
Examples:\n  dyadfs mount /dyad --ssd /nvme\n  \
dyadfs mount /dyad --ssd /nvme/dyadfs --backing /lustre/datasets/imagenet\n  \
dyadfs stats /dyad\n  fusermount3 -u /dyad"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of the mount variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Mount a managed directory (or, with --backing, a dataset); returns once the mount is
    /// ready (the daemon keeps running)
    Mount(MountArgs),
    /// Print the counters of a running mount
    Stats(StatsArgs),
    /// Re-check every cached chunk of a running mount against its checksum; bad ones are
    /// dropped (and refetched when next read). Prints what it found
    Scrub(StatsArgs),
    /// The cluster as this node sees it: members, racks, which are up, suspect or down, what
    /// each one's cache holds, and where this node's opens found their bytes
    Status(StatsArgs),
    /// Stage files into the cache before a job reads them, with progress: each is read from
    /// the shared file system at most once in the cluster (a file a peer holds is pulled from
    /// it). Ctrl-C stops cleanly; what was staged stays
    Warm(WarmArgs),
    /// Hand a running mount the order in which a job will read its files: background threads
    /// fill them into the cache in that order (from peers or the shared file system), a
    /// window ahead of what the job has opened. A new list replaces the stream's last one
    Prefetch(PrefetchArgs),
    /// Write a new random job secret (mode 0600) for `mount --secret-file`
    Keygen(KeygenArgs),
    /// Install this binary as the mount helper `mount -t fuse.dyadfs` and /etc/fstab lines use
    /// (a copy under --prefix, with its UCX, and a symlink DIR/mount.fuse.dyadfs to it)
    Install(InstallArgs),
    /// The node service: one root daemon per node that owns its cache across jobs and serves
    /// every user's dataset mounts, checking each open against the user's rights
    #[command(subcommand)]
    Node(NodeCommand),
    /// Move chunks between two processes over UCX (diagnostics and benchmarks)
    #[command(subcommand)]
    Transport(TransportCommand),
    /// The UCX worker of a daemon, started by it (not for direct use)
    #[command(hide = true)]
    DataPlane(DataPlaneArgs),
}

#[derive(Debug, Args)]
pub struct DataPlaneArgs {
    #[arg(long)]
    pub slots: usize,
    #[arg(long)]
    pub slot_size: usize,
    #[arg(long)]
    pub background: bool,
}

/// How FUSE requests reach the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseTransportArg {
    /// The ring where the kernel offers it, /dev/fuse otherwise (one log line says which)
    Auto,
    /// The kernel's io_uring queues, or no mount
    Uring,
    /// /dev/fuse
    Dev,
}

/// How chunks move between nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DataPlaneArg {
    /// UCX RMA where the fabric enforces memory keys (an RDMA device is present and UCX_TLS
    /// allows it), the sealed control stream otherwise
    Auto,
    /// Chunks above --eager-max by UCX RMA gets, on any transport (an unprivileged data-plane
    /// process holds the UCX worker)
    Ucx,
    /// Every chunk on the sealed control stream; no UCX listener at all
    Stream,
}

/// How the kernel opens files (`--opens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OpensArg {
    /// Unasked on a read-only mount of a dataset of small files, asked otherwise
    Auto,
    /// Every open asks the daemon
    Asked,
    /// No open asks the daemon (as --no-open)
    Unasked,
}

/// When a node copies what the others fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReplicateArg {
    /// Never
    Off,
    /// On a cluster mount with --backing, while the cache is under half its capacity
    Auto,
    /// Always on a cluster, while the cache is under 90% of its capacity
    On,
}

#[derive(Debug, Subcommand)]
pub enum TransportCommand {
    /// Serve the files under a directory to pullers
    Serve(ServeArgs),
    /// Pull a file (or a range of it) from a serving holder into a local file
    Pull(PullArgs),
}

#[derive(Debug, Clone, Args)]
pub struct UcxArgs {
    /// Registered buffer slots (chunks staged or in flight at once)
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub slots: u32,
    /// Size of one slot, the largest chunk moved in one RMA get
    #[arg(long, value_name = "SIZE", default_value = "2M", value_parser = parse_size)]
    pub slot_size: u64,
    /// Bound on every wait: connect, each reply, each get
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// This node's id, sent in the hello
    #[arg(long, default_value_t = 0)]
    pub node_id: u32,
    /// How chunks move: by UCX RMA gets (`ucx`) or inline on the control stream (`stream`)
    #[arg(long, value_enum, default_value = "ucx")]
    pub data_plane: DataPlaneArg,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Directory whose files are served (paths are relative to it)
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// Address to listen on, e.g. 127.0.0.1:7400
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port)]
    pub listen: std::net::SocketAddr,
    #[command(flatten)]
    pub ucx: UcxArgs,
    /// Testing only: corrupt every staged chunk after checksumming it
    #[arg(long, hide = true)]
    pub corrupt: bool,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// Holder address
    #[arg(long, value_name = "HOST:PORT")]
    pub peer: std::net::SocketAddr,
    /// Path relative to the holder's root; its size and mtime are read from --version-of
    #[arg(long)]
    pub path: String,
    /// A local copy of the source file whose (size, mtime) name the version to pull
    #[arg(long, value_name = "FILE")]
    pub version_of: PathBuf,
    /// Destination file (created; written at the same offsets)
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// First byte to pull
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
    /// Bytes to pull [default: to the end of the file]
    #[arg(long)]
    pub len: Option<u64>,
    /// Requests in flight
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub window: u32,
    /// Chunks up to this size come inline in the holder's reply instead of by RMA get
    #[arg(long, value_name = "SIZE", default_value = "0", value_parser = parse_size)]
    pub eager_max: u64,
    #[command(flatten)]
    pub ucx: UcxArgs,
}

#[derive(Debug, Clone, Args)]
pub struct MountArgs {
    /// Empty directory to mount on
    pub mountpoint: PathBuf,

    /// Cache directory on node-local NVMe (made, mode 0700, if missing; its parent must exist)
    #[arg(long, value_name = "DIR", help_heading = "Storage")]
    pub ssd: PathBuf,

    /// Dataset directory on the shared file system, presented under the mount and cached
    /// (never modified: files written under the mount stay on this node's cache disk and are
    /// published to the other nodes on close). Without it the mount is a managed directory:
    /// empty at first, the same on every node, holding only what the job's producers write
    #[arg(long, value_name = "DIR", help_heading = "Storage")]
    pub backing: Option<PathBuf>,

    /// Most bytes the cache may hold, e.g. 512M, 20G, 1T [default: leave 10% of the cache
    /// file system free]
    #[arg(long, value_name = "SIZE", value_parser = parse_capacity, help_heading = "Storage")]
    pub capacity: Option<u64>,

    /// Most bytes of produced files one user may hold on this node: files being written (their
    /// length) and files published here that this node keeps as their only copy. The write or
    /// truncate that would cross it fails with EDQUOT (root is not capped) [default: no cap]
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Storage")]
    pub max_staged_per_user: Option<u64>,

    /// Most names (files, directories, links) one user may own in this node's tables: those of
    /// the directories it is home of and the backup copies it keeps. The creation that would
    /// cross it fails with EDQUOT (root is not bounded); each costs the daemon a few hundred
    /// bytes of memory
    #[arg(hide_short_help = true, long, value_name = "N", default_value = "4194304",
          value_parser = clap::value_parser!(u64).range(1..), help_heading = "Storage")]
    pub max_names_per_user: u64,

    /// Cache data files kept open while idle (an LRU: files are opened on demand, so any number
    /// of files can be cached under any descriptor limit) [default: half the descriptor limit,
    /// which the daemon raises to its hard limit at start, at most 65536]
    #[arg(hide_short_help = true, long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..),
          help_heading = "Storage")]
    pub open_files: Option<u64>,

    /// How often the whole cache is re-checked against its checksums in the background, at
    /// the lowest CPU priority and at most --scrub-rate, bad chunks dropped (refetched when next
    /// read): passthrough reads never reach the daemon, so this is how rot in cached files is
    /// found while mounted. 0 turns it off
    #[arg(hide_short_help = true, long, value_name = "DURATION", default_value = "1d", value_parser = parse_duration,
          help_heading = "Storage")]
    pub scrub_interval: Duration,

    /// Bytes a second the background scrub reads at most
    #[arg(hide_short_help = true, long, value_name = "SIZE", default_value = "64M", value_parser = parse_size,
          help_heading = "Storage")]
    pub scrub_rate: u64,

    /// Cache granularity, 1M to 4M: the unit of fetching, checksumming and transfer between nodes
    #[arg(hide_short_help = true, long, value_name = "SIZE", default_value = "2M", value_parser = parse_chunk_size,
          help_heading = "Storage")]
    pub chunk_size: u64,

    /// Cached files of at most this size (at most --chunk-size) are appended to large
    /// preallocated segment files instead of getting a cache file each: no file to create,
    /// close and delete per training sample. Such a file is served by the daemon with its pages
    /// kept by the kernel, never by passthrough. 0 gives every file its own cache file. auto:
    /// 1M where cached files cannot be handed to the kernel (no FUSE passthrough, or
    /// --no-passthrough, --no-open), 0 where they can (a cold cached read then costs the daemon
    /// no READ)
    #[arg(hide_short_help = true, long, value_name = "SIZE|auto", default_value = "auto", value_parser = parse_pack_max,
          help_heading = "Storage")]
    pub pack_max: PackMax,

    /// Chunks of large files that may be partly cached at once: a random read (an HDF5 row, an
    /// LMDB record) caches the 16 KiB pages it touches (at the default chunk size), and each
    /// chunk holding some keeps a table of them in the daemon's memory (about 250 bytes). Past
    /// this many, a random read of a chunk not cached yet caches the chunk whole. The default,
    /// 262144 (about 64 MB), is 512 GiB of large files read at random at 2M chunks
    #[arg(hide_short_help = true, long, value_name = "N", default_value_t = crate::daemon::config::MAX_PARTIAL_CHUNKS,
          help_heading = "Storage")]
    pub max_partial_chunks: u64,

    /// How long names and attributes are trusted (kernel and daemon); a changed backing file
    /// is noticed once this has passed. Accepts 500ms, 30s, 5m, 1h
    #[arg(hide_short_help = true, long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration,
          help_heading = "Metadata")]
    pub metadata_ttl: Duration,

    /// Producer/consumer synchronization: a lookup of a name nobody has published yet waits up
    /// to this long (at most 1h) for a producer to close it, then fails with ENOENT (0: no
    /// waiting). Accepts 500ms, 30s, 5m, 1h
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = parse_wait,
          help_heading = "Metadata")]
    pub wait: Duration,

    /// Most opens one user may keep waiting for names (--wait) at once; past it an open fails
    /// at once with ENOENT (root is bounded too). Each is a sleeping thread of the daemon and a
    /// line in its name home's table; the mount waits for at most 4 times this in all
    #[arg(hide_short_help = true, long, value_name = "N", default_value = "12288",
          value_parser = clap::value_parser!(u32).range(1..=65536), help_heading = "Metadata")]
    pub max_waits_per_user: u32,

    /// Inodes the daemon keeps for the kernel: past this, the least recently looked up are
    /// invalidated (the kernel forgets them; a later lookup makes them anew). Bounds the
    /// daemon's memory on datasets of millions of files (about 400 bytes per inode)
    #[arg(hide_short_help = true, long, value_name = "N", default_value_t = 65536,
          value_parser = clap::value_parser!(u64).range(1024..), help_heading = "Metadata")]
    pub max_inodes: u64,

    /// Memory for attributes read from the shared file system, remembered by path for
    /// --metadata-ttl after the kernel forgets their inode (memory pressure, drop_caches,
    /// --max-inodes), so that looking the name up again within the TTL asks the shared file
    /// system nothing; a stat read ahead of a scan serves its lookups too. About 230 bytes a
    /// name; 0 turns it off
    #[arg(hide_short_help = true, long, value_name = "SIZE", default_value = "16M", value_parser = parse_size,
          help_heading = "Metadata")]
    pub backing_stat_cache: u64,

    /// Serve every read from the daemon (page cache kept) instead of letting the kernel read
    /// complete cached files directly (FUSE passthrough, needs CAP_SYS_ADMIN and Linux >= 6.9)
    #[arg(hide_short_help = true, long, help_heading = "Performance")]
    pub no_passthrough: bool,

    /// Cached files smaller than this are served by the daemon, the kernel keeping their pages,
    /// even with passthrough: an open of a file whose pages the kernel still holds then reads
    /// nothing (with passthrough every open reads the cache file again, and on a writable mount
    /// the next stat asks for attributes again), while a read the kernel's pages miss crosses
    /// the daemon. A file whose bytes are in memory when the kernel first opens it (fetched or
    /// pulled by that open, or just prefetched) passes through all the same, as the daemon would
    /// copy them once more. 1M suits small files read over and over from memory; 0 (the
    /// default) suits reads from the NVMe
    #[arg(hide_short_help = true, long, value_name = "SIZE", default_value = "0", value_parser = parse_size,
          help_heading = "Performance")]
    pub passthrough_min: u64,

    /// Read large files (over 8 MiB) that are not cached whole through the kernel's page cache,
    /// which reads ahead of every read, instead of opening them for direct I/O, where each read
    /// fetches about the pages it touches (a random record of an HDF5 or LMDB file). Suits
    /// programs that read cold large files in order in small unbuffered reads (GNU tar's 10 KiB
    /// reads: a request each under direct I/O); buffered readers are told to read a MiB at a
    /// time either way
    #[arg(hide_short_help = true, long, help_heading = "Performance")]
    pub page_cache_large_files: bool,

    /// Mount read-only (as `-o ro`): nothing can be written under the mount (no producers),
    /// and the kernel keeps a cached file's attributes across reads: on a writable mount it
    /// asks for them again at the first stat after each passthrough read (atime), a round trip
    /// per open of a file read before. For datasets that are only read
    #[arg(hide_short_help = true, long, help_heading = "Performance")]
    pub read_only: bool,

    /// Let the kernel open files without asking the daemon (implies --read-only and
    /// --no-passthrough): an open and a close then cost no round trip, and a file's pages stay
    /// cached between opens. Every read the page cache misses is served by the daemon, so this
    /// suits datasets of small files read again and again; large files read from the NVMe are
    /// faster in passthrough
    #[arg(hide_short_help = true, long, help_heading = "Performance")]
    pub no_open: bool,

    /// How the kernel opens files. `auto`: without asking the daemon (as --no-open) on a
    /// read-only mount (-o ro, --read-only) of a dataset whose typical file is a sample of at
    /// most 1 MiB (the median of the first 64 files a look at --backing meets), where a cached
    /// sample then costs a lookup and one read request instead of an open, a release and a
    /// passthrough read; asking otherwise (writable mounts, large files: passthrough).
    /// `asked`: always ask. `unasked`: as --no-open
    #[arg(
        hide_short_help = true,
        long,
        value_enum,
        value_name = "HOW",
        default_value = "auto",
        help_heading = "Performance"
    )]
    pub opens: OpensArg,

    /// Threads serving FUSE requests
    #[arg(hide_short_help = true, long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=256), help_heading = "Performance")]
    pub threads: u16,

    /// How FUSE requests reach the daemon. `uring`: through the kernel's FUSE-over-io_uring
    /// queues, one per CPU: a reply and the fetch of the next request are one system call,
    /// answered on the request's CPU (Linux 6.14 or later, with
    /// /sys/module/fuse/parameters/enable_uring set to Y; --threads is then spread over the
    /// CPUs). `dev`: by reading and writing /dev/fuse. `auto`: the ring where the kernel offers
    /// it
    #[arg(
        hide_short_help = true,
        long,
        value_enum,
        value_name = "KIND",
        default_value = "auto",
        help_heading = "Performance"
    )]
    pub fuse_transport: FuseTransportArg,

    /// How far the kernel reads ahead of a reader in a file the daemon serves itself (packed
    /// samples, large files not passed through, --no-open) or around a fault in a mapped
    /// large file not cached whole, in READs of at most 1 MiB: the daemon sets its mount's
    /// /sys/class/bdi/MAJOR:MINOR/read_ahead_kb once the mount is up (INIT caps it at the
    /// kernel's 128 KiB; root only). 0 leaves the kernel's. By default 24K where complete files
    /// pass through and large ones are opened for direct I/O (what the kernel still reads
    /// ahead then is the faults of mapped large files: LMDB, np.memmap read at random fetch
    /// about what they touch), else the kernel's. 1M reads a large cached file with --no-open
    /// faster, but a large file pulled from a peer slower (fewer, larger READs served one
    /// after another)
    #[arg(hide_short_help = true, long, value_name = "SIZE", value_parser = parse_readahead,
          help_heading = "Performance")]
    pub kernel_readahead: Option<u64>,

    /// Threads filling readahead chunks in the background: each pulls (or reads) one chunk at
    /// a time, so this is the number of chunks of a large file in flight (the readahead window
    /// is at most 8 chunks)
    #[arg(hide_short_help = true, long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=64), help_heading = "Performance")]
    pub readahead_threads: u16,

    /// Threads filling the files of prefetch lists (`dyadfs prefetch`) in list order
    #[arg(hide_short_help = true, long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=64), help_heading = "Performance")]
    pub prefetch_threads: u16,

    /// How many files of a prefetch list the threads may fill ahead of the last one the job
    /// opened (and at most a quarter of the cache's capacity in bytes)
    #[arg(hide_short_help = true, long, value_name = "N", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..), help_heading = "Performance")]
    pub prefetch_window: u32,

    /// This node's id in the peers file [default: from the launcher: SLURM_NODEID,
    /// FLUX_TASK_RANK, OMPI_COMM_WORLD_RANK or PMI_RANK]
    #[arg(long, value_name = "N", help_heading = "Cluster")]
    pub node_id: Option<u32>,

    /// Peers file: one line per node, `ID HOST:PORT RACK`, the same file on every node.
    /// Without it (and without --rendezvous) the mount is single-node
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "rendezvous",
        help_heading = "Cluster"
    )]
    pub peers: Option<PathBuf>,

    /// Bootstrap without a peers file: each daemon registers in this directory (on the shared
    /// file system) and waits for --nodes daemons
    #[arg(long, value_name = "DIR", requires_all = ["nodes", "listen"], help_heading = "Cluster")]
    pub rendezvous: Option<PathBuf>,

    /// Number of daemons meeting in --rendezvous
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..),
          help_heading = "Cluster")]
    pub nodes: Option<u32>,

    /// Address peers reach this daemon at, an address or a host name (resolved once, at
    /// mount) [default: this node's line in the peers file]
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port, help_heading = "Cluster")]
    pub listen: Option<std::net::SocketAddr>,

    /// This node's rack (with --rendezvous; a peers file names racks itself)
    #[arg(
        long,
        value_name = "NAME",
        default_value = "rack0",
        help_heading = "Cluster"
    )]
    pub rack: String,

    /// Bound on every wait for a peer: lookups, pulls, another node's fetch (a rendezvous
    /// waits at least 60s)
    #[arg(hide_short_help = true, long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration,
          help_heading = "Cluster")]
    pub peer_timeout: Duration,

    /// How soon a node that stops answering (frozen, dead, cut off) is known to be down by
    /// every other node (SWIM gossip over UDP on the --listen address): from then on nobody
    /// waits on it, and the paths it was home of move to the next node. Before, a read waits
    /// at most one --peer-timeout on it
    #[arg(hide_short_help = true, long, value_name = "DURATION", default_value = "3s", value_parser = parse_duration,
          help_heading = "Cluster")]
    pub failure_detection: Duration,

    /// Chunks up to this size come from a peer inline, in the holder's reply on the control
    /// connection (one round trip, no RMA get and no release: a small file's pull then wakes
    /// no UCX progress thread on either side); larger chunks are staged and got over UCX RMA.
    /// The default covers a sample of a few hundred KiB with its container's overhead (a
    /// 256 KiB array in an .npz is 262,642 bytes). On an RDMA fabric, where a get costs the
    /// holder no CPU, a smaller value (e.g. 32K) keeps bulk bytes off TCP; 0 sends every
    /// chunk by RMA
    #[arg(hide_short_help = true, long, value_name = "SIZE", default_value = "1M", value_parser = parse_size,
          help_heading = "Cluster")]
    pub eager_max: u64,

    /// Threads that serve peers' pull connections, however many connections they open (a
    /// quarter as many more serve background copies). A connection waiting for its next
    /// request keeps a thread only while no other needs one
    #[arg(hide_short_help = true, long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=4096), help_heading = "Cluster")]
    pub serve_threads: u32,

    /// How chunks move between nodes. `stream`: inline on the authenticated, encrypted control
    /// connection, nothing else listening. `ucx`: chunks above --eager-max by UCX RMA gets,
    /// through an unprivileged data-plane process that shares only staged chunks with the
    /// daemon (on tcp, UCX emulates RMA in software and anyone who reaches its port can read
    /// and write that process's memory; see docs/SECURITY.md). `auto`: `ucx` where
    /// an RDMA device is present and UCX_TLS leaves tcp out (the NIC then checks memory keys),
    /// `stream` elsewhere
    #[arg(
        long,
        value_enum,
        value_name = "KIND",
        default_value = "auto",
        help_heading = "Cluster"
    )]
    pub data_plane: DataPlaneArg,

    /// Let a UCX data plane use UCX's tcp transport: on a node without RDMA (or where UCX_TLS
    /// allows tcp), `--data-plane ucx` is refused without it, since anyone who reaches the
    /// data-plane process's port can then read and write its memory (chunks there are sealed:
    /// they see ciphertext and forge nothing, but can stop it). `auto` never uses tcp
    #[arg(hide_short_help = true, long, help_heading = "Cluster")]
    pub ucx_over_tcp: bool,

    /// Copy the files other nodes fetch into this node's cache too, in the background, in
    /// batches from the node that fetched them (never from the shared file system): at the
    /// lowest CPU priority, paused while the machine's CPUs are less than 20% idle, never
    /// evicting, so a later epoch that reads another shard finds it local. `auto`: on a
    /// cluster with --backing, while the cache is under half its capacity (a dataset that fits
    /// twice over is copied whole; a larger one in part, leaving the rest of the disk to the
    /// node's own reads). `on` (or `--replicate` alone): up to 90% of the capacity, also on a
    /// managed directory. `off`: never. Each node moves a dataset over the network at most once
    #[arg(
        hide_short_help = true,
        long,
        value_enum,
        value_name = "WHEN",
        default_value = "auto",
        num_args = 0..=1,
        default_missing_value = "on",
        help_heading = "Cluster"
    )]
    pub replicate: ReplicateArg,

    /// The job secret every node proves on every connection (a key file from `dyadfs keygen`,
    /// owned by the daemon's user, mode 0600). With --rendezvous and no secret, the first daemon
    /// creates DIR/secret. A multi-node mount without one refuses to start unless --insecure
    #[arg(
        long,
        value_name = "FILE",
        env = "DYADFS_SECRET_FILE",
        help_heading = "Cluster"
    )]
    pub secret_file: Option<PathBuf>,

    /// Let a multi-node mount run without a job secret: anyone who can reach the port can then
    /// read every cached file and change the produced namespace. Only for closed test networks
    #[arg(hide_short_help = true, long, help_heading = "Cluster")]
    pub insecure: bool,

    /// Stay in the foreground (logs to stderr) instead of daemonizing
    #[arg(long, short = 'f', help_heading = "Process")]
    pub foreground: bool,

    /// Log file of the background daemon [default: <SSD>/dyadfs.log]
    #[arg(
        hide_short_help = true,
        long,
        value_name = "FILE",
        help_heading = "Process"
    )]
    pub log_file: Option<PathBuf>,

    /// FUSE mount options, comma separated (allow_other, allow_root, ...)
    #[arg(
        short = 'o',
        value_name = "OPTIONS",
        value_delimiter = ',',
        help_heading = "Process"
    )]
    pub options: Vec<String>,

    /// The node service to attach to (`dyadfs node serve`): the mount is then served by it,
    /// from the node's cache shared by every job and user, with your rights checked at every
    /// open [default: DYADFS_NODE_SOCKET, or /run/dyadfs/node.sock where a service listens]
    #[arg(long, value_name = "PATH", help_heading = "Process")]
    pub node_socket: Option<PathBuf>,

    /// Never attach to a node service: this mount runs its own daemon
    #[arg(long, help_heading = "Process", conflicts_with = "node_socket")]
    pub no_node: bool,

    /// Testing: attach without the kernel's permission checks, as any client of the service's
    /// socket may, so that the service alone judges every access
    #[arg(long, hide = true)]
    pub node_without_kernel_checks: bool,

    /// Serve the counters of `dyadfs stats` and latency histograms (opens, chunk fills by
    /// source, locator lookups by tier) as Prometheus metrics at http://HOST:PORT/metrics
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port, help_heading = "Process")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Write a trace of FUSE operations, chunk fills, pulls and locator lookups to FILE, in the
    /// Chrome trace-event JSON format (DFTracer's; open it in ui.perfetto.dev). Off by default
    #[arg(
        hide_short_help = true,
        long,
        value_name = "FILE",
        help_heading = "Process"
    )]
    pub trace: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// File to create (never overwritten); give it to every node of the job
    pub file: PathBuf,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Mount point of a running dyadfs
    pub mountpoint: PathBuf,
    /// Print one JSON object instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Where mount(8) looks for helpers
    #[arg(long, default_value = "/sbin")]
    pub dir: PathBuf,
    /// Where the binary and its UCX libraries are copied (`bin/`, `lib/`, `etc/`; root's
    /// when run as root): the helper links to that copy, which finds its libraries there
    #[arg(long, default_value = "/usr/local/lib/dyadfs")]
    pub prefix: PathBuf,
    /// Where a `dyadfs` command is linked to the copy, for whatever runs it by name (the Slurm
    /// prolog and epilog, `dyadfs stats`)
    #[arg(long, default_value = "/usr/local/bin")]
    pub bin_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct WarmArgs {
    /// Mount point of a running dyadfs
    pub mountpoint: PathBuf,
    /// Files or directory trees under the mount to stage (absolute, or relative to the current
    /// directory) [default: the whole mount, unless --list]
    pub paths: Vec<PathBuf>,
    /// A file listing paths to stage, one per line (as PATH; `-` reads standard input)
    #[arg(long, value_name = "FILE")]
    pub list: Option<PathBuf>,
    /// Files staged at once
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: u32,
    /// Stage only this node's share of the list (split by path over the cluster's members):
    /// run it on every node (e.g. `srun dyadfs warm --cluster ...`) and the dataset lands
    /// once in the cluster, spread over the nodes
    #[arg(long)]
    pub cluster: bool,
}

#[derive(Debug, Args)]
pub struct PrefetchArgs {
    /// Mount point of a running dyadfs
    pub mountpoint: PathBuf,
    /// The files in reading order, one per line: absolute paths under the mount or paths
    /// relative to its root (`-` reads standard input; an empty list cancels the stream)
    #[arg(long, value_name = "FILE")]
    pub list: PathBuf,
    /// Which of your lists this one replaces (e.g. one per rank on the node)
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub stream: String,
}

/// `HOST:PORT`, an address or a host name resolved now ([`crate::core::addr`]).
fn host_port(text: &str) -> Result<std::net::SocketAddr, String> {
    crate::core::addr::socket_addr(text).map_err(|why| format!("not an address: {why}"))
}
