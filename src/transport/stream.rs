//! Frames over sockets: [`wire`](super::wire) messages read and written on blocking streams
//! (a pull runs on the thread that needs the bytes) and tokio streams (the server and the RPC
//! client), idle connections kept per peer, and how a failed stream read is reported.

use std::collections::HashMap;
use std::io;
use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::error::TransportError;
use super::frame::WireError;
use super::wire::{self, Message};
use crate::core::sync::lock;

pub(super) async fn read_frame(
    s: &mut (impl AsyncReadExt + Unpin),
) -> io::Result<Result<Message, WireError>> {
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).await?;
    let len = match wire::check_len(prefix) {
        Ok(l) => l,
        Err(e) => return Ok(Err(e)),
    };
    let mut body = vec![0; len];
    s.read_exact(&mut body).await?;
    Ok(wire::decode(&body))
}

pub(super) async fn write_frame(
    s: &mut (impl AsyncWriteExt + Unpin),
    m: &Message,
) -> io::Result<()> {
    s.write_all(&wire::encode(m)).await
}

/// Reads frames from a blocking socket, keeping what arrived beyond the current frame.
pub(super) struct FrameReader {
    pub(super) s: std::net::TcpStream,
    buf: Vec<u8>,
    /// The socket's read and write timeout as last set through [`FrameReader::bound`].
    bound: Option<Duration>,
}

impl FrameReader {
    pub(super) fn new(s: std::net::TcpStream) -> Self {
        FrameReader {
            s,
            buf: Vec::new(),
            bound: None,
        }
    }

    /// Bounds each read and write on the socket by `t`. A bound already set is kept if it is at
    /// most `t` and no less than 7/8 of it: a read's remaining time differs at every call, and
    /// two syscalls per pull to set it exactly would buy waits at most 1/8 longer.
    pub(super) fn bound(&mut self, t: Duration) -> io::Result<()> {
        if !self.bound.is_some_and(|b| b <= t && b >= t - t / 8) {
            self.s.set_read_timeout(Some(t))?;
            self.s.set_write_timeout(Some(t))?;
            self.bound = Some(t);
        }
        Ok(())
    }

    /// Reads exactly `dst.len()` raw bytes that follow the last frame (a `Data` chunk): those
    /// already buffered first, the rest straight from the socket into `dst`.
    pub(super) fn read_raw(&mut self, dst: &mut [u8]) -> io::Result<()> {
        let have = self.buf.len().min(dst.len());
        dst[..have].copy_from_slice(&self.buf[..have]);
        self.buf.drain(..have);
        self.s.read_exact(&mut dst[have..])
    }

    /// The next frame. `wait`: block for it (within the socket's read timeout: then an error of
    /// kind `WouldBlock` or `TimedOut`); otherwise `Ok(None)` if none has arrived whole.
    pub(super) fn next(&mut self, wait: bool) -> io::Result<Option<Message>> {
        loop {
            if let Some(prefix) = self.buf.first_chunk::<4>() {
                let len = wire::check_len(*prefix).map_err(bad_frame)?;
                if self.buf.len() >= 4 + len {
                    let msg = wire::decode(&self.buf[4..4 + len]).map_err(bad_frame)?;
                    self.buf.drain(..4 + len);
                    return Ok(Some(msg));
                }
            }
            let mut chunk = [0u8; 16 << 10];
            if !wait {
                self.s.set_nonblocking(true)?;
            }
            let r = self.s.read(&mut chunk);
            if !wait {
                self.s.set_nonblocking(false)?;
            }
            match r {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !wait => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Writes all of `parts` with as few syscalls as the socket allows (a frame and the raw bytes
/// that follow it in one `writev`).
pub(super) fn write_all_parts(
    s: &mut impl io::Write,
    parts: &mut [io::IoSlice<'_>],
) -> io::Result<()> {
    let mut parts = parts;
    while !parts.is_empty() {
        match s.write_vectored(parts) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut parts, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) fn bad_frame(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Idle connections per peer, kept between uses: connecting costs at least a TCP handshake.
/// A connection goes back only after a complete exchange, so the next user never reads a late
/// answer meant for another.
pub(super) struct IdlePool<C> {
    idle: std::sync::Mutex<HashMap<SocketAddr, Vec<C>>>,
}

impl<C> Default for IdlePool<C> {
    fn default() -> Self {
        IdlePool {
            idle: Default::default(),
        }
    }
}

impl<C> IdlePool<C> {
    pub(super) fn take(&self, peer: SocketAddr) -> Option<C> {
        lock(&self.idle).get_mut(&peer).and_then(Vec::pop)
    }

    pub(super) fn put(&self, peer: SocketAddr, conn: C) {
        lock(&self.idle).entry(peer).or_default().push(conn);
    }
}

/// Maps a failed read or write on a control stream to the error a pull reports: a read
/// timeout (`what` did not arrive in time) or an I/O error.
pub(super) fn stream_error(
    peer: SocketAddr,
    e: io::Error,
    what: &'static str,
    t: Duration,
) -> TransportError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => TransportError::Timeout {
            peer,
            what,
            timeout: t,
        },
        _ => TransportError::Io { peer, source: e },
    }
}
