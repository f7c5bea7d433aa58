//! The locator's port to its peers ([`crate::locator::peers::Peers`]) on the transport, both
//! ways: locator messages as payloads of the control port's RPC, on connections authenticated
//! with the job secret (none with `--insecure`), and the handler that hands the ones arriving
//! to this node's locator.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::locator::NodeId;
use crate::locator::peers::{PeerFuture, Peers};
use crate::locator::proto::{self, Msg};
use crate::locator::service::LocatorService;
use crate::transport::TransportError;
use crate::transport::auth::Secret;
use crate::transport::rpc::Rpcs;
use crate::transport::server::{RpcFuture, RpcHandler};
use tracing::Instrument;

/// The daemon's adapter: locator messages as payloads of the transport's RPC, on connections
/// authenticated with the job secret (none with `--insecure`).
pub struct RpcPeers(Rpcs);

impl RpcPeers {
    pub fn new(own: NodeId, secret: Option<Arc<Secret>>) -> Arc<RpcPeers> {
        Arc::new(RpcPeers(Rpcs::new(secret.map(|k| (own, k)))))
    }
}

impl Peers for RpcPeers {
    fn call<'a>(
        &'a self,
        _to: NodeId,
        addr: SocketAddr,
        msg: &Msg,
        timeout: Duration,
    ) -> PeerFuture<'a> {
        let payload = proto::encode(msg);
        Box::pin(async move {
            let reply = self.0.call(addr, &payload, timeout).await?;
            decoded(addr, &reply)
        })
    }

    fn call_blocking(
        &self,
        _to: NodeId,
        addr: SocketAddr,
        msg: &Msg,
        timeout: Duration,
    ) -> Result<Msg, TransportError> {
        let reply = self.0.call_blocking(addr, &proto::encode(msg), timeout)?;
        decoded(addr, &reply)
    }
}

/// A reply payload from `peer` as a message.
pub(super) fn decoded(peer: SocketAddr, payload: &[u8]) -> Result<Msg, TransportError> {
    proto::decode(payload).map_err(|source| TransportError::Wire { peer, source })
}

/// The RPC handler registered on the control port (it needs the service's `Arc`). A payload
/// that is no locator message closes the connection.
pub struct Handler(pub Arc<LocatorService>);

impl RpcHandler for Handler {
    fn handle(&self, peer: Option<u32>, payload: Vec<u8>) -> RpcFuture {
        let service = self.0.clone();
        service.arrived();
        Box::pin(async move {
            let msg = proto::decode(&payload)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            let span = tracing::debug_span!("answer", msg = msg.kind());
            Ok(proto::encode(
                &service.answer(peer, msg).instrument(span).await,
            ))
        })
    }
}
