//! The pull protocol over the control channel (TCP, [`wire`] frames: blocking on both ends of a
//! pull, tokio for the locator RPCs sharing the port) and the UCX data plane. A holder stages
//! each requested chunk from its [`ChunkStore`] into a registered slot and answers with the
//! slot's address and the chunk's crc32c; the puller RMA-gets it into a slot of its own,
//! verifies the checksum, hands the bytes to its sink and releases the remote slot. Several
//! requests are in flight per pull; every wait is bounded.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::auth::{AuthError, Secret};
use super::ucx::{NoResult, Slot, UcxError, Worker};
use super::wire::{self, Message, PROTOCOL_VERSION, WireError};
use crate::core::Version;
use crate::core::sync::lock;

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
        version: Version,
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
        version: Version,
        offset: u64,
        room: &mut [u8],
        len: usize,
    ) -> io::Result<Option<u32>> {
        use std::os::unix::fs::FileExt;
        if path.split('/').any(|c| c == "..") {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let f = std::fs::File::open(self.root.join(path))?;
        if crate::core::version_of(&f.metadata()?) != version {
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
    /// Background copies (`--replicate`): holders serve them at the lowest CPU priority.
    pub background: bool,
    /// The job secret every connection authenticates with (`None`: `--insecure`).
    pub secret: Option<Arc<Secret>>,
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

fn hello(worker: &Worker, node_id: u32, background: bool) -> Message {
    let info = worker.info();
    Message::Hello {
        protocol: PROTOCOL_VERSION,
        node_id,
        worker_address: info.worker_address,
        rkey: info.rkey,
        background,
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
    /// `peer`: the authenticated sender (`None` with `--insecure`).
    fn handle(&self, peer: Option<u32>, msg: Message) -> RpcFuture;
}

/// Everything a control server needs.
#[derive(Clone)]
pub struct Server {
    pub worker: Arc<Worker>,
    /// Serves background pullers (`--replicate`) with its own progress thread at the lowest
    /// CPU priority, so their gets wait behind the readers' (else `worker` serves them).
    pub background: Option<Arc<Worker>>,
    pub store: Arc<dyn ChunkStore>,
    pub node_id: u32,
    pub faults: Faults,
    pub rpc: Option<Arc<dyn RpcHandler>>,
    /// The job secret every connection must prove before anything else (`None`: `--insecure`).
    pub secret: Option<Arc<Secret>>,
    /// Open connections per authenticated peer (bounded).
    pub conns: PeerConns,
}

/// Connections one authenticated peer may hold open at once: a node keeps one per concurrent
/// pull or RPC (tens), so this only stops a peer that opens them without end.
const MAX_CONNS_PER_PEER: usize = 256;

/// Open connections per authenticated peer.
#[derive(Clone, Default)]
pub struct PeerConns(Arc<std::sync::Mutex<HashMap<u32, usize>>>);

/// One admitted connection; dropping it (the connection ends) frees its place.
struct Admitted {
    conns: PeerConns,
    peer: u32,
}

impl PeerConns {
    fn admit(&self, peer: u32) -> io::Result<Admitted> {
        let mut map = lock(&self.0);
        let n = map.entry(peer).or_default();
        if *n >= MAX_CONNS_PER_PEER {
            return Err(io::Error::other(format!(
                "node {peer} already has {MAX_CONNS_PER_PEER} connections open"
            )));
        }
        *n += 1;
        Ok(Admitted {
            conns: self.clone(),
            peer,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut map = lock(&self.conns.0);
        if let Some(n) = map.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.peer);
            }
        }
    }
}

/// Accepts pullers (and RPCs) forever; each connection is served on its own task. A
/// connection that sends garbage is closed; the others are unaffected.
pub async fn serve(listener: TcpListener, server: Server) -> io::Result<()> {
    loop {
        // Out of descriptors (or any other failed accept): back off and go on; the port stays
        // open, and the pending connection is accepted once descriptors come back.
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
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
        background: background_worker,
        store,
        node_id,
        faults,
        rpc,
        secret,
        conns,
    } = server;
    let peer_id = match &secret {
        Some(key) => Some(authenticate(&mut s, key, node_id).await?),
        None => None,
    };
    let admitted = peer_id.map(|p| conns.admit(p)).transpose()?;
    let background = match (read_frame(&mut s).await?.map_err(bad_frame)?, rpc) {
        // The authenticated peer is the only identity: a Hello claiming another is refused.
        (
            Message::Hello {
                node_id: claimed, ..
            },
            _,
        ) if peer_id.is_some_and(|p| p != claimed) => {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("authenticated as node {peer_id:?}, claimed node {claimed}"),
            ));
        }
        (Message::Hello { background, .. }, _) => background,
        (mut msg, Some(rpc)) => loop {
            let reply = rpc.handle(peer_id, msg).await;
            write_frame(&mut s, &reply).await?;
            // The caller keeps the connection for its next RPC (or closes it: EOF).
            msg = read_frame(&mut s).await?.map_err(bad_frame)?;
        },
        (other, None) => return Err(io::Error::other(format!("expected Hello, got {other:?}"))),
    };
    let worker = match background_worker {
        Some(w) if background => w,
        _ => worker,
    };
    write_frame(&mut s, &hello(&worker, node_id, background)).await?;
    // A puller's chunks are served by a thread of its own with blocking I/O: a chunk then
    // costs this node one wake-up for the request (and one for a disk read), where the
    // reactor, a task and the blocking pool cost seven context switches per chunk
    // (`scripts/bench_small_pull.sh`). Pullers keep few connections (one per concurrent pull).
    let s = s.into_std()?;
    s.set_nonblocking(false)?;
    let name = if background {
        "serve-copy"
    } else {
        "serve-pull"
    };
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // Held while the connection is served.
            let _admitted = admitted;
            if background {
                super::lower_thread_priority();
            }
            match serve_pulls(s, worker.slab(), &*store, faults) {
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
                Err(e) => tracing::info!(error = %e, "closing puller connection"),
                Ok(()) => {}
            }
        })?;
    Ok(())
}

/// How long a connection may take to authenticate before it is closed.
const AUTH_WAIT: Duration = Duration::from_secs(10);

fn auth_error(e: AuthError) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, e)
}

/// Runs the server's side of the handshake (see [`super::auth`]) on a fresh connection;
/// returns the peer's authenticated node id. Nothing is answered but the challenge until the
/// peer's proof checks out; a connection that fails is closed.
async fn authenticate(s: &mut TcpStream, key: &Secret, me: u32) -> io::Result<u32> {
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
fn authenticate_blocking(s: &mut FrameReader, key: &Secret, me: u32) -> io::Result<u32> {
    let (hello, handshake) = super::auth::client_hello(me)?;
    s.s.write_all(&wire::encode(&hello))?;
    let challenge = s.next(true)?.expect("a blocking read returns a frame");
    let (proof, server) = handshake.answer(key, challenge).map_err(auth_error)?;
    s.s.write_all(&wire::encode(&proof))?;
    Ok(server)
}

/// The client's side of the handshake on a fresh async connection.
async fn authenticate_async(s: &mut TcpStream, key: &Secret, me: u32) -> io::Result<u32> {
    let (hello, handshake) = super::auth::client_hello(me)?;
    write_frame(s, &hello).await?;
    let challenge = read_frame(s).await?.map_err(bad_frame)?;
    let (proof, server) = handshake.answer(key, challenge).map_err(auth_error)?;
    write_frame(s, &proof).await?;
    Ok(server)
}

/// A request waiting for its chunk to be staged.
struct Request {
    id: u64,
    path: String,
    version: Version,
    offset: u64,
    len: u32,
}

/// How long a request waiting for a free slot waits before looking for releases again.
const SLOT_POLL: Duration = Duration::from_millis(10);
/// How long a request waits for a free slot in all.
const SLOT_WAIT: Duration = Duration::from_secs(30);
/// Slots one puller connection may hold at once (a puller keeps 4 requests in flight).
const FAIR_SHARE: usize = 8;
/// How long a lent slot stays lent without a release.
const LEASE: Duration = Duration::from_secs(10);
/// Requests one connection may queue while waiting for slots.
const MAX_QUEUED: usize = 64;

/// Serves one puller's requests in order until it disconnects. Slots lent to it return when it
/// releases them, or all at once when it goes away. While a request waits for a free slot, the
/// frames the puller sent meanwhile are read, so its releases free slots.
fn serve_pulls(
    s: std::net::TcpStream,
    slab: &Arc<super::ucx::Slab>,
    store: &dyn ChunkStore,
    faults: Faults,
) -> io::Result<()> {
    s.set_write_timeout(Some(SLOT_WAIT))?;
    let mut frames = FrameReader::new(s.try_clone()?);
    let mut out = s;
    let mut lent: HashMap<u64, (Slot, std::time::Instant)> = HashMap::new();
    let mut queued: VecDeque<Request> = VecDeque::new();
    loop {
        let Some(r) = queued.pop_front() else {
            let msg = frames.next(true)?.expect("a blocking read returns a frame");
            note(msg, &mut lent, &mut queued)?;
            continue;
        };
        // Slots lent longer than a lease are taken back (a puller that neither gets nor
        // releases them is gone or hostile; a late get of reused memory fails its checksum).
        lent.retain(|_, (_, at)| at.elapsed() < LEASE);
        if let Err(why) = crate::core::paths::cache_key(&r.path) {
            let reply = Message::Error {
                id: r.id,
                message: format!("refused {:?}: {why}", r.path),
            };
            out.write_all(&wire::encode(&reply))?;
            continue;
        }
        if lent.len() >= FAIR_SHARE {
            // A fair share each: one connection cannot take every slot from the others.
            let reply = Message::Error {
                id: r.id,
                message: format!("more than {FAIR_SHARE} chunks staged and not released"),
            };
            out.write_all(&wire::encode(&reply))?;
            continue;
        }
        let waited = std::time::Instant::now();
        let slot = loop {
            if let Some(slot) = slab.take(SLOT_POLL) {
                break Some(slot);
            }
            while let Some(msg) = frames.next(false)? {
                note(msg, &mut lent, &mut queued)?;
            }
            if waited.elapsed() >= SLOT_WAIT {
                break None;
            }
        };
        let staged = match slot {
            Some(slot) => stage(slot, store, &r.path, r.version, r.offset, r.len, faults),
            None => Err("holder has no free slot".to_string()),
        };
        let reply = match staged {
            Ok((slot, crc32c)) => {
                let addr = slot.addr();
                lent.insert(addr, (slot, std::time::Instant::now()));
                Message::Staged {
                    id: r.id,
                    addr,
                    len: r.len,
                    crc32c,
                }
            }
            Err(message) => Message::Error { id: r.id, message },
        };
        out.write_all(&wire::encode(&reply))?;
    }
}

/// Takes in a frame from a puller: a request joins the queue, a release returns its slot.
fn note(
    msg: Message,
    lent: &mut HashMap<u64, (Slot, std::time::Instant)>,
    queued: &mut VecDeque<Request>,
) -> io::Result<()> {
    match msg {
        // A puller keeps a few requests in flight; one that queues many more is not one.
        Message::Request { .. } if queued.len() >= MAX_QUEUED => {
            return Err(io::Error::other("too many requests queued"));
        }
        Message::Request {
            id,
            path,
            version,
            offset,
            len,
        } => queued.push_back(Request {
            id,
            path,
            version,
            offset,
            len,
        }),
        Message::Release { addr } => {
            lent.remove(&addr);
        }
        other => return Err(io::Error::other(format!("unexpected {other:?}"))),
    }
    Ok(())
}

/// Reads frames from a blocking socket, keeping what arrived beyond the current frame.
struct FrameReader {
    s: std::net::TcpStream,
    buf: Vec<u8>,
}

impl FrameReader {
    fn new(s: std::net::TcpStream) -> Self {
        FrameReader { s, buf: Vec::new() }
    }

    /// The next frame. `wait`: block for it (within the socket's read timeout: then an error of
    /// kind `WouldBlock` or `TimedOut`); otherwise `Ok(None)` if none has arrived whole.
    fn next(&mut self, wait: bool) -> io::Result<Option<Message>> {
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

fn bad_frame(e: WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Reads one chunk into `slot` and checksums it (unless the store knows its checksum).
fn stage(
    mut slot: Slot,
    store: &dyn ChunkStore,
    path: &str,
    version: Version,
    offset: u64,
    len: u32,
    faults: Faults,
) -> Result<(Slot, u32), String> {
    let size = slot.capacity();
    if len as usize > size {
        return Err(format!("request of {len} bytes exceeds the slot size"));
    }
    // Numbers from the wire: the range must lie within the file (and not overflow).
    if offset
        .checked_add(u64::from(len))
        .is_none_or(|end| end > version.size)
    {
        return Err(format!(
            "bytes {offset}+{len} are outside a file of {} bytes",
            version.size
        ));
    }
    let room = slot.bytes_mut(size);
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
        lock(&self.idle).get_mut(&peer).and_then(Vec::pop)
    }

    fn put(&self, peer: SocketAddr, conn: C) {
        lock(&self.idle).entry(peer).or_default().push(conn);
    }
}

/// Sends one-message RPCs (locator traffic), keeping idle connections per peer between calls:
/// a lookup then costs one round trip instead of a TCP handshake and a round trip.
/// What a blocking RPC waits for, in its timeout errors.
const RPC_REPLY: &str = "an RPC reply";

#[derive(Default)]
pub struct Rpcs {
    idle: IdlePool<TcpStream>,
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
        let mut s = tokio::time::timeout(timeout, TcpStream::connect(peer))
            .await
            .map_err(|_| PullError::Timeout {
                peer,
                what: "connect",
                timeout,
            })?
            .map_err(|source| PullError::Io { peer, source })?;
        let _ = s.set_nodelay(true);
        if let Some((me, key)) = &self.auth {
            tokio::time::timeout(timeout, authenticate_async(&mut s, key, *me))
                .await
                .map_err(|_| PullError::Timeout {
                    peer,
                    what: "authentication",
                    timeout,
                })?
                .map_err(|e| refused(peer, e))?;
        }
        self.call_on(s, peer, msg, timeout).await
    }

    /// As [`Rpcs::call`], with blocking I/O on the calling thread (a FUSE request's): the
    /// reply wakes that thread directly, not a reactor thread that then wakes it.
    pub fn call_blocking(
        &self,
        peer: SocketAddr,
        msg: &Message,
        timeout: Duration,
    ) -> Result<Message, PullError> {
        if let Some(s) = self.idle_blocking.take(peer) {
            // As in `call`: one fresh try after a dead idle connection.
            match self.call_blocking_on(s, peer, msg, timeout) {
                Err(PullError::Io { .. }) => {}
                r => return r,
            }
        }
        let s = std::net::TcpStream::connect_timeout(&peer, timeout)
            .map_err(|e| stream_error(peer, e, "connect", timeout))?;
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(timeout))
            .and_then(|()| s.set_write_timeout(Some(timeout)))
            .map_err(|e| stream_error(peer, e, RPC_REPLY, timeout))?;
        let mut s = FrameReader::new(s);
        if let Some((me, key)) = &self.auth {
            authenticate_blocking(&mut s, key, *me).map_err(|e| refused(peer, e))?;
        }
        self.call_blocking_on(s, peer, msg, timeout)
    }

    fn call_blocking_on(
        &self,
        mut s: FrameReader,
        peer: SocketAddr,
        msg: &Message,
        timeout: Duration,
    ) -> Result<Message, PullError> {
        let err = |e| stream_error(peer, e, RPC_REPLY, timeout);
        s.s.write_all(&wire::encode(msg)).map_err(err)?;
        let reply = s
            .next(true)
            .map_err(|e| match e.kind() {
                io::ErrorKind::InvalidData => PullError::Protocol {
                    peer,
                    what: e.to_string(),
                },
                _ => err(e),
            })?
            .expect("a blocking read returns a frame");
        self.idle_blocking.put(peer, s);
        Ok(reply)
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
    pub version: Version,
    pub offset: u64,
    pub len: u64,
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
    pub worker: Arc<Worker>,
    pub cfg: PullConfig,
    idle: IdlePool<Conn>,
}

/// A holder connection: its control stream and its UCX endpoint.
struct Conn {
    frames: FrameReader,
    ucx_peer: super::ucx::PeerId,
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
    pub fn new(worker: Arc<Worker>, cfg: PullConfig) -> Puller {
        Puller {
            worker,
            cfg,
            idle: IdlePool::default(),
        }
    }

    /// Pulls `want` from the holder at `peer`, handing each verified chunk to the sink.
    /// Returns the bytes pulled.
    pub fn pull(&self, peer: SocketAddr, want: &Want, sink: Sink<'_>) -> Result<u64, PullError> {
        let pooled = self.idle.take(peer);
        let reused = pooled.is_some();
        let conn = match pooled {
            Some(c) => c,
            None => connect(&self.worker, &self.cfg, peer)?,
        };
        match self.pull_on(peer, conn, want, sink) {
            // An idle connection may have died with a restarted holder: one fresh try.
            Err(PullError::Io { .. } | PullError::Ucx { .. }) if reused => {
                let conn = connect(&self.worker, &self.cfg, peer)?;
                self.pull_on(peer, conn, want, sink)
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
    ) -> Result<u64, PullError> {
        let r = pull_chunks(&self.worker, &self.cfg, peer, &mut conn, want, sink);
        match r {
            Ok(_) => self.idle.put(peer, conn),
            Err(_) => self.worker.disconnect(conn.ucx_peer),
        }
        r
    }
}

/// Maps a failed read or write on a control stream to the error a pull reports: a read
/// timeout (`what` did not arrive in time) or an I/O error.
fn stream_error(peer: SocketAddr, e: io::Error, what: &'static str, t: Duration) -> PullError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => PullError::Timeout {
            peer,
            what,
            timeout: t,
        },
        _ => PullError::Io { peer, source: e },
    }
}

/// A failed handshake: the peer lacks the key (or is not a dyadfs node).
fn refused(peer: SocketAddr, e: io::Error) -> PullError {
    match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidData => PullError::Protocol {
            peer,
            what: format!("authentication failed: {e}"),
        },
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => PullError::Timeout {
            peer,
            what: "authentication",
            timeout: AUTH_WAIT,
        },
        _ => PullError::Io { peer, source: e },
    }
}

/// Opens a control stream to a holder, exchanges hellos and creates the UCX endpoint.
fn connect(worker: &Arc<Worker>, cfg: &PullConfig, peer: SocketAddr) -> Result<Conn, PullError> {
    let t = cfg.timeout;
    let err = |what| move |e| stream_error(peer, e, what, t);
    let s = std::net::TcpStream::connect_timeout(&peer, t).map_err(err("connect"))?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(t)).map_err(err("connect"))?;
    s.set_write_timeout(Some(t)).map_err(err("connect"))?;
    let mut frames = FrameReader::new(s);
    // The holder's rkey is sent only to a peer that proved the key, and sent to a holder only
    // after it proved it too.
    if let Some(key) = &cfg.secret {
        authenticate_blocking(&mut frames, key, cfg.node_id).map_err(|e| refused(peer, e))?;
    }
    frames
        .s
        .write_all(&wire::encode(&hello(worker, cfg.node_id, cfg.background)))
        .map_err(err("hello"))?;
    let info = match frames.next(true).map_err(err("hello"))? {
        Some(Message::Hello {
            worker_address,
            rkey,
            ..
        }) => super::ucx::PeerInfo {
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
    let ucx_peer = worker
        .connect(info, t)
        .map_err(|source| PullError::Ucx { peer, source })?;
    Ok(Conn { frames, ucx_peer })
}

fn pull_chunks(
    worker: &Arc<Worker>,
    cfg: &PullConfig,
    peer: SocketAddr,
    conn: &mut Conn,
    want: &Want,
    sink: Sink<'_>,
) -> Result<u64, PullError> {
    let (offset, len) = (want.offset, want.len);
    let t = cfg.timeout;
    let err = |what| move |e| stream_error(peer, e, what, t);
    let chunk = u64::from(cfg.chunk.min(worker.slab().slot_size() as u32));
    let n = len.div_ceil(chunk);
    let at = |i: u64| (offset + i * chunk, chunk.min(len - i * chunk) as u32);
    let (mut sent, mut done) = (0u64, 0u64);
    // Frames to send, written together: a release rides with the next requests.
    let mut outgoing: Vec<u8> = Vec::new();
    while done < n {
        while sent < n && sent - done < cfg.window as u64 {
            let (off, l) = at(sent);
            outgoing.extend(wire::encode(&Message::Request {
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
        let reply = conn.frames.next(true).map_err(err("a staged chunk"))?;
        let (id, addr, l, crc) = match reply {
            Some(Message::Staged {
                id,
                addr,
                len,
                crc32c,
                // The holder's numbers are checked against the request before any buffer is used.
            }) if id == done && len == at(done).1 => (id, addr, len, crc32c),
            Some(Message::Error { message, .. }) => {
                return Err(PullError::Remote { peer, message });
            }
            other => {
                return Err(PullError::Protocol {
                    peer,
                    what: format!("expected Staged {done}, got {other:?}"),
                });
            }
        };
        let slot = worker.slab().take(t).ok_or(PullError::NoSlot(t))?;
        // On timeout the receiver is dropped; the slot returns to the pool when UCX completes.
        let (slot, r) = worker
            .get(conn.ucx_peer, addr, slot, l as usize)
            .wait(t)
            .map_err(|e| match e {
                NoResult::TimedOut => PullError::Timeout {
                    peer,
                    what: "an RMA get",
                    timeout: t,
                },
                NoResult::Abandoned => PullError::Ucx {
                    peer,
                    source: UcxError::gone("ucp_get_nbx"),
                },
            })?;
        r.map_err(|source| PullError::Ucx { peer, source })?;
        outgoing.extend(wire::encode(&Message::Release { addr }));
        if sent == n {
            // No request follows to carry it.
            conn.send(&mut outgoing)
                .map_err(err("a release to be sent"))?;
        }
        let bytes = slot.bytes(l as usize);
        let (off, _) = at(id);
        if crc32c::crc32c(bytes) != crc {
            return Err(PullError::Checksum { peer, offset: off });
        }
        sink(off, bytes, crc).map_err(|source| PullError::Io { peer, source })?;
        done += 1;
    }
    Ok(len)
}

#[cfg(test)]
mod conn_tests {
    use super::*;

    #[test]
    fn a_peer_holds_a_bounded_number_of_connections() {
        let conns = PeerConns::default();
        let mut held: Vec<Admitted> = (0..MAX_CONNS_PER_PEER)
            .map(|_| conns.admit(7).unwrap())
            .collect();
        assert!(conns.admit(7).is_err());
        // Another peer is not affected; a closed connection frees a place.
        let other = conns.admit(8).unwrap();
        held.pop();
        assert!(conns.admit(7).is_ok());
        drop((held, other));
        assert!(conns.0.lock().unwrap().is_empty());
    }
}
