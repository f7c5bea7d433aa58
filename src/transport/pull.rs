//! The pull protocol over the control channel (TCP, [`wire`] frames: blocking on both ends of a
//! pull, tokio for the locator RPCs sharing the port) and the UCX data plane. A holder stages
//! each requested chunk from its [`ChunkStore`] into a registered slot, sealed (see
//! [`super::session`]), and answers with the slot's address, the chunk's crc32c and the seal's
//! number and tag; the puller RMA-gets it into a slot of its own, opens the seal there (the
//! shared slab it came through is anyone's over UCX's tcp: only the key proves the bytes are
//! the holder's), verifies the checksum, hands the bytes to its sink and releases the remote
//! slot. Several
//! requests are in flight per pull, and the next chunk's get runs while one is checked and
//! sunk; every wait is bounded.

use std::collections::VecDeque;
use std::io;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::auth::Secret;
use super::error::TransportError;
use super::handshake::{authenticate_blocking, hello, refused, ucx_info};
use super::plane::{DataPlane, Getting};
use super::session::{Opener, Sealer};
use super::stream::{FrameReader, IdlePool, stream_error};
use super::ucx::{NoResult, Slot};
use super::wire::Message;
use crate::core::Version;

#[derive(Debug, Clone)]
pub struct PullConfig {
    pub node_id: u32,
    /// Bytes per request (at most the slot size on both sides).
    pub chunk: u32,
    /// Requests in flight per pull.
    pub window: usize,
    /// Bound on every wait (connect, each reply, each get).
    pub timeout: Duration,
    /// Background copies (`--replicate`): holders serve them at the lowest CPU priority.
    pub background: bool,
    /// The job secret every connection authenticates with (`None`: `--insecure`).
    pub secret: Option<Arc<Secret>>,
    /// Chunks of up to this many bytes come inline in the holder's reply (one round trip, no
    /// RMA get, no release); larger ones are staged and got. 0: every chunk by RMA.
    pub eager_max: u32,
}

/// A byte range of one version of a file.
#[derive(Debug, Clone)]
pub struct Want {
    pub path: String,
    pub version: Version,
    pub offset: u64,
    pub len: u64,
}

impl Want {
    /// All `len` bytes of a file (one of a batch).
    pub fn whole(path: &str, version: Version, len: u64) -> Want {
        Want {
            path: path.to_string(),
            version,
            offset: 0,
            len,
        }
    }
}

/// Where pulled chunks go: `sink(offset, bytes, crc32c)`, straight from the registered slot
/// the chunk was pulled into, its checksum already checked.
pub type Sink<'a> = &'a mut (dyn FnMut(u64, &[u8], u32) -> io::Result<()> + Send);

/// Pulls from holders, keeping one idle connection (control stream + UCX endpoint) per holder
/// between pulls: connecting costs a TCP handshake, a hello and a UCX wireup.
///
/// Blocking: a pull runs on the thread that needs the bytes (a FUSE request or readahead
/// thread), so each reply wakes that thread directly, not a reactor thread that then wakes it.
pub struct Puller {
    pub worker: Arc<DataPlane>,
    pub cfg: PullConfig,
    idle: IdlePool<Conn>,
}

/// A holder connection: its control stream and its UCX endpoint (none when either side has no
/// UCX data plane: every chunk then comes inline).
struct Conn {
    frames: FrameReader,
    ucx_peer: Option<super::ucx::PeerId>,
}

impl Conn {
    /// Writes the frames gathered in `outgoing` (if any) in one write and empties it.
    fn send(&mut self, outgoing: &mut Vec<u8>) -> io::Result<()> {
        if !outgoing.is_empty() {
            self.frames.s.write_all(outgoing)?;
            outgoing.clear();
        }
        Ok(())
    }
}

impl Puller {
    pub fn new(worker: Arc<DataPlane>, cfg: PullConfig) -> Puller {
        Puller {
            worker,
            cfg,
            idle: IdlePool::default(),
        }
    }

    /// Pulls `want` from the holder at `peer`, handing each verified chunk to the sink.
    /// Returns the bytes pulled.
    pub fn pull(
        &self,
        peer: SocketAddr,
        want: &Want,
        sink: Sink<'_>,
    ) -> Result<u64, TransportError> {
        self.pull_within(peer, want, sink, self.cfg.timeout)
    }

    /// As [`Puller::pull`], each wait bounded by `within` if that is less than the timeout
    /// (what is left of a read's time).
    pub fn pull_within(
        &self,
        peer: SocketAddr,
        want: &Want,
        sink: Sink<'_>,
        within: Duration,
    ) -> Result<u64, TransportError> {
        let t = within.min(self.cfg.timeout);
        let pooled = self.idle.take(peer);
        let reused = pooled.is_some();
        let conn = match pooled {
            Some(c) => c,
            None => connect(&self.worker, &self.cfg, peer, t)?,
        };
        match self.pull_on(peer, conn, want, sink, t) {
            // An idle connection may have died with a restarted holder: one fresh try.
            Err(TransportError::Io { .. } | TransportError::Ucx { .. }) if reused => {
                let conn = connect(&self.worker, &self.cfg, peer, t)?;
                self.pull_on(peer, conn, want, sink, t)
            }
            r => r,
        }
    }

    /// One pull on one connection, which goes back to the pool if it worked.
    fn pull_on(
        &self,
        peer: SocketAddr,
        mut conn: Conn,
        want: &Want,
        sink: Sink<'_>,
        t: Duration,
    ) -> Result<u64, TransportError> {
        let r = conn
            .frames
            .bound(t)
            .map_err(|e| stream_error(peer, e, "a staged chunk", t))
            .and_then(|()| pull_chunks(&self.worker, &self.cfg, peer, &mut conn, want, sink, t));
        match r {
            Ok(_) => self.idle.put(peer, conn),
            Err(_) => {
                if let Some(p) = conn.ucx_peer {
                    self.worker.disconnect(p);
                }
            }
        }
        r
    }
}

/// Where the files of a batch go: `sink(i, bytes, crc32c)` for `wants[i]`, its checksum checked.
pub type BatchSink<'a> = &'a mut (dyn FnMut(usize, &[u8], u32) -> io::Result<()> + Send);

impl Puller {
    /// Pulls several small files (each one whole chunk of at most the eager size, so it comes
    /// inline) from the holder at `peer` on one connection: every request goes out in one
    /// write (up to the window), the replies stream back in order, each waiting at most
    /// `within`. Returns each file's outcome (the holder refusing one does not stop the
    /// others); an error is the connection's, after which the caller pulls what is left
    /// another way.
    pub fn pull_batch(
        &self,
        peer: SocketAddr,
        wants: &[Want],
        sink: BatchSink<'_>,
        within: Duration,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let t = within.min(self.cfg.timeout);
        let limit = u64::from(self.cfg.chunk.min(self.cfg.eager_max.max(1)));
        if wants.iter().any(|w| w.len == 0 || w.len > limit) {
            return Err(TransportError::Local(
                "a batch of whole small files only".into(),
            ));
        }
        let mut conn = match self.idle.take(peer) {
            Some(c) => c,
            None => connect(&self.worker, &self.cfg, peer, t)?,
        };
        let r = conn
            .frames
            .bound(t)
            .map_err(|e| stream_error(peer, e, "a batch", t))
            .and_then(|()| pull_files(&self.worker, &self.cfg, peer, &mut conn, wants, sink, t));
        match r {
            Ok(_) => self.idle.put(peer, conn),
            Err(_) => {
                if let Some(p) = conn.ucx_peer {
                    self.worker.disconnect(p);
                }
            }
        }
        r
    }
}

/// [`Puller::pull_batch`] on one connection: requests `id = i` for `wants[i]`, at most the
/// window in flight, their replies read in order into one slot.
fn pull_files(
    worker: &Arc<DataPlane>,
    cfg: &PullConfig,
    peer: SocketAddr,
    conn: &mut Conn,
    wants: &[Want],
    sink: BatchSink<'_>,
    t: Duration,
) -> Result<Vec<Result<(), TransportError>>, TransportError> {
    let err = |what| move |e| stream_error(peer, e, what, t);
    let n = wants.len();
    let mut outcomes = Vec::with_capacity(n);
    let mut slot = worker.slab().take(t).ok_or(TransportError::NoSlot(t))?;
    let mut outgoing: Vec<u8> = Vec::new();
    let mut sent = 0;
    while outcomes.len() < n {
        while sent < n && sent - outcomes.len() < cfg.window.max(1) {
            let w = &wants[sent];
            outgoing.extend(conn.frames.encode(&Message::Request {
                id: sent as u64,
                path: w.path.clone(),
                version: w.version,
                offset: w.offset,
                len: w.len as u32,
            }));
            sent += 1;
        }
        conn.send(&mut outgoing)
            .map_err(err("a batch's requests to be sent"))?;
        let i = outcomes.len();
        let want = &wants[i];
        match conn.frames.next(true).map_err(err("a batch's file"))? {
            Some(Message::Data { id, len, crc32c })
                if id == i as u64 && u64::from(len) == want.len =>
            {
                let bytes = slot.bytes_mut(len as usize);
                conn.frames
                    .read_raw(bytes)
                    .map_err(err("an inline chunk"))?;
                let bytes = slot.bytes(len as usize);
                outcomes.push(if crc32c::crc32c(bytes) != crc32c {
                    Err(TransportError::Checksum {
                        peer,
                        offset: want.offset,
                    })
                } else {
                    sink(i, bytes, crc32c).map_err(TransportError::Sink)
                });
            }
            Some(Message::Error { id, message }) if id == i as u64 => {
                outcomes.push(Err(TransportError::Remote { peer, message }));
            }
            other => {
                return Err(TransportError::Protocol {
                    peer,
                    what: format!("expected Data or Error {i}, got {other:?}"),
                });
            }
        }
    }
    Ok(outcomes)
}

/// Opens a control stream to a holder, exchanges hellos and creates the UCX endpoint, each
/// step waiting at most `t`.
fn connect(
    worker: &Arc<DataPlane>,
    cfg: &PullConfig,
    peer: SocketAddr,
    t: Duration,
) -> Result<Conn, TransportError> {
    let err = |what| move |e| stream_error(peer, e, what, t);
    let s = std::net::TcpStream::connect_timeout(&peer, t).map_err(err("connect"))?;
    let _ = s.set_nodelay(true);
    let mut frames = FrameReader::new(s);
    frames.bound(t).map_err(err("connect"))?;
    // The holder's rkey is sent only to a peer that proved the key, and sent to a holder only
    // after it proved it too; every frame from here on is sealed.
    match &cfg.secret {
        Some(key) => {
            authenticate_blocking(&mut frames, key, cfg.node_id)
                .map_err(|e| refused(peer, e, t))?;
        }
        None => frames.secure((Sealer::plain(), Opener::plain())),
    }
    // Without UCX of our own (read once: the hello and the endpoint must agree), every chunk
    // comes inline.
    let mine = worker.info();
    let ours = mine.is_some();
    let eager_max = if ours { cfg.eager_max } else { u32::MAX };
    frames
        .send(&hello(mine, cfg.node_id, cfg.background, eager_max))
        .map_err(err("hello"))?;
    let theirs = match frames.next(true).map_err(err("hello"))? {
        Some(Message::Hello {
            worker_address,
            rkey,
            ..
        }) => ucx_info(worker_address, rkey)
            .map_err(|what| TransportError::Protocol { peer, what })?,
        other => {
            return Err(TransportError::Protocol {
                peer,
                what: format!("expected Hello, got {other:?}"),
            });
        }
    };
    let ucx_peer = match theirs {
        Some(info) if ours => Some(
            worker
                .connect(info, t)
                .map_err(|source| TransportError::Ucx { peer, source })?,
        ),
        _ => None,
    };
    Ok(Conn { frames, ucx_peer })
}

/// How many chunks a pull has arriving at once (RMA gets in flight, or inline reads done):
/// while one chunk is checked and handed to the sink (a crc pass and a copy into the cache
/// file), the next is already on the wire, so the link is not idle during a chunk's local work.
const ARRIVING: usize = 2;

/// A chunk whose reply has been read: its bytes are in a slot already (inline), or on their way
/// into one (an RMA get of what the holder staged at `addr`).
struct Arriving {
    id: u64,
    crc: u32,
    bytes: Bytes,
}

enum Bytes {
    Inline(Slot),
    /// The staged record's number and tag open it once it is in our slot.
    Getting {
        addr: u64,
        get: Getting,
        record: u64,
        tag: Vec<u8>,
    },
}

fn pull_chunks(
    worker: &Arc<DataPlane>,
    cfg: &PullConfig,
    peer: SocketAddr,
    conn: &mut Conn,
    want: &Want,
    sink: Sink<'_>,
    t: Duration,
) -> Result<u64, TransportError> {
    let (offset, len) = (want.offset, want.len);
    let err = |what| move |e| stream_error(peer, e, what, t);
    let chunk = u64::from(cfg.chunk.min(worker.slab().slot_size() as u32));
    let n = len.div_ceil(chunk);
    let at = |i: u64| (offset + i * chunk, chunk.min(len - i * chunk) as u32);
    // Requests sent, replies read, chunks handed to the sink.
    let (mut sent, mut replied, mut done) = (0u64, 0u64, 0u64);
    let mut arriving: VecDeque<Arriving> = VecDeque::with_capacity(ARRIVING);
    // Frames to send, written together: a release rides with the next requests.
    let mut outgoing: Vec<u8> = Vec::new();
    while done < n {
        while sent < n && sent - done < cfg.window as u64 {
            let (off, l) = at(sent);
            outgoing.extend(conn.frames.encode(&Message::Request {
                id: sent,
                path: want.path.clone(),
                version: want.version,
                offset: off,
                len: l,
            }));
            sent += 1;
        }
        conn.send(&mut outgoing)
            .map_err(err("a request to be sent"))?;
        while replied < sent && arriving.len() < ARRIVING {
            // The next chunk to sink waits for a slot; a chunk read ahead of it takes one only if
            // one is free, so pulls never hold a slot while waiting for another (the slab is
            // shared with every other pull and with what this node serves).
            let wait = if arriving.is_empty() {
                t
            } else {
                Duration::ZERO
            };
            let Some(slot) = worker.slab().take(wait) else {
                if arriving.is_empty() {
                    return Err(TransportError::NoSlot(t));
                }
                break;
            };
            let next = arrival(
                worker,
                cfg,
                conn,
                peer,
                (replied, at(replied).1),
                slot,
                wait,
                t,
            )?;
            arriving.push_back(next);
            replied += 1;
        }
        let Some(Arriving { id, crc, bytes }) = arriving.pop_front() else {
            unreachable!("every chunk not yet sunk has had its request sent")
        };
        let (off, l) = at(id);
        let slot = landed(conn, bytes, &mut outgoing, sent == n, peer, (off, l), t)?;
        let bytes = slot.bytes(l as usize);
        if crc32c::crc32c(bytes) != crc {
            return Err(TransportError::Checksum { peer, offset: off });
        }
        sink(off, bytes, crc).map_err(TransportError::Sink)?;
        done += 1;
    }
    Ok(len)
}

/// The holder's reply to request `id` (of `l` bytes) as a chunk on its way: inline bytes read
/// into `slot`, or a get started into it. The holder's numbers are checked against the request
/// before any buffer is used. `wait`: how long the get may wait for a shared slot.
#[allow(clippy::too_many_arguments)]
fn arrival(
    worker: &Arc<DataPlane>,
    cfg: &PullConfig,
    conn: &mut Conn,
    peer: SocketAddr,
    (id, l): (u64, u32),
    mut slot: Slot,
    wait: Duration,
    t: Duration,
) -> Result<Arriving, TransportError> {
    let err = |what| move |e| stream_error(peer, e, what, t);
    match conn.frames.next(true).map_err(err("a staged chunk"))? {
        Some(Message::Data { id: i, len, crc32c })
            if i == id && len == l && (len <= cfg.eager_max || conn.ucx_peer.is_none()) =>
        {
            conn.frames
                .read_raw(slot.bytes_mut(len as usize))
                .map_err(err("an inline chunk"))?;
            Ok(Arriving {
                id,
                crc: crc32c,
                bytes: Bytes::Inline(slot),
            })
        }
        Some(Message::Staged {
            id: i,
            addr,
            len,
            crc32c,
            record,
            tag,
        }) if i == id && len == l && conn.ucx_peer.is_some() => {
            let ucx_peer = conn.ucx_peer.expect("checked above");
            // A chunk read ahead takes a shared slot only if one is free (see `pull_chunks`).
            let get = worker
                .get(ucx_peer, addr, slot, len as usize, wait)
                .map_err(|e| TransportError::Local(e.to_string()))?;
            Ok(Arriving {
                id,
                crc: crc32c,
                bytes: Bytes::Getting {
                    addr,
                    get,
                    record,
                    tag,
                },
            })
        }
        Some(Message::Error { message, .. }) => Err(TransportError::Remote { peer, message }),
        other => Err(TransportError::Protocol {
            peer,
            what: format!("expected Staged or Data {id}, got {other:?}"),
        }),
    }
}

/// The slot holding chunk bytes that arrived: inline ones as they are, a get's once it is done,
/// opened in our own slot (the shared copy may change under us), its release queued in
/// `outgoing` (sent now if `last`: no request follows to carry it). `(off, l)`: the chunk's.
fn landed(
    conn: &mut Conn,
    bytes: Bytes,
    outgoing: &mut Vec<u8>,
    last: bool,
    peer: SocketAddr,
    (off, l): (u64, u32),
    t: Duration,
) -> Result<Slot, TransportError> {
    let (addr, get, record, tag) = match bytes {
        Bytes::Inline(slot) => return Ok(slot),
        Bytes::Getting {
            addr,
            get,
            record,
            tag,
        } => (addr, get, record, tag),
    };
    let mut slot = finish_get(get, peer, t)?;
    outgoing.extend(conn.frames.encode(&Message::Release { addr }));
    if last {
        conn.send(outgoing)
            .map_err(|e| stream_error(peer, e, "a release to be sent", t))?;
    }
    if conn
        .frames
        .open_staged(slot.bytes_mut(l as usize), record, &tag)
        .is_err()
    {
        return Err(TransportError::Forged { peer, offset: off });
    }
    Ok(slot)
}

/// Waits for a get and takes its bytes into a slot of ours. On timeout the get is abandoned;
/// its shared slot returns to the pool when the data plane is done with it.
fn finish_get(get: Getting, peer: SocketAddr, t: Duration) -> Result<Slot, TransportError> {
    get.finish(t).map_err(|e| match e {
        Ok(source) => TransportError::Ucx { peer, source },
        Err(NoResult::TimedOut) => TransportError::Timeout {
            peer,
            what: "an RMA get",
            timeout: t,
        },
        Err(NoResult::Abandoned) => {
            TransportError::Local("the data-plane process went away during a get".into())
        }
    })
}
