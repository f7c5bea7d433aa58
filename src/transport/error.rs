//! What can go wrong talking to a peer, with the peer's address: the one error type of the
//! transport's clients (pulls and RPCs).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::frame::WireError;
use super::ucx::UcxError;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("peer {peer}: {source}")]
    Io { peer: SocketAddr, source: io::Error },
    #[error("peer {peer}: {source}")]
    Wire { peer: SocketAddr, source: WireError },
    #[error("peer {peer}: {source}")]
    Ucx { peer: SocketAddr, source: UcxError },
    #[error("peer {peer}: timed out after {timeout:?} waiting for {what}")]
    Timeout {
        peer: SocketAddr,
        what: &'static str,
        timeout: Duration,
    },
    #[error("peer {peer}: chunk at offset {offset} failed its checksum")]
    Checksum { peer: SocketAddr, offset: u64 },
    /// A staged chunk did not open under the connection's key: changed, swapped or replayed in
    /// the shared slab it crossed (not the holder's fault: its cache is not suspect).
    #[error("peer {peer}: staged chunk at offset {offset} failed its seal (forged in transit)")]
    Forged { peer: SocketAddr, offset: u64 },
    #[error("peer {peer}: {message}")]
    Remote { peer: SocketAddr, message: String },
    #[error("peer {peer}: protocol violation: {what}")]
    Protocol { peer: SocketAddr, what: String },
    #[error("no free local slot within {0:?}")]
    NoSlot(Duration),
    /// The puller's sink refused a verified chunk (its cache could not store it): no fault of
    /// the peer, and no use trying another.
    #[error("pulled bytes not taken here: {0}")]
    Sink(io::Error),
    /// This node's own data plane failed (its process died, or no shared slot was free): no
    /// fault of the peer; another holder may still serve.
    #[error("this node's data plane: {0}")]
    Local(String),
}
