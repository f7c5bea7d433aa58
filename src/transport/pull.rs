//! The pull protocol over the control channel (tokio TCP, [`wire`] frames) and the UCX data
//! plane. A holder stages each requested chunk from its [`ChunkStore`] into a registered slot
//! and answers with the slot's address and the chunk's crc32c; the puller RMA-gets it into a
//! slot of its own, verifies the checksum, hands the bytes to its sink and releases the remote
//! slot. Several requests are in flight per pull; every wait is bounded.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::ucx::{Slot, UcxError, Worker};
use super::wire::{self, Message, PROTOCOL_VERSION, WireError, WireVersion};

/// Where a holder reads chunks from (the NVMe cache in the daemon, a directory in tests).
pub trait ChunkStore: Send + Sync + 'static {
    /// Reads exactly `len` bytes of `path` at `offset` into `room[..len]`, failing if not at
    /// `version`. `room` is the whole slot: a store may write past `len` (direct reads round
    /// up to whole disk blocks). Returns the bytes' crc32c if the store knows it (a cache
    /// chunk's stored checksum: no second pass over the bytes, and bytes corrupted on disk
    /// since they were checked fail at the puller instead of travelling with a matching crc).
    fn read_at(
        &self,
        path: &str,
        version: WireVersion,
        offset: u64,
        room: &mut [u8],
        len: usize,
    ) -> io::Result<Option<u32>>;
}

/// Serves the files under a directory (tests, benchmarks).
pub struct DirStore {
    pub root: PathBuf,
}

impl ChunkStore for DirStore {
    fn read_at(
        &self,
        path: &str,
        version: WireVersion,
        offset: u64,
        room: &mut [u8],
        len: usize,
    ) -> io::Result<Option<u32>> {
        use std::os::unix::fs::FileExt;
        if path.split('/').any(|c| c == "..") {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let f = std::fs::File::open(self.root.join(path))?;
        if WireVersion::from(crate::fs::version_of(&f.metadata()?)) != version {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        f.read_exact_at(&mut room[..len], offset)?;
        Ok(None)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PullError {
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
    #[error("peer {peer}: {message}")]
    Remote { peer: SocketAddr, message: String },
    #[error("peer {peer}: protocol violation: {what}")]
    Protocol { peer: SocketAddr, what: String },
    #[error("no free local slot within {0:?}")]
    NoSlot(Duration),
}

#[derive(Debug, Clone)]
pub struct PullConfig {
    pub node_id: u32,
    /// Bytes per request (at most the slot size on both sides).
    pub chunk: u32,
    /// Requests in flight per pull.
    pub window: usize,
    /// Bound on every wait (connect, each reply, each get).
    pub timeout: Duration,
}

async fn read_frame(s: &mut (impl AsyncReadExt + Unpin)) -> io::Result<Result<Message, WireError>> {
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

async fn write_frame(s: &mut (impl AsyncWriteExt + Unpin), m: &Message) -> io::Result<()> {
    s.write_all(&wire::encode(m)).await
}

fn hello(worker: &Worker, node_id: u32) -> Message {
    let info = worker.info();
    Message::Hello {
        protocol: PROTOCOL_VERSION,
        node_id,
        worker_address: info.worker_address,
        rkey: info.rkey,
    }
}

/// Test hook: a holder that corrupts staged chunks (after computing their checksum).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub corrupt: bool,
}

/// A future answering one RPC.
pub type RpcFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Message> + Send>>;

/// Answers the one-message RPCs (locator traffic) that share the control port with pulls.
pub trait RpcHandler: Send + Sync + 'static {
    fn handle(&self, msg: Message) -> RpcFuture;
}

/// Everything a control server needs.
#[derive(Clone)]
pub struct Server {
    pub worker: Arc<Worker>,
    pub store: Arc<dyn ChunkStore>,
    pub node_id: u32,
    pub faults: Faults,
    pub rpc: Option<Arc<dyn RpcHandler>>,
}

/// Accepts pullers (and RPCs) forever; each connection is served on its own task. A
/// connection that sends garbage is closed; the others are unaffected.
pub async fn serve(listener: TcpListener, server: Server) -> io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        tokio::spawn(async move {
            match serve_conn(stream, server).await {
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    tracing::debug!(%peer, "puller disconnected")
                }
                Err(e) => tracing::info!(%peer, error = %e, "closing puller connection"),
                Ok(()) => {}
            }
        });
    }
}

async fn serve_conn(mut s: TcpStream, server: Server) -> io::Result<()> {
    let Server {
        worker,
        store,
        node_id,
        faults,
        rpc,
    } = server;
    match (read_frame(&mut s).await?.map_err(bad_frame)?, rpc) {
        (Message::Hello { .. }, _) => {}
        (mut msg, Some(rpc)) => loop {
            let reply = rpc.handle(msg).await;
            write_frame(&mut s, &reply).await?;
            // The caller keeps the connection for its next RPC (or closes it: EOF).
            msg = read_frame(&mut s).await?.map_err(bad_frame)?;
        },
        (other, None) => return Err(io::Error::other(format!("expected Hello, got {other:?}"))),
    }
    write_frame(&mut s, &hello(&worker, node_id)).await?;
    let (mut rd, mut wr) = s.into_split();
    // Slots lent to this puller: returned when released, or all at once when it goes away.
    let lent: Arc<std::sync::Mutex<HashMap<u64, Slot>>> = Arc::default();
    // Requests are staged in order by one task while this one keeps reading, so a Release
    // is seen even while staging waits for a free slot.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, String, WireVersion, u64, u32)>(1024);
    let stager_lent = lent.clone();
    let stager = tokio::spawn(async move {
        while let Some((id, path, version, offset, len)) = rx.recv().await {
            let (slab, store) = (worker.slab().clone(), store.clone());
            let staged = tokio::task::spawn_blocking(move || {
                stage(&slab, &*store, &path, version, offset, len, faults)
            })
            .await
            .map_err(io::Error::other)?;
            let reply = match staged {
                Ok((slot, crc32c)) => {
                    let addr = slot.addr();
                    stager_lent
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(addr, slot);
                    Message::Staged {
                        id,
                        addr,
                        len,
                        crc32c,
                    }
                }
                Err(message) => Message::Error { id, message },
            };
            write_frame(&mut wr, &reply).await?;
        }
        io::Result::Ok(())
    });
    let result = loop {
        match read_frame(&mut rd).await.and_then(|r| r.map_err(bad_frame)) {
            Ok(Message::Request {
                id,
                path,
                version,
                offset,
                len,
            }) => {
                if tx.send((id, path, version, offset, len)).await.is_err() {
                    break Err(io::Error::other("stager stopped"));
                }
            }
            Ok(Message::Release { addr }) => {
                lent.lock().unwrap_or_else(|e| e.into_inner()).remove(&addr);
            }
            Ok(other) => break Err(io::Error::other(format!("unexpected {other:?}"))),
            Err(e) => break Err(e),
        }
    };
    stager.abort();
    result
}

fn bad_frame(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Reads one chunk into a free slot (waiting for one, bounded) and checksums it.
fn stage(
    slab: &Arc<super::ucx::Slab>,
    store: &dyn ChunkStore,
    path: &str,
    version: WireVersion,
    offset: u64,
    len: u32,
    faults: Faults,
) -> Result<(Slot, u32), String> {
    if len as usize > slab.slot_size() {
        return Err(format!("request of {len} bytes exceeds the slot size"));
    }
    let mut slot = slab
        .take(Duration::from_secs(30))
        .ok_or("holder has no free slot")?;
    let room = slot.bytes_mut(slab.slot_size());
    let known = store
        .read_at(path, version, offset, room, len as usize)
        .map_err(|e| format!("{path}: {e}"))?;
    let buf = &mut room[..len as usize];
    let crc = known.unwrap_or_else(|| crc32c::crc32c(buf));
    if faults.corrupt && !buf.is_empty() {
        buf[0] ^= 0xff;
    }
    Ok((slot, crc))
}

/// Idle connections per peer, kept between uses: connecting costs at least a TCP handshake.
/// A connection goes back only after a complete exchange, so the next user never reads a late
/// answer meant for another.
struct IdlePool<C> {
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
    fn take(&self, peer: SocketAddr) -> Option<C> {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&peer)
            .and_then(Vec::pop)
    }

    fn put(&self, peer: SocketAddr, conn: C) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(peer)
            .or_default()
            .push(conn);
    }
}

/// Sends one-message RPCs (locator traffic), keeping idle connections per peer between calls:
/// a lookup then costs one round trip instead of a TCP handshake and a round trip.
#[derive(Default)]
pub struct Rpcs {
    idle: IdlePool<TcpStream>,
}

impl Rpcs {
    /// Sends `msg` to `peer` and waits (bounded) for its reply.
    pub async fn call(
        &self,
        peer: SocketAddr,
        msg: &Message,
        timeout: Duration,
    ) -> Result<Message, PullError> {
        if let Some(s) = self.idle.take(peer) {
            // An idle connection may have died with a restarted peer (the request then never
            // arrived): one fresh try. Requests are idempotent, so a rare repeat is harmless.
            match self.call_on(s, peer, msg, timeout).await {
                Err(PullError::Io { .. }) => {}
                r => return r,
            }
        }
        let s = tokio::time::timeout(timeout, TcpStream::connect(peer))
            .await
            .map_err(|_| PullError::Timeout {
                peer,
                what: "connect",
                timeout,
            })?
            .map_err(|source| PullError::Io { peer, source })?;
        let _ = s.set_nodelay(true);
        self.call_on(s, peer, msg, timeout).await
    }

    /// One call on one connection, which goes back to the pool after a complete reply.
    async fn call_on(
        &self,
        mut s: TcpStream,
        peer: SocketAddr,
        msg: &Message,
        timeout: Duration,
    ) -> Result<Message, PullError> {
        let run = async {
            write_frame(&mut s, msg).await?;
            read_frame(&mut s).await
        };
        let reply = tokio::time::timeout(timeout, run)
            .await
            .map_err(|_| PullError::Timeout {
                peer,
                what: "an RPC reply",
                timeout,
            })?
            .map_err(|source| PullError::Io { peer, source })?
            .map_err(|source| PullError::Wire { peer, source })?;
        self.idle.put(peer, s);
        Ok(reply)
    }
}

/// A byte range of one version of a file.
#[derive(Debug, Clone)]
pub struct Want {
    pub path: String,
    pub version: WireVersion,
    pub offset: u64,
    pub len: u64,
}

/// Where pulled chunks go: `sink(offset, bytes, crc32c)`, straight from the registered slot
/// the chunk was pulled into, its checksum already checked.
pub type Sink<'a> = &'a mut (dyn FnMut(u64, &[u8], u32) -> io::Result<()> + Send);

/// Pulls from holders, keeping one idle connection (control stream + UCX endpoint) per holder
/// between pulls: connecting costs a TCP handshake, a hello and a UCX wireup.
pub struct Puller {
    pub worker: Arc<Worker>,
    pub cfg: PullConfig,
    idle: IdlePool<(TcpStream, super::ucx::PeerId)>,
}

impl Puller {
    pub fn new(worker: Arc<Worker>, cfg: PullConfig) -> Puller {
        Puller {
            worker,
            cfg,
            idle: IdlePool::default(),
        }
    }

    /// Pulls `want` from the holder at `peer`, handing each verified chunk to the sink.
    /// Returns the bytes pulled.
    pub async fn pull(
        &self,
        peer: SocketAddr,
        want: &Want,
        sink: Sink<'_>,
    ) -> Result<u64, PullError> {
        let pooled = self.idle.take(peer);
        let reused = pooled.is_some();
        let conn = match pooled {
            Some(c) => c,
            None => connect(&self.worker, &self.cfg, peer).await?,
        };
        match self.pull_on(peer, conn, want, sink).await {
            // An idle connection may have died with a restarted holder: one fresh try.
            Err(PullError::Io { .. } | PullError::Ucx { .. }) if reused => {
                let conn = connect(&self.worker, &self.cfg, peer).await?;
                self.pull_on(peer, conn, want, sink).await
            }
            r => r,
        }
    }

    /// One pull on one connection, which goes back to the pool if it worked.
    async fn pull_on(
        &self,
        peer: SocketAddr,
        (mut s, ucx_peer): (TcpStream, super::ucx::PeerId),
        want: &Want,
        sink: Sink<'_>,
    ) -> Result<u64, PullError> {
        let conn = Conn {
            peer,
            stream: &mut s,
            ucx_peer,
        };
        let r = pull_chunks(&self.worker, &self.cfg, conn, want, sink).await;
        match r {
            Ok(_) => self.idle.put(peer, (s, ucx_peer)),
            Err(_) => self.worker.disconnect(ucx_peer),
        }
        r
    }
}

/// Opens a control stream to a holder, exchanges hellos and creates the UCX endpoint.
async fn connect(
    worker: &Arc<Worker>,
    cfg: &PullConfig,
    peer: SocketAddr,
) -> Result<(TcpStream, super::ucx::PeerId), PullError> {
    let t = cfg.timeout;
    let timeout = |what| PullError::Timeout {
        peer,
        what,
        timeout: t,
    };
    let io_err = |source| PullError::Io { peer, source };
    let wire_err = |source| PullError::Wire { peer, source };
    let mut s = tokio::time::timeout(t, TcpStream::connect(peer))
        .await
        .map_err(|_| timeout("connect"))?
        .map_err(io_err)?;
    let _ = s.set_nodelay(true);
    write_frame(&mut s, &hello(worker, cfg.node_id))
        .await
        .map_err(io_err)?;
    let info = match tokio::time::timeout(t, read_frame(&mut s))
        .await
        .map_err(|_| timeout("hello"))?
        .map_err(io_err)?
        .map_err(wire_err)?
    {
        Message::Hello {
            worker_address,
            rkey,
            ..
        } => super::ucx::PeerInfo {
            worker_address,
            rkey,
        },
        other => {
            return Err(PullError::Protocol {
                peer,
                what: format!("expected Hello, got {other:?}"),
            });
        }
    };
    let w = worker.clone();
    let ucx_peer = tokio::task::spawn_blocking(move || w.connect(info, t))
        .await
        .expect("connect task")
        .map_err(|source| PullError::Ucx { peer, source })?;
    Ok((s, ucx_peer))
}

/// A holder connection: its control stream and its UCX endpoint.
struct Conn<'a> {
    peer: SocketAddr,
    stream: &'a mut TcpStream,
    ucx_peer: super::ucx::PeerId,
}

async fn pull_chunks(
    worker: &Arc<Worker>,
    cfg: &PullConfig,
    conn: Conn<'_>,
    want: &Want,
    sink: Sink<'_>,
) -> Result<u64, PullError> {
    let Conn {
        peer,
        stream: s,
        ucx_peer,
    } = conn;
    let (offset, len) = (want.offset, want.len);
    let t = cfg.timeout;
    let timeout = |what| PullError::Timeout {
        peer,
        what,
        timeout: t,
    };
    let io_err = |source| PullError::Io { peer, source };
    let chunk = u64::from(cfg.chunk.min(worker.slab().slot_size() as u32));
    let n = len.div_ceil(chunk);
    let at = |i: u64| (offset + i * chunk, chunk.min(len - i * chunk) as u32);
    let (mut sent, mut done) = (0u64, 0u64);
    while done < n {
        while sent < n && sent - done < cfg.window as u64 {
            let (off, l) = at(sent);
            let req = Message::Request {
                id: sent,
                path: want.path.clone(),
                version: want.version,
                offset: off,
                len: l,
            };
            write_frame(s, &req).await.map_err(io_err)?;
            sent += 1;
        }
        let reply = tokio::time::timeout(t, read_frame(s))
            .await
            .map_err(|_| timeout("a staged chunk"))?
            .map_err(io_err)?
            .map_err(|source| PullError::Wire { peer, source })?;
        let (id, addr, l, crc) = match reply {
            Message::Staged {
                id,
                addr,
                len,
                crc32c,
            } if id == done => (id, addr, len, crc32c),
            Message::Error { message, .. } => return Err(PullError::Remote { peer, message }),
            other => {
                return Err(PullError::Protocol {
                    peer,
                    what: format!("expected Staged {done}, got {other:?}"),
                });
            }
        };
        let slab = worker.slab().clone();
        let slot = match slab.take(Duration::ZERO) {
            Some(slot) => slot,
            None => tokio::task::spawn_blocking(move || slab.take(t))
                .await
                .expect("slot task")
                .ok_or(PullError::NoSlot(t))?,
        };
        let got = worker.get(ucx_peer, addr, slot, l as usize);
        // On timeout the receiver is dropped; the slot returns to the pool when UCX completes.
        let (slot, r) = tokio::time::timeout(t, got)
            .await
            .map_err(|_| timeout("an RMA get"))?
            .map_err(|_| PullError::Ucx {
                peer,
                source: UcxError {
                    op: "ucp_get_nbx",
                    status: -1,
                    message: "worker stopped".into(),
                },
            })?;
        r.map_err(|source| PullError::Ucx { peer, source })?;
        write_frame(s, &Message::Release { addr })
            .await
            .map_err(io_err)?;
        let bytes = slot.bytes(l as usize);
        let (off, _) = at(id);
        if crc32c::crc32c(bytes) != crc {
            return Err(PullError::Checksum { peer, offset: off });
        }
        sink(off, bytes, crc).map_err(io_err)?;
        done += 1;
    }
    Ok(len)
}
