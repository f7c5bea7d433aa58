//! The client side of the one-message RPCs that share the control port with pulls (the
//! locator's traffic): a payload of bytes out, a payload of bytes back, on pooled connections.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use super::auth::Secret;
use super::error::TransportError;
use super::handshake::{authenticate_async, authenticate_blocking, refused};
use super::session::{Opener, Sealer};
use super::stream::{AsyncConn, FrameReader, IdlePool, stream_error};
use super::wire::Message;

/// What a blocking RPC waits for, in its timeout errors.
const RPC_REPLY: &str = "an RPC reply";

/// Sends one-message RPCs (locator traffic), keeping idle connections per peer between calls:
/// a lookup then costs one round trip instead of a TCP handshake and a round trip.
#[derive(Default)]
pub struct Rpcs {
    idle: IdlePool<AsyncConn>,
    /// Connections for calls made from plain threads ([`Rpcs::call_blocking`]).
    idle_blocking: IdlePool<FrameReader>,
    /// This node's id and the job secret new connections authenticate with (`None`:
    /// `--insecure`).
    auth: Option<(u32, Arc<Secret>)>,
}

impl Rpcs {
    pub fn new(auth: Option<(u32, Arc<Secret>)>) -> Rpcs {
        Rpcs {
            auth,
            ..Default::default()
        }
    }

    /// Sends a request payload to `peer` and waits (bounded) for its reply payload.
    pub async fn call(
        &self,
        peer: SocketAddr,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let msg = &Message::Rpc(payload.to_vec());
        if let Some(s) = self.idle.take(peer) {
            // An idle connection may have died with a restarted peer (the request then never
            // arrived): one fresh try. Requests are idempotent, so a rare repeat is harmless.
            match self.call_on(s, peer, msg, timeout).await {
                Err(TransportError::Io { .. }) => {}
                r => return r,
            }
        }
        let s = tokio::time::timeout(timeout, TcpStream::connect(peer))
            .await
            .map_err(|_| TransportError::Timeout {
                peer,
                what: "connect",
                timeout,
            })?
            .map_err(|source| TransportError::Io { peer, source })?;
        let _ = s.set_nodelay(true);
        let conn = match &self.auth {
            Some((me, key)) => {
                tokio::time::timeout(timeout, authenticate_async(s, key, *me))
                    .await
                    .map_err(|_| TransportError::Timeout {
                        peer,
                        what: "authentication",
                        timeout,
                    })?
                    .map_err(|e| refused(peer, e, timeout))?
                    .1
            }
            None => AsyncConn::new(s, (Sealer::plain(), Opener::plain())),
        };
        self.call_on(conn, peer, msg, timeout).await
    }

    /// As [`Rpcs::call`], with blocking I/O on the calling thread (a FUSE request's): the
    /// reply wakes that thread directly, not a reactor thread that then wakes it.
    pub fn call_blocking(
        &self,
        peer: SocketAddr,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let msg = &Message::Rpc(payload.to_vec());
        if let Some(s) = self.idle_blocking.take(peer) {
            // As in `call`: one fresh try after a dead idle connection.
            match self.call_blocking_on(s, peer, msg, timeout) {
                Err(TransportError::Io { .. }) => {}
                r => return r,
            }
        }
        let s = std::net::TcpStream::connect_timeout(&peer, timeout)
            .map_err(|e| stream_error(peer, e, "connect", timeout))?;
        let _ = s.set_nodelay(true);
        let mut s = FrameReader::new(s);
        s.bound(timeout)
            .map_err(|e| stream_error(peer, e, RPC_REPLY, timeout))?;
        match &self.auth {
            Some((me, key)) => {
                authenticate_blocking(&mut s, key, *me).map_err(|e| refused(peer, e, timeout))?;
            }
            None => s.secure((Sealer::plain(), Opener::plain())),
        }
        self.call_blocking_on(s, peer, msg, timeout)
    }

    fn call_blocking_on(
        &self,
        mut s: FrameReader,
        peer: SocketAddr,
        msg: &Message,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let err = |e| stream_error(peer, e, RPC_REPLY, timeout);
        // An idle connection keeps the bound of its last call; this call may have less time.
        s.bound(timeout).map_err(err)?;
        s.send(msg).map_err(err)?;
        let reply = s
            .next(true)
            .map_err(|e| match e.kind() {
                io::ErrorKind::InvalidData => TransportError::Protocol {
                    peer,
                    what: e.to_string(),
                },
                _ => err(e),
            })?
            .expect("a blocking read returns a frame");
        let reply = payload_of(peer, reply)?;
        self.idle_blocking.put(peer, s);
        Ok(reply)
    }

    /// One call on one connection, which goes back to the pool after a complete reply.
    async fn call_on(
        &self,
        mut s: AsyncConn,
        peer: SocketAddr,
        msg: &Message,
        timeout: Duration,
    ) -> Result<Vec<u8>, TransportError> {
        let run = async {
            s.write(msg).await?;
            s.read().await
        };
        let reply = tokio::time::timeout(timeout, run)
            .await
            .map_err(|_| TransportError::Timeout {
                peer,
                what: "an RPC reply",
                timeout,
            })?
            .map_err(|source| TransportError::Io { peer, source })?
            .map_err(|source| TransportError::Wire { peer, source })?;
        let reply = payload_of(peer, reply)?;
        self.idle.put(peer, s);
        Ok(reply)
    }
}

/// The payload of an RPC's reply; any other message is a protocol violation.
fn payload_of(peer: SocketAddr, reply: Message) -> Result<Vec<u8>, TransportError> {
    match reply {
        Message::Rpc(p) => Ok(p),
        other => Err(TransportError::Protocol {
            peer,
            what: format!("expected an RPC reply, got {other:?}"),
        }),
    }
}
