//! Connections to a daemon's control port as a job member makes them: authenticated with the
//! job secret, every later frame sealed (attack tests speak the protocol by hand through them).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use dyadfs::transport::auth::{self, Secret};
use dyadfs::transport::session;
use dyadfs::transport::wire::{self, Message, PROTOCOL_VERSION};

use super::Cluster;

/// A connection past the handshake: every frame sealed with its session keys, as a member's.
pub struct Sealed {
    pub s: TcpStream,
    seal: session::Sealer,
    open: session::Opener,
}

impl Sealed {
    pub fn send(&mut self, m: &Message) -> std::io::Result<()> {
        self.s.write_all(&self.seal.frame(&wire::to_body(m)))
    }

    /// The next frame, or `None` if the peer closed the connection (or sent nothing in time).
    pub fn recv(&mut self) -> Option<Message> {
        self.s
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut prefix = [0u8; 4];
        self.s.read_exact(&mut prefix).ok()?;
        let mut body = vec![0; wire::check_len(prefix).ok()?];
        self.s.read_exact(&mut body).ok()?;
        let plain = self.open.frame(&mut body).ok()?;
        wire::decode(plain).ok()
    }
}

/// One plain frame (before the handshake's keys).
pub fn send(s: &mut TcpStream, m: &Message) -> std::io::Result<()> {
    s.write_all(&wire::encode(m))
}

/// The next plain frame, or `None` if the peer closed the connection (or sent nothing in time).
pub fn recv(s: &mut TcpStream) -> Option<Message> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).ok()?;
    let mut body = vec![0; wire::check_len(prefix).ok()?];
    s.read_exact(&mut body).ok()?;
    wire::decode(&body).ok()
}

/// A puller's Hello as node `id` (its UCX address and rkey are never used by the holder).
pub fn puller_hello_as(id: u32) -> Message {
    Message::Hello {
        protocol: PROTOCOL_VERSION,
        node_id: id,
        worker_address: vec![1; 16],
        rkey: vec![1; 16],
        background: false,
        eager_max: 0,
    }
}

/// A puller's Hello as node 0.
pub fn puller_hello() -> Message {
    puller_hello_as(0)
}

/// A connection to node `i` authenticated with the job secret (as a peer's would be).
pub fn authenticated(c: &Cluster, i: usize, key: &Secret) -> Sealed {
    authenticated_as(c, i, key, 0)
}

/// As [`authenticated`], proving the key as node `id`.
pub fn authenticated_as(c: &Cluster, i: usize, key: &Secret, id: u32) -> Sealed {
    let mut s = TcpStream::connect(c.addr(i)).unwrap();
    let (hello, handshake) = auth::client_hello(id).unwrap();
    send(&mut s, &hello).unwrap();
    let (proof, _, keys) = handshake.answer(key, recv(&mut s).unwrap()).unwrap();
    send(&mut s, &proof).unwrap();
    let (seal, open) = session::client(&keys);
    Sealed { s, seal, open }
}

/// An authenticated puller connection to node `i` as node `id`, past its hello.
pub fn puller_as(c: &Cluster, i: usize, key: &Secret, id: u32) -> Sealed {
    let mut s = authenticated_as(c, i, key, id);
    s.send(&puller_hello_as(id)).unwrap();
    assert!(matches!(s.recv(), Some(Message::Hello { .. })));
    s
}

/// An authenticated puller connection to node `i` (as node 0), past its hello.
pub fn puller(c: &Cluster, i: usize, key: &Secret) -> Sealed {
    puller_as(c, i, key, 0)
}
