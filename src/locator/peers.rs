//! How the locator reaches another daemon's locator: one port, [`Peers`]. The daemon's adapter
//! is the transport's authenticated RPC (`cluster::peers`); the unit tests plug in an
//! in-process double (`loopback.rs`: messages handed to other services in the same process,
//! with frozen, dead and lying peers injected). The locator never opens a connection.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use super::membership::NodeId;
use super::proto::Msg;
use crate::transport::TransportError;

/// A call's answer, as the port delivers it.
pub type PeerFuture<'a> = Pin<Box<dyn Future<Output = Result<Msg, TransportError>> + Send + 'a>>;

/// Another member's locator, as this one asks it. Both calls are bounded by `timeout`; what
/// comes back is decoded but not yet checked (the service checks every reply as it checks a
/// request).
pub trait Peers: Send + Sync {
    /// `msg` to member `to` (listening at `addr`) and its answer.
    fn call<'a>(
        &'a self,
        to: NodeId,
        addr: SocketAddr,
        msg: &Msg,
        timeout: Duration,
    ) -> PeerFuture<'a>;

    /// As [`Peers::call`], from a plain thread (a FUSE request's), with blocking I/O: the reply
    /// wakes the calling thread directly.
    fn call_blocking(
        &self,
        to: NodeId,
        addr: SocketAddr,
        msg: &Msg,
        timeout: Duration,
    ) -> Result<Msg, TransportError>;
}
