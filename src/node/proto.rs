//! What a client and the node service say to each other on the service's socket: one request
//! per connection, one reply, each a single message (MessagePack). The caller's identity is
//! never in a message: the service takes it from the socket (`SO_PEERCRED`, `SO_PEERGROUPS`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The protocol's version: a client and a service of another refuse each other, saying so.
pub const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Serve the mount whose `/dev/fuse` descriptor comes with this message (made by
    /// `fusermount3` for the caller at `mountpoint`), presenting the dataset at `backing`.
    Attach {
        version: u32,
        mountpoint: PathBuf,
        backing: PathBuf,
    },
    /// What the node holds and serves.
    Status { version: u32 },
    /// Root only: drop dataset `key` (its files not open now; the whole dataset when no mount
    /// serves it).
    Evict { version: u32, key: String },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// The mount is served; its dataset's key and the cache directory holding it.
    Attached {
        dataset: String,
        cache: PathBuf,
    },
    /// Refused: the errno a mount command exits with, and why, in a line.
    Refused {
        errno: i32,
        message: String,
    },
    Status(NodeStatus),
    /// What an eviction freed, and whether the dataset is gone.
    Evicted {
        files: u64,
        bytes: u64,
        gone: bool,
    },
}

/// `dyadfs node status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    pub version: u32,
    pub cache: PathBuf,
    /// Bytes every dataset's cache together may hold.
    pub capacity: u64,
    /// This node's part of the site (`None`: no site).
    pub site: Option<SiteStatus>,
    /// Every user who reads datasets here: how many, and the bytes charged to it.
    pub users: Vec<UserStatus>,
    pub datasets: Vec<DatasetStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UserStatus {
    pub uid: u32,
    pub datasets: usize,
    /// Its part of the cached bytes of each dataset it reads (split equally among their users).
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SiteStatus {
    pub node: u32,
    pub members: usize,
    /// Files whose holders this node keeps as their rack's home, and as their global home.
    pub home_rack_files: u64,
    pub home_global_files: u64,
    /// Members gossip finds down now, and how often this node took over a dead member's rows.
    #[serde(default)]
    pub members_down: u64,
    #[serde(default)]
    pub failovers: u64,
    /// Its copies' gains and drops its rack homes acknowledged since it started.
    #[serde(default)]
    pub copies_published: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatasetStatus {
    /// The shared directory's identity (its file system's id, its inode and birth time, in hex).
    pub key: String,
    /// Its path, as the first user who attached it reached it.
    pub backing: PathBuf,
    pub cached_files: u64,
    pub cached_bytes: u64,
    /// Its share of the node's capacity.
    pub capacity: u64,
    /// Mounts served now, and every user who attached it since the service started.
    pub mounts: u64,
    pub users: Vec<u32>,
    /// Opens served from the cache, opens in all, and bytes read from the shared file system.
    pub local_hits: u64,
    pub opens: u64,
    pub bytes_from_backing: u64,
    /// Files and bytes pulled from other nodes of the site, and bytes served to them.
    pub peer_fetches: u64,
    pub bytes_from_peers: u64,
    pub bytes_served_to_peers: u64,
    /// Opens and lookups refused because the shared file system said no to the caller.
    pub rights_denied: u64,
}

pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    rmp_serde::to_vec(message).expect("a message of ours always encodes")
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> std::io::Result<T> {
    rmp_serde::from_slice(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}
