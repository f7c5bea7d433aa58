//! The opening exchanges of a control connection: the job-secret handshake of
//! [`auth`](super::auth) run over a socket (the server's side async, the client's blocking or
//! async), and the hello that tells a puller how to reach this node's memory over UCX.

use std::io;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use super::auth::{AuthError, Secret};
use super::error::TransportError;
use super::stream::{FrameReader, bad_frame, read_frame, write_frame};
use super::ucx::Worker;
use super::wire::{self, Message, PROTOCOL_VERSION};

pub(super) fn hello(worker: &Worker, node_id: u32, background: bool, eager_max: u32) -> Message {
    let info = worker.info();
    Message::Hello {
        protocol: PROTOCOL_VERSION,
        node_id,
        worker_address: info.worker_address,
        rkey: info.rkey,
        background,
        eager_max,
    }
}

/// How long a connection may take to authenticate before it is closed.
pub(super) const AUTH_WAIT: Duration = Duration::from_secs(10);

fn auth_error(e: AuthError) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, e)
}

/// Runs the server's side of the handshake (see [`super::auth`]) on a fresh connection;
/// returns the peer's authenticated node id. Nothing is answered but the challenge until the
/// peer's proof checks out; a connection that fails is closed.
pub(super) async fn authenticate(s: &mut TcpStream, key: &Secret, me: u32) -> io::Result<u32> {
    let peer = s.peer_addr().ok();
    let late = || io::Error::new(io::ErrorKind::TimedOut, "no authentication in time");
    let r = async {
        let hello = tokio::time::timeout(AUTH_WAIT, read_frame(s))
            .await
            .map_err(|_| late())??
            .map_err(bad_frame)?;
        let (challenge, handshake) =
            super::auth::server_challenge(key, me, hello).map_err(auth_error)?;
        write_frame(s, &challenge).await?;
        let proof = tokio::time::timeout(AUTH_WAIT, read_frame(s))
            .await
            .map_err(|_| late())??
            .map_err(bad_frame)?;
        handshake.check(key, proof).map_err(auth_error)
    }
    .await;
    if let Err(e) = &r {
        warn_auth_failure(peer, e);
    }
    r
}

/// Logs a failed authentication, at most once a second (a flood must not flood the log).
fn warn_auth_failure(peer: Option<SocketAddr>, e: &io::Error) {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static SUPPRESSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    if LAST.swap(now, std::sync::atomic::Ordering::Relaxed) != now {
        let suppressed = SUPPRESSED.swap(0, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(?peer, error = %e, suppressed, "connection failed authentication; closed");
    } else {
        SUPPRESSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The client's side of the handshake on a fresh blocking connection.
pub(super) fn authenticate_blocking(s: &mut FrameReader, key: &Secret, me: u32) -> io::Result<u32> {
    let (hello, handshake) = super::auth::client_hello(me)?;
    s.s.write_all(&wire::encode(&hello))?;
    let challenge = s.next(true)?.expect("a blocking read returns a frame");
    let (proof, server) = handshake.answer(key, challenge).map_err(auth_error)?;
    s.s.write_all(&wire::encode(&proof))?;
    Ok(server)
}

/// The client's side of the handshake on a fresh async connection.
pub(super) async fn authenticate_async(
    s: &mut TcpStream,
    key: &Secret,
    me: u32,
) -> io::Result<u32> {
    let (hello, handshake) = super::auth::client_hello(me)?;
    write_frame(s, &hello).await?;
    let challenge = read_frame(s).await?.map_err(bad_frame)?;
    let (proof, server) = handshake.answer(key, challenge).map_err(auth_error)?;
    write_frame(s, &proof).await?;
    Ok(server)
}

/// A failed handshake: the peer lacks the key (or is not a dyadfs node), or did not answer
/// within `waited`.
pub(super) fn refused(peer: SocketAddr, e: io::Error, waited: Duration) -> TransportError {
    match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidData => TransportError::Protocol {
            peer,
            what: format!("authentication failed: {e}"),
        },
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => TransportError::Timeout {
            peer,
            what: "authentication",
            timeout: waited,
        },
        _ => TransportError::Io { peer, source: e },
    }
}
