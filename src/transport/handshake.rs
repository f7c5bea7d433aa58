//! The opening exchanges of a control connection: the job-secret handshake of
//! [`auth`](super::auth) run over a socket (the server's side async, the client's blocking or
//! async), after which the connection is sealed ([`session`]), and the hello that tells a
//! puller how to reach this node's slab over UCX, checked before UCX sees it.

use std::io;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use super::auth::{AuthError, Secret};
use super::error::TransportError;
use super::session;
use super::stream::{AsyncConn, FrameReader, PRE_AUTH_MAX, bad_frame, read_plain, write_plain};
use super::ucx::PeerInfo;
use super::wire::{self, Message, PROTOCOL_VERSION};

/// The hello this node sends on a pull connection: how to reach its slab over UCX (`ucx`, from
/// [`super::plane::DataPlane::info`]; empty without: then every chunk travels inline on the
/// sealed stream) and the largest chunk it takes inline.
pub(super) fn hello(
    ucx: Option<PeerInfo>,
    node_id: u32,
    background: bool,
    eager_max: u32,
) -> Message {
    let (worker_address, rkey) = ucx.map_or_else(Default::default, |i| (i.worker_address, i.rkey));
    Message::Hello {
        protocol: PROTOCOL_VERSION,
        node_id,
        worker_address,
        rkey,
        background,
        eager_max,
    }
}

/// Longest UCX worker address or packed rkey a hello may carry (UCX's are a few hundred bytes).
pub const MAX_UCX_BLOB: usize = 4 << 10;

/// Checks a peer's hello blobs before UCX sees them: both present or both absent (no UCX data
/// plane), each at most [`MAX_UCX_BLOB`] bytes. Returns them if present.
pub fn ucx_info(worker_address: Vec<u8>, rkey: Vec<u8>) -> Result<Option<PeerInfo>, String> {
    match (worker_address.len(), rkey.len()) {
        (0, 0) => Ok(None),
        (0, _) | (_, 0) => Err("a hello with a UCX address but no rkey, or the reverse".into()),
        (a, r) if a > MAX_UCX_BLOB || r > MAX_UCX_BLOB => Err(format!(
            "a hello's UCX address ({a} bytes) or rkey ({r} bytes) exceeds {MAX_UCX_BLOB} bytes"
        )),
        _ => Ok(Some(PeerInfo {
            worker_address,
            rkey,
        })),
    }
}

/// How long a connection may take to complete the handshake, in all, before it is closed: the
/// three frames take a round trip and two HMACs; a stranger must not hold a place for long.
pub(super) const AUTH_WAIT: Duration = Duration::from_secs(3);

fn auth_error(e: AuthError) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, e)
}

/// Runs the server's side of the handshake (see [`super::auth`]) on a fresh connection;
/// returns the peer's authenticated node id and the connection, sealed from here on. Nothing is
/// answered but the challenge until the peer's proof checks out, no frame above
/// [`PRE_AUTH_MAX`] bytes is read, and all of it takes at most [`AUTH_WAIT`]; a connection
/// that fails is closed.
pub(super) async fn authenticate(
    mut s: TcpStream,
    key: &Secret,
    me: u32,
) -> io::Result<(u32, AsyncConn)> {
    let peer = s.peer_addr().ok();
    let r = async {
        let hello = read_plain(&mut s, PRE_AUTH_MAX).await?.map_err(bad_frame)?;
        let (challenge, handshake) =
            super::auth::server_challenge(key, me, hello).map_err(auth_error)?;
        write_plain(&mut s, &challenge).await?;
        let proof = read_plain(&mut s, PRE_AUTH_MAX).await?.map_err(bad_frame)?;
        handshake.check(key, proof).map_err(auth_error)
    };
    let r = match tokio::time::timeout(AUTH_WAIT, r).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no authentication in time",
        )),
    };
    match r {
        Ok((client, keys)) => Ok((client, AsyncConn::new(s, session::server(&keys)))),
        Err(e) => {
            warn_auth_failure(peer, &e);
            Err(e)
        }
    }
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

/// The client's side of the handshake on a fresh blocking connection, which is sealed from
/// here on.
pub(super) fn authenticate_blocking(s: &mut FrameReader, key: &Secret, me: u32) -> io::Result<u32> {
    let (hello, handshake) = super::auth::client_hello(me)?;
    s.s.write_all(&wire::encode(&hello))?;
    let challenge = s.next(true)?.expect("a blocking read returns a frame");
    let (proof, server, keys) = handshake.answer(key, challenge).map_err(auth_error)?;
    s.s.write_all(&wire::encode(&proof))?;
    s.secure(session::client(&keys));
    Ok(server)
}

/// The client's side of the handshake on a fresh async connection; returns it sealed.
pub(super) async fn authenticate_async(
    mut s: TcpStream,
    key: &Secret,
    me: u32,
) -> io::Result<(u32, AsyncConn)> {
    let (hello, handshake) = super::auth::client_hello(me)?;
    write_plain(&mut s, &hello).await?;
    let challenge = read_plain(&mut s, PRE_AUTH_MAX).await?.map_err(bad_frame)?;
    let (proof, server, keys) = handshake.answer(key, challenge).map_err(auth_error)?;
    write_plain(&mut s, &proof).await?;
    Ok((server, AsyncConn::new(s, session::client(&keys))))
}

/// What a peer answered to this node's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// Its proof checks out under our key.
    Accepted,
    /// It answered, with a proof our key does not check: one of us has another key.
    WrongKey,
    /// No answer to judge by (not running, not a dyadfs node, too slow): why.
    NoAnswer(String),
}

/// Asks the node at `peer` to prove the job key (the server proves first, see
/// [`super::auth`]) through a client handshake, then hangs up: whether this node's `key` is
/// the job's, seen from a peer.
pub fn check_key(peer: SocketAddr, key: &Secret, me: u32, timeout: Duration) -> KeyCheck {
    let no = |e: &dyn std::fmt::Display| KeyCheck::NoAnswer(e.to_string());
    let s = match std::net::TcpStream::connect_timeout(&peer, timeout) {
        Ok(s) => s,
        Err(e) => return no(&e),
    };
    let mut s = FrameReader::new(s);
    if let Err(e) = s.bound(timeout) {
        return no(&e);
    }
    match authenticate_blocking(&mut s, key, me) {
        Ok(_) => KeyCheck::Accepted,
        Err(e) if e.get_ref().and_then(|i| i.downcast_ref()) == Some(&AuthError::BadMac) => {
            KeyCheck::WrongKey
        }
        Err(e) => no(&e),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_blobs_are_both_or_neither_and_bounded() {
        assert!(matches!(ucx_info(vec![], vec![]), Ok(None)));
        let info = ucx_info(vec![1; 48], vec![2; 20]).unwrap().unwrap();
        assert_eq!((info.worker_address.len(), info.rkey.len()), (48, 20));
        // Either blob empty alone: the empty Vec's dangling pointer must never reach UCX.
        assert!(ucx_info(vec![1; 48], vec![]).is_err());
        assert!(ucx_info(vec![], vec![2; 20]).is_err());
        assert!(ucx_info(vec![1; MAX_UCX_BLOB + 1], vec![2; 20]).is_err());
        assert!(ucx_info(vec![1; 48], vec![2; MAX_UCX_BLOB + 1]).is_err());
        // What UCX unpacks is a copy with zeros after it.
        let padded = PeerInfo::padded(vec![1; 48], vec![2; 20]);
        assert!(
            padded.worker_address.len() > 48 && padded.worker_address[48..].iter().all(|&b| b == 0)
        );
        assert!(padded.rkey.len() > 20 && padded.rkey[20..].iter().all(|&b| b == 0));
    }
}
