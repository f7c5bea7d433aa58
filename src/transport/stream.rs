//! Frames over sockets: [`wire`](super::wire) messages read and written on blocking streams
//! (a pull runs on the thread that needs the bytes) and tokio streams (the server and the RPC
//! client), sealed once the handshake has given the connection its keys
//! ([`session`](super::session)), idle connections kept per peer, and how a failed stream read is
//! reported.

use std::collections::HashMap;
use std::io;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::error::TransportError;
use super::frame::{MAX_FRAME, WireError};
use super::session::{Forged, Opener, Sealer};
use super::wire::{self, Message};
use crate::core::sync::lock;

/// Largest frame read before the handshake has proven the peer: the handshake's frames are a
/// few dozen bytes, and a stranger must not make this node buffer more.
pub(super) const PRE_AUTH_MAX: usize = 4 << 10;

/// A frame's announced length, refused above `limit` before its body is read.
fn frame_len(prefix: [u8; 4], limit: usize) -> Result<usize, WireError> {
    let len = wire::check_len(prefix)?;
    if len > limit {
        return Err(WireError::TooLarge(len));
    }
    Ok(len)
}

fn forged(e: Forged) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The body of the next frame on an async stream, refused above `limit` bytes before it is read.
async fn read_body(
    s: &mut (impl AsyncReadExt + Unpin),
    limit: usize,
) -> io::Result<Result<Vec<u8>, WireError>> {
    let mut prefix = [0u8; 4];
    s.read_exact(&mut prefix).await?;
    let len = match frame_len(prefix, limit) {
        Ok(l) => l,
        Err(e) => return Ok(Err(e)),
    };
    let mut body = vec![0; len];
    s.read_exact(&mut body).await?;
    Ok(Ok(body))
}

/// One frame from an async stream, plain, of at most `limit` bytes (the handshake's).
pub(super) async fn read_plain(
    s: &mut (impl AsyncReadExt + Unpin),
    limit: usize,
) -> io::Result<Result<Message, WireError>> {
    Ok(read_body(s, limit)
        .await?
        .and_then(|body| wire::decode(&body)))
}

/// One plain frame to an async stream (the handshake's).
pub(super) async fn write_plain(
    s: &mut (impl AsyncWriteExt + Unpin),
    m: &Message,
) -> io::Result<()> {
    s.write_all(&wire::encode(m)).await
}

/// An async connection past its handshake: every frame sealed (plain with `--insecure`).
pub(super) struct AsyncConn {
    pub(super) s: TcpStream,
    seal: Sealer,
    open: Opener,
}

impl AsyncConn {
    pub(super) fn new(s: TcpStream, (seal, open): (Sealer, Opener)) -> AsyncConn {
        AsyncConn { s, seal, open }
    }

    pub(super) async fn read(&mut self) -> io::Result<Result<Message, WireError>> {
        let mut body = match read_body(&mut self.s, MAX_FRAME).await? {
            Ok(b) => b,
            Err(e) => return Ok(Err(e)),
        };
        let plain = self.open.frame(&mut body).map_err(forged)?;
        Ok(wire::decode(plain))
    }

    pub(super) async fn write(&mut self, m: &Message) -> io::Result<()> {
        let frame = self.seal.frame(&wire::to_body(m));
        self.s.write_all(&frame).await
    }

    /// The blocking socket and its halves, for a connection handed to a serving thread.
    pub(super) fn into_blocking(self) -> io::Result<FrameReader> {
        let s = self.s.into_std()?;
        s.set_nonblocking(false)?;
        let mut r = FrameReader::new(s);
        r.secure((self.seal, self.open));
        Ok(r)
    }
}

/// A blocking connection: frames read (keeping what arrived beyond the current frame) and
/// written, sealed once [`FrameReader::secure`] has given it its keys.
pub(super) struct FrameReader {
    pub(super) s: std::net::TcpStream,
    buf: Vec<u8>,
    /// The socket's read and write timeout as last set through [`FrameReader::bound`].
    bound: Option<Duration>,
    /// Largest frame accepted: [`PRE_AUTH_MAX`] until the handshake is done.
    limit: usize,
    seal: Sealer,
    open: Opener,
}

impl FrameReader {
    /// A fresh connection: plain frames of at most [`PRE_AUTH_MAX`] bytes.
    pub(super) fn new(s: std::net::TcpStream) -> Self {
        FrameReader {
            s,
            buf: Vec::new(),
            bound: None,
            limit: PRE_AUTH_MAX,
            seal: Sealer::plain(),
            open: Opener::plain(),
        }
    }

    /// The handshake is done: frames of up to [`MAX_FRAME`] bytes, sealed with its keys
    /// (plain halves: `--insecure`).
    pub(super) fn secure(&mut self, (seal, open): (Sealer, Opener)) {
        self.seal = seal;
        self.open = open;
        self.limit = MAX_FRAME;
    }

    /// A message as the bytes to write next on this connection (sealed with the next sequence
    /// number: frames must be written in the order they were made).
    pub(super) fn encode(&mut self, m: &Message) -> Vec<u8> {
        self.seal.frame(&wire::to_body(m))
    }

    /// Makes and writes one frame.
    pub(super) fn send(&mut self, m: &Message) -> io::Result<()> {
        let f = self.encode(m);
        self.s.write_all(&f)
    }

    /// Seals a raw chunk in place, to be written right after the frame made before it; returns
    /// the tag to write after it.
    pub(super) fn seal_record(&mut self, bytes: &mut [u8]) -> Vec<u8> {
        self.seal.record(bytes)
    }

    /// Seals a chunk to be staged for a get in place; returns its record number and tag.
    pub(super) fn seal_staged(&mut self, bytes: &mut [u8]) -> (u64, Vec<u8>) {
        self.seal.staged(bytes)
    }

    /// Opens a staged chunk got into memory of ours, in place.
    pub(super) fn open_staged(&self, bytes: &mut [u8], record: u64, tag: &[u8]) -> io::Result<()> {
        self.open.staged(bytes, record, tag).map_err(forged)
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

    /// Reads exactly `dst.len()` raw bytes that follow the last frame (a `Data` chunk), and the
    /// tag that seals them: those already buffered first, the rest straight from the socket
    /// into `dst` and the tag together (a read of the tag alone cost a system call per chunk);
    /// then opens them in place.
    pub(super) fn read_raw(&mut self, dst: &mut [u8]) -> io::Result<()> {
        let mut tag = [0u8; super::session::TAG];
        let tag = &mut tag[..self.open.overhead()];
        let had = self.take_buffered(dst);
        let had_tag = self.take_buffered(tag);
        read_exact_parts(
            &mut self.s,
            &mut [
                io::IoSliceMut::new(&mut dst[had..]),
                io::IoSliceMut::new(&mut tag[had_tag..]),
            ],
        )?;
        self.open.record(dst, tag).map_err(forged)
    }

    /// Whether bytes past the last frame read are buffered (a frame, or part of one).
    pub(super) fn has_buffered(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Copies what is buffered, up to `dst.len()` bytes, to the start of `dst`; how many.
    fn take_buffered(&mut self, dst: &mut [u8]) -> usize {
        let have = self.buf.len().min(dst.len());
        dst[..have].copy_from_slice(&self.buf[..have]);
        self.buf.drain(..have);
        have
    }

    /// The next frame. `wait`: block for it (within the socket's read timeout: then an error of
    /// kind `WouldBlock` or `TimedOut`); otherwise `Ok(None)` if none has arrived whole.
    pub(super) fn next(&mut self, wait: bool) -> io::Result<Option<Message>> {
        loop {
            if let Some(prefix) = self.buf.first_chunk::<4>() {
                let len = frame_len(*prefix, self.limit).map_err(bad_frame)?;
                if self.buf.len() >= 4 + len {
                    let plain = self.open.frame(&mut self.buf[4..4 + len]).map_err(forged)?;
                    let msg = wire::decode(plain).map_err(bad_frame)?;
                    self.buf.drain(..4 + len);
                    return Ok(Some(msg));
                }
            }
            let mut chunk = [0u8; 16 << 10];
            let r = if wait {
                self.s.read(&mut chunk)
            } else {
                // One syscall, where switching the socket to nonblocking and back took three.
                // SAFETY: reads at most `chunk.len()` bytes into `chunk`, on a socket we own.
                let n = unsafe {
                    libc::recv(
                        self.s.as_raw_fd(),
                        chunk.as_mut_ptr().cast(),
                        chunk.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            };
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

/// Fills all of `parts` from `s`, with as few syscalls as the bytes' arrival allows.
fn read_exact_parts(s: &mut impl io::Read, parts: &mut [io::IoSliceMut<'_>]) -> io::Result<()> {
    let mut parts = parts;
    io::IoSliceMut::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        match s.read_vectored(parts) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => io::IoSliceMut::advance_slices(&mut parts, n),
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
