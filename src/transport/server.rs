//! The holder's side of the control port: each connection authenticates, then either asks
//! one-message RPCs (handed to the [`RpcHandler`], the locator) or says hello and pulls. A
//! puller's requests are staged from the [`ChunkStore`] into registered slots, fairly (a share
//! of slots per connection, leases, a bounded queue) and answered with the slot's address, the
//! chunk's crc32c, and the number and tag of the seal the staged copy is under.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use super::auth::Secret;
use super::handshake::{authenticate, hello, ucx_info};
use super::pending::Pending;
use super::plane::{DataPlane, Lent};
pub use super::serving::Serving;
use super::serving::{Conn, Step, Turn};
use super::session::{Opener, Sealer};
use super::stream::{AsyncConn, FrameReader, bad_frame, write_all_parts};
use super::ucx::Slot;
use super::wire::Message;
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

/// Test hook: a holder that corrupts staged chunks (after computing their checksum).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub corrupt: bool,
}

/// A future answering one RPC.
/// An error closes the connection (the payload was not one the handler accepts).
pub type RpcFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<Vec<u8>>> + Send>>;

/// Answers the one-message RPCs (locator traffic) that share the control port with pulls.
pub trait RpcHandler: Send + Sync + 'static {
    /// Answers one request payload with a reply payload. `peer`: the authenticated sender
    /// (`None` with `--insecure`).
    fn handle(&self, peer: Option<u32>, payload: Vec<u8>) -> RpcFuture;
}

/// Everything a control server needs.
#[derive(Clone)]
pub struct Server {
    pub worker: Arc<DataPlane>,
    /// Serves background pullers (`--replicate`) with its own progress thread at the lowest
    /// CPU priority, so their gets wait behind the readers' (else `worker` serves them).
    pub background: Option<Arc<DataPlane>>,
    pub store: Arc<dyn ChunkStore>,
    pub node_id: u32,
    pub faults: Faults,
    pub rpc: Option<Arc<dyn RpcHandler>>,
    /// The job secret every connection must prove before anything else (`None`: `--insecure`).
    pub secret: Option<Arc<Secret>>,
    /// Open connections per authenticated peer (bounded).
    pub conns: PeerConns,
    /// Connections still in their handshake (bounded).
    pub pending: Pending,
    /// The node ids of the job: an authenticated peer claiming another is refused (empty:
    /// any, as the `transport` tool's insecure pullers).
    pub members: Arc<std::collections::HashSet<u32>>,
    /// The bounded threads that serve pull connections.
    pub serving: Serving,
}

/// Why the server closed a connection (logged with the peer's address).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("node {0} already has {MAX_CONNS_PER_PEER} connections open")]
    TooManyConnections(u32),
    #[error("node {0} is not a member of the job")]
    NotAMember(u32),
    #[error("more than {MAX_QUEUED} requests queued")]
    TooManyQueued,
    #[error("expected {expected}, got {got:?}")]
    Unexpected {
        expected: &'static str,
        got: Box<Message>,
    },
}

impl ServerError {
    fn unexpected(expected: &'static str, got: Message) -> io::Error {
        ServerError::Unexpected {
            expected,
            got: Box::new(got),
        }
        .into()
    }
}

impl From<ServerError> for io::Error {
    fn from(e: ServerError) -> io::Error {
        let kind = match e {
            ServerError::TooManyConnections(_) | ServerError::TooManyQueued => {
                io::ErrorKind::QuotaExceeded
            }
            ServerError::NotAMember(_) => io::ErrorKind::PermissionDenied,
            ServerError::Unexpected { .. } => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e)
    }
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
            return Err(ServerError::TooManyConnections(peer).into());
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
    server.serving.attach(tokio::runtime::Handle::current());
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

/// The handshake of a fresh connection, within the bound on pending ones: the authenticated
/// peer and the sealed connection (`None` and a plain one with `--insecure`).
async fn admit(s: TcpStream, server: &Server) -> io::Result<(Option<u32>, AsyncConn)> {
    let Some(key) = &server.secret else {
        return Ok((None, AsyncConn::new(s, (Sealer::plain(), Opener::plain()))));
    };
    let source = s.peer_addr()?.ip();
    let ticket = server.pending.admit(source);
    tokio::select! {
        r = authenticate(s, key, server.node_id) => r.map(|(peer, conn)| (Some(peer), conn)),
        () = ticket.evicted.notified() => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "closed in its handshake to make room for newer connections",
        )),
    }
}

async fn serve_conn(s: TcpStream, server: Server) -> io::Result<()> {
    let (peer_id, mut s) = admit(s, &server).await?;
    let Server {
        worker,
        background: background_worker,
        store,
        node_id,
        faults,
        rpc,
        conns,
        members,
        serving,
        ..
    } = server;
    // An id outside the membership would also escape the per-peer bound on connections.
    if let Some(p) = peer_id
        && !members.is_empty()
        && !members.contains(&p)
    {
        return Err(ServerError::NotAMember(p).into());
    }
    let admitted = peer_id.map(|p| conns.admit(p)).transpose()?;
    let (background, eager_max, their_ucx) = match (s.read().await?.map_err(bad_frame)?, rpc) {
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
        (
            Message::Hello {
                background,
                eager_max,
                worker_address,
                rkey,
                ..
            },
            _,
        ) => {
            let theirs = ucx_info(worker_address, rkey)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            (background, eager_max, theirs.is_some())
        }
        (Message::Rpc(mut payload), Some(rpc)) => loop {
            let reply = rpc.handle(peer_id, payload).await?;
            s.write(&Message::Rpc(reply)).await?;
            // The caller keeps the connection for its next RPC (or closes it: EOF).
            payload = match s.read().await?.map_err(bad_frame)? {
                Message::Rpc(p) => p,
                other => return Err(ServerError::unexpected("Rpc", other)),
            };
        },
        (other, _) => return Err(ServerError::unexpected("Hello", other)),
    };
    let worker = match background_worker {
        Some(w) if background => w,
        _ => worker,
    };
    // Without a UCX data plane on either side, every chunk travels inline on this sealed
    // stream.
    let mine = worker.info();
    let eager_max = if their_ucx && mine.is_some() {
        eager_max
    } else {
        u32::MAX
    };
    s.write(&hello(mine, node_id, background, 0)).await?;
    // A puller's chunks are served by a thread of a bounded pool with blocking I/O: a chunk
    // then costs this node one wake-up for the request (and one for a disk read), where the
    // reactor, a task and the blocking pool cost seven context switches per chunk
    // (`scripts/bench_small_pull.sh`). Until its first request it waits here, on no thread.
    s.s.readable().await?;
    let frames = s.into_blocking()?;
    frames.s.set_write_timeout(Some(SLOT_WAIT))?;
    let conn = PullConn {
        frames,
        worker,
        store,
        faults,
        eager_max,
        lent: HashMap::new(),
        queued: VecDeque::new(),
        _admitted: admitted,
    };
    let pool = if background {
        &serving.copies
    } else {
        &serving.pulls
    };
    pool.submit(Box::new(conn));
    Ok(())
}

/// Shared slots lent to one puller, by the address it gets from, with when they were lent.
type LentSlots = HashMap<u64, (Lent, std::time::Instant)>;

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

/// One puller's connection and what it holds. Its requests are served in order until it
/// disconnects. Slots lent to it return when it releases them, when their lease ends, or all
/// at once when it goes away. While a request waits for a free slot, the frames the puller sent
/// meanwhile are read, so its releases free slots. A chunk of at most `eager_max` bytes is sent
/// inline after its `Data` frame, and its slot is free again at once.
struct PullConn {
    frames: FrameReader,
    worker: Arc<DataPlane>,
    store: Arc<dyn ChunkStore>,
    faults: Faults,
    eager_max: u32,
    lent: LentSlots,
    queued: VecDeque<Request>,
    /// Held while the connection is open.
    _admitted: Option<Admitted>,
}

impl Conn for PullConn {
    fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.frames.s.as_raw_fd()
    }

    fn serve(&mut self, turn: &Turn) -> io::Result<Step> {
        let PullConn {
            frames,
            worker,
            store,
            faults,
            eager_max,
            lent,
            queued,
            ..
        } = self;
        let (store, faults, eager_max) = (&**store, *faults, *eager_max);
        let slab = worker.slab();
        // A request was answered since this turn began.
        let mut answered = false;
        loop {
            if turn.over() {
                return Ok(Step::Yield);
            }
            let Some(r) = queued.pop_front() else {
                // Answered, with nothing more buffered: the puller's next request has most
                // likely not come yet (a small-file pull asks once), so the connection goes
                // idle without a read, which returned EAGAIN after nearly every request; the
                // thread's poll tells when the next one comes. Not while other connections
                // wait for a thread: an idle connection with a request pending would be parked
                // on the reactor and handed straight back.
                if answered && !frames.has_buffered() && !turn.others_wait() {
                    return Ok(Step::Idle);
                }
                match frames.next(false)? {
                    Some(msg) => note(msg, lent, queued)?,
                    None => return Ok(Step::Idle),
                }
                continue;
            };
            answered = true;
            // Slots lent longer than a lease are taken back (a puller that neither gets nor
            // releases them is gone or hostile; a late get of reused memory fails its checksum).
            lent.retain(|_, (_, at)| at.elapsed() < LEASE);
            if let Err(why) = crate::core::paths::cache_key(&r.path) {
                let reply = Message::Error {
                    id: r.id,
                    message: format!("refused {:?}: {why}", r.path),
                };
                frames.send(&reply)?;
                continue;
            }
            if lent.len() >= FAIR_SHARE {
                // A fair share each: one connection cannot take every slot from the others.
                let reply = Message::Error {
                    id: r.id,
                    message: format!("more than {FAIR_SHARE} chunks staged and not released"),
                };
                frames.send(&reply)?;
                continue;
            }
            let slot = wait_slot(|t| slab.take(t), frames, lent, queued)?;
            let staged = match slot {
                Some(slot) => stage(slot, store, &r.path, r.version, r.offset, r.len, faults),
                None => Err("holder has no free slot".to_string()),
            };
            let reply = match staged {
                Ok((mut slot, crc32c)) if r.len <= eager_max => {
                    let head = frames.encode(&Message::Data {
                        id: r.id,
                        len: r.len,
                        crc32c,
                    });
                    let body = slot.bytes_mut(r.len as usize);
                    let tag = frames.seal_record(body);
                    write_all_parts(
                        &mut &frames.s,
                        &mut [
                            io::IoSlice::new(&head),
                            io::IoSlice::new(body),
                            io::IoSlice::new(&tag),
                        ],
                    )?;
                    continue;
                }
                // Sealed in our own slot, then copied into the shared slab for the puller's get:
                // anyone who reaches the data-plane process over UCX may read and write the
                // shared copy, so it is ciphertext, and the number and tag that open it travel
                // in the sealed frame (a changed, swapped or replayed copy fails at the puller).
                Ok((mut slot, crc32c)) if worker.has_ucx() => {
                    let lend = |t| worker.take_lendable(t);
                    match wait_slot(lend, frames, lent, queued)? {
                        Some(mut shared) => {
                            let (record, tag) = frames.seal_staged(slot.bytes_mut(r.len as usize));
                            let addr = worker.lend(&slot, r.len as usize, &mut shared);
                            lent.insert(addr, (shared, std::time::Instant::now()));
                            Message::Staged {
                                id: r.id,
                                addr,
                                len: r.len,
                                crc32c,
                                record,
                                tag,
                            }
                        }
                        None => Message::Error {
                            id: r.id,
                            message: "holder has no free shared slot".into(),
                        },
                    }
                }
                Ok(_) => Message::Error {
                    id: r.id,
                    message: "holder has no UCX data plane to stage in".into(),
                },
                Err(message) => Message::Error { id: r.id, message },
            };
            frames.send(&reply)?;
        }
    }

    fn expire(&mut self) -> Option<std::time::Instant> {
        self.lent.retain(|_, (_, at)| at.elapsed() < LEASE);
        self.lent.values().map(|(_, at)| *at + LEASE).min()
    }

    fn ended(&self, e: io::Error) {
        if e.kind() != io::ErrorKind::UnexpectedEof {
            tracing::info!(error = %e, "closing puller connection");
        }
    }
}

/// Takes a free slot with `take`, reading the puller's frames while waiting (its releases free
/// slots); `None` after [`SLOT_WAIT`].
fn wait_slot<T>(
    mut take: impl FnMut(Duration) -> Option<T>,
    frames: &mut FrameReader,
    lent: &mut LentSlots,
    queued: &mut VecDeque<Request>,
) -> io::Result<Option<T>> {
    let waited = std::time::Instant::now();
    loop {
        if let Some(slot) = take(SLOT_POLL) {
            return Ok(Some(slot));
        }
        while let Some(msg) = frames.next(false)? {
            note(msg, lent, queued)?;
        }
        if waited.elapsed() >= SLOT_WAIT {
            return Ok(None);
        }
    }
}

/// Takes in a frame from a puller: a request joins the queue, a release returns its slot.
fn note(msg: Message, lent: &mut LentSlots, queued: &mut VecDeque<Request>) -> io::Result<()> {
    match msg {
        // A puller keeps a few requests in flight; one that queues many more is not one.
        Message::Request { .. } if queued.len() >= MAX_QUEUED => {
            return Err(ServerError::TooManyQueued.into());
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
        other => return Err(ServerError::unexpected("Request or Release", other)),
    }
    Ok(())
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
