//! The one folder that knows UCX. The worker runs in a data-plane process of its own, never in
//! the daemon ([`child`]: on tcp, UCX's software RMA reads and writes any address of the
//! process it runs in). A [`Worker`] owns a UCP context and worker on its own
//! progress thread (UCX's single-thread mode): every UCX call happens there, other threads send
//! commands and are answered over channels (a get, through a [`Completion`]). The thread sleeps
//! on the worker's event fd (`ucp_worker_arm` + `poll`) and is woken by `ucp_worker_signal` when
//! a command arrives, so it never spins when idle.
//!
//! Memory: one slab is mapped and registered once (`ucp_mem_map`) and split into slots; its
//! rkey is packed once. Remote rkeys are unpacked once per peer. A slot lent to an RMA get
//! travels with the request and returns to the pool only when UCX completes the request
//! (successfully, with an error, or cancelled), so UCX never writes into memory handed to
//! someone else.

pub mod child;
mod completion;
pub mod process;
mod slab;

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use completion::completion;
pub use completion::{Completer, Completion, NoResult};
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
pub use slab::{Slab, Slot};
use ucx_sys as sys;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("UCX {op}: {message} (status {status})")]
pub struct UcxError {
    pub op: &'static str,
    pub status: i8,
    pub message: String,
}

impl UcxError {
    fn new(op: &'static str, status: sys::ucs_status_t) -> UcxError {
        // SAFETY: ucs_status_string returns a static NUL-terminated string for any status.
        let message = unsafe { std::ffi::CStr::from_ptr(sys::ucs_status_string(status)) }
            .to_string_lossy()
            .into_owned();
        UcxError {
            op,
            status,
            message,
        }
    }

    pub(crate) fn io(op: &'static str, e: std::io::Error) -> UcxError {
        UcxError {
            op,
            status: sys::UCS_ERR_IO_ERROR,
            message: e.to_string(),
        }
    }

    pub(crate) fn gone(op: &'static str) -> UcxError {
        UcxError {
            op,
            status: sys::UCS_ERR_CANCELED,
            message: "the UCX worker thread has stopped".into(),
        }
    }
}

fn check(op: &'static str, status: sys::ucs_status_t) -> Result<(), UcxError> {
    if status == sys::UCS_OK as sys::ucs_status_t {
        Ok(())
    } else {
        Err(UcxError::new(op, status))
    }
}

/// A connected peer, as known to this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerId(u64);

/// What a peer tells us so we can read its memory: its worker address and its slab's rkey.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub worker_address: Vec<u8>,
    pub rkey: Vec<u8>,
}

/// Zero bytes after each blob UCX unpacks: `ucp_ep_create` and `ucp_ep_rkey_unpack` take no
/// length, so a malformed blob that runs past its end reads these, never past the allocation.
const UNPACK_PADDING: usize = 4 << 10;

impl PeerInfo {
    /// A peer's blobs (already bounded in length by the hello's check), copied with
    /// [`UNPACK_PADDING`] zero bytes after each for UCX to unpack.
    pub fn padded(mut worker_address: Vec<u8>, mut rkey: Vec<u8>) -> PeerInfo {
        worker_address.resize(worker_address.len() + UNPACK_PADDING, 0);
        rkey.resize(rkey.len() + UNPACK_PADDING, 0);
        PeerInfo {
            worker_address,
            rkey,
        }
    }
}

enum Cmd {
    Connect(PeerInfo, Sender<Result<PeerId, UcxError>>),
    Disconnect(PeerId),
    Get {
        peer: PeerId,
        remote_addr: u64,
        slot: Slot,
        len: usize,
        done: GetDone,
    },
    Stop,
}

struct Peer {
    ep: sys::ucp_ep_h,
    rkey: sys::ucp_rkey_h,
    /// Set by the error callback: the peer is gone, new gets fail at once.
    failed: Box<std::sync::atomic::AtomicBool>,
}

/// A UCP worker on its own progress thread, with a registered slab of slots.
pub struct Worker {
    cmds: Sender<Cmd>,
    handle: WorkerHandle,
    slab: Arc<Slab>,
    address: Vec<u8>,
    rkey: Vec<u8>,
    thread: Option<JoinHandle<()>>,
}

/// The worker pointer, used from other threads only for `ucp_worker_signal`.
#[derive(Clone, Copy)]
struct WorkerHandle(sys::ucp_worker_h);
// SAFETY: ucp_worker_signal is documented as callable from any thread; nothing else uses this
// copy of the pointer outside the progress thread.
unsafe impl Send for WorkerHandle {}
// SAFETY: as above: shared only to call ucp_worker_signal.
unsafe impl Sync for WorkerHandle {}

/// Raw UCX handles moved into the progress thread once at start.
struct Owned {
    context: sys::ucp_context_h,
    worker: sys::ucp_worker_h,
    memh: sys::ucp_mem_h,
    efd: i32,
}
// SAFETY: the handles are created on the constructing thread and then used by the progress
// thread only (UCX single-thread mode allows a worker to move between threads when not shared).
unsafe impl Send for Owned {}

impl Worker {
    /// Creates the context and worker, registers `slab` and starts progress (in the
    /// data-plane process, [`process::run`]). `background`: the progress thread runs at the
    /// lowest CPU priority, for background copies (`--replicate`), which then move bytes only
    /// when the readers leave CPU idle.
    pub fn with_slab(slab: Arc<Slab>, background: bool) -> Result<Worker, UcxError> {
        sys::load().map_err(|why| UcxError {
            op: "load",
            status: sys::UCS_ERR_NO_DEVICE,
            message: why.into(),
        })?;
        let params = sys::ucp_params_t {
            field_mask: sys::UCP_PARAM_FIELD_FEATURES as u64,
            features: (sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_WAKEUP) as u64,
            ..Default::default()
        };
        let config = tuned_config()?;
        let mut context: sys::ucp_context_h = ptr::null_mut();
        // SAFETY: params is initialised for the fields in its mask; config is a live config
        // (released right after: ucp_init copies what it needs); context is an out pointer.
        let status = unsafe { sys::ucp_init(&params, config, &mut context) };
        // SAFETY: the config came from ucp_config_read and is released once.
        unsafe { sys::ucp_config_release(config) };
        check("ucp_init", status)?;
        let wparams = sys::ucp_worker_params_t {
            field_mask: (sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE
                | sys::UCP_WORKER_PARAM_FIELD_EVENTS) as u64,
            thread_mode: sys::UCS_THREAD_MODE_SINGLE,
            events: sys::UCP_WAKEUP_RMA | sys::UCP_WAKEUP_TX | sys::UCP_WAKEUP_RX,
            ..Default::default()
        };
        let mut worker: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: a live context, initialised params and an out pointer.
        if let Err(e) = check("ucp_worker_create", unsafe {
            sys::ucp_worker_create(context, &wparams, &mut worker)
        }) {
            // SAFETY: the context was created above and nothing else uses it.
            unsafe { sys::ucp_cleanup(context) };
            return Err(e);
        }
        let fail = |e: UcxError| {
            // SAFETY: both handles were created above and are not used after this.
            unsafe {
                sys::ucp_worker_destroy(worker);
                sys::ucp_cleanup(context);
            }
            e
        };
        // Peers may only read the slab: no remote write access is registered.
        let mparams = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | sys::UCP_MEM_MAP_PARAM_FIELD_PROT) as u64,
            address: slab.base() as *mut c_void,
            length: slab.len(),
            prot: (sys::UCP_MEM_MAP_PROT_LOCAL_READ
                | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE
                | sys::UCP_MEM_MAP_PROT_REMOTE_READ) as _,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: the slab is a live mapping of `length` bytes that outlives the registration
        // (the worker thread unmaps the memh before the last Arc<Slab> can be dropped).
        check("ucp_mem_map", unsafe {
            sys::ucp_mem_map(context, &mparams, &mut memh)
        })
        .map_err(fail)?;
        let rkey = pack_rkey(context, memh).map_err(fail)?;
        let address = worker_address(worker).map_err(fail)?;
        let mut efd = -1;
        // SAFETY: a live worker created with the WAKEUP feature; efd is an out pointer.
        check("ucp_worker_get_efd", unsafe {
            sys::ucp_worker_get_efd(worker, &mut efd)
        })
        .map_err(fail)?;
        let (tx, rx) = unbounded();
        let owned = Owned {
            context,
            worker,
            memh,
            efd,
        };
        let name = if background {
            "ucx-background"
        } else {
            "ucx-progress"
        };
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if background {
                    crate::sys::lower_thread_priority();
                }
                progress(owned, rx)
            })
            .map_err(|e| UcxError {
                op: "spawn",
                status: sys::UCS_ERR_NO_RESOURCE,
                message: e.to_string(),
            })?;
        Ok(Worker {
            cmds: tx,
            handle: WorkerHandle(worker),
            slab,
            address,
            rkey,
            thread: Some(thread),
        })
    }

    pub fn slab(&self) -> &Arc<Slab> {
        &self.slab
    }

    /// What a peer needs to read this worker's slab.
    pub fn info(&self) -> PeerInfo {
        PeerInfo {
            worker_address: self.address.clone(),
            rkey: self.rkey.clone(),
        }
    }

    fn send(&self, cmd: Cmd) -> bool {
        let ok = self.cmds.send(cmd).is_ok();
        // SAFETY: ucp_worker_signal may be called from any thread on a live worker; the worker
        // lives until the progress thread ends, which is after `Stop` (sent only by Drop).
        unsafe { sys::ucp_worker_signal(self.handle.0) };
        ok
    }

    pub fn connect(&self, info: PeerInfo, timeout: Duration) -> Result<PeerId, UcxError> {
        let (tx, rx) = bounded(1);
        if !self.send(Cmd::Connect(info, tx)) {
            return Err(UcxError::gone("connect"));
        }
        rx.recv_timeout(timeout)
            .map_err(|_| UcxError::gone("connect"))?
    }

    pub fn disconnect(&self, peer: PeerId) {
        self.send(Cmd::Disconnect(peer));
    }

    /// Starts an RMA get of `len` bytes at the peer's `remote_addr` into `slot`. The slot comes
    /// back with the result on the returned channel, only once UCX is done with it.
    pub fn get(
        &self,
        peer: PeerId,
        remote_addr: u64,
        slot: Slot,
        len: usize,
    ) -> Completion<(Slot, Result<(), UcxError>)> {
        let (done, rx) = completion();
        assert!(len <= slot.capacity(), "get larger than its slot");
        self.send(Cmd::Get {
            peer,
            remote_addr,
            slot,
            len,
            done,
        });
        rx
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// UCX settings dyadfs changes from UCX's defaults, unless the user set their environment
/// variable: (variable, value). `ucp_config_modify` takes the variable without `UCX_` (1.22;
/// 1.13 took transport settings without their transport's prefix too, which 1.22 refuses).
/// The tcp transport moves an RMA get as active-message fragments of `TCP_TX_SEG_SIZE` (8 KiB
/// by default): one 256 KiB sample is 32 sends, each waking the progress threads of both
/// nodes. Larger segments cut the daemons' context switches per pulled sample from ~54 to
/// ~22 and their CPU by about a quarter (`scripts/bench_small_pull.sh`).
const TUNING: &[(&str, &str)] = &[
    ("UCX_TCP_TX_SEG_SIZE", "256k"),
    ("UCX_TCP_RX_SEG_SIZE", "256k"),
];

/// UCX's configuration (from the environment) with [`TUNING`] applied.
fn tuned_config() -> Result<*mut sys::ucp_config_t, UcxError> {
    let mut config: *mut sys::ucp_config_t = ptr::null_mut();
    // SAFETY: no env prefix or file (null: the defaults), config is an out pointer.
    check("ucp_config_read", unsafe {
        sys::ucp_config_read(ptr::null(), ptr::null(), &mut config)
    })?;
    for (variable, value) in TUNING {
        if std::env::var_os(variable).is_some() {
            continue;
        }
        let v = std::ffi::CString::new(*value).expect("no NUL");
        let name = variable.trim_start_matches("UCX_");
        let short = name.split_once('_').map_or(name, |(_, rest)| rest);
        let mut result = Ok(());
        for key in [name, short] {
            let k = std::ffi::CString::new(key).expect("no NUL");
            // SAFETY: a live config and two NUL-terminated strings that outlive the call.
            let status = unsafe { sys::ucp_config_modify(config, k.as_ptr(), v.as_ptr()) };
            result = check("ucp_config_modify", status);
            if result.is_ok() {
                break;
            }
        }
        if let Err(e) = result {
            tracing::warn!(setting = variable, error = %e, "UCX setting not applied");
        }
    }
    Ok(config)
}

fn pack_rkey(context: sys::ucp_context_h, memh: sys::ucp_mem_h) -> Result<Vec<u8>, UcxError> {
    let mut buf: *mut c_void = ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: a live context and memh; out pointers for the packed buffer and its size.
    check("ucp_rkey_pack", unsafe {
        sys::ucp_rkey_pack(context, memh, &mut buf, &mut size)
    })?;
    // SAFETY: UCX returned `size` readable bytes at `buf`, released right after the copy.
    let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
    // SAFETY: releasing the buffer ucp_rkey_pack allocated, once.
    unsafe { sys::ucp_rkey_buffer_release(buf) };
    Ok(bytes)
}

fn worker_address(worker: sys::ucp_worker_h) -> Result<Vec<u8>, UcxError> {
    let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
    let mut len = 0usize;
    // SAFETY: a live worker; out pointers for the address and its length.
    check("ucp_worker_get_address", unsafe {
        sys::ucp_worker_get_address(worker, &mut addr, &mut len)
    })?;
    // SAFETY: UCX returned `len` readable bytes at `addr`, released right after the copy.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
    // SAFETY: releasing the address ucp_worker_get_address allocated, once.
    unsafe { sys::ucp_worker_release_address(worker, addr) };
    Ok(bytes)
}

/// A get in flight: owned by UCX (through `user_data`) until its callback runs.
struct PendingGet {
    slot: Slot,
    done: GetDone,
}

/// Where a get's slot and result go when UCX completes it.
type GetDone = Completer<(Slot, Result<(), UcxError>)>;

unsafe extern "C" fn get_done(
    request: *mut c_void,
    status: sys::ucs_status_t,
    user_data: *mut c_void,
) {
    // SAFETY: user_data is the Box<PendingGet> leaked when the get was posted; UCX calls this
    // callback exactly once per request, so the box is reclaimed exactly once.
    let pending = unsafe { Box::from_raw(user_data as *mut PendingGet) };
    let result = check("ucp_get_nbx", status);
    pending.done.complete((pending.slot, result));
    // SAFETY: the request completed (this is its callback) and is freed once, here.
    unsafe { sys::ucp_request_free(request) };
}

unsafe extern "C" fn peer_failed(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: arg points at the Peer's boxed flag, which lives until the endpoint is closed
    // (the progress thread closes the endpoint before dropping the Peer).
    let flag = unsafe { &*(arg as *const std::sync::atomic::AtomicBool) };
    flag.store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(status, "UCX peer failed");
}

fn progress(owned: Owned, cmds: Receiver<Cmd>) {
    let worker = owned.worker;
    let mut peers: HashMap<PeerId, Peer> = HashMap::new();
    let mut next = 0u64;
    'outer: loop {
        while let Ok(cmd) = cmds.try_recv() {
            match cmd {
                Cmd::Stop => break 'outer,
                Cmd::Connect(info, reply) => {
                    let r = connect(worker, &info).map(|peer| {
                        next += 1;
                        peers.insert(PeerId(next), peer);
                        PeerId(next)
                    });
                    let _ = reply.send(r);
                }
                Cmd::Disconnect(id) => {
                    if let Some(p) = peers.remove(&id) {
                        close(worker, p);
                    }
                }
                Cmd::Get {
                    peer,
                    remote_addr,
                    slot,
                    len,
                    done,
                } => match peers.get(&peer) {
                    Some(p) if !p.failed.load(std::sync::atomic::Ordering::Relaxed) => {
                        post_get(p, owned.memh, remote_addr, slot, len, done);
                    }
                    _ => {
                        done.complete((
                            slot,
                            Err(UcxError::new("ucp_get_nbx", sys::UCS_ERR_ENDPOINT_TIMEOUT)),
                        ));
                    }
                },
            }
        }
        // SAFETY: the worker is live and used by this thread only.
        while unsafe { sys::ucp_worker_progress(worker) } != 0 {}
        // SAFETY: as above.
        match unsafe { sys::ucp_worker_arm(worker) } {
            s if s == sys::UCS_ERR_BUSY => continue,
            s if s == sys::UCS_OK as sys::ucs_status_t => {
                let mut pfd = libc::pollfd {
                    fd: owned.efd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // A safety net only: commands and UCX events both wake the efd.
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 1000) };
            }
            s => {
                tracing::error!(status = s, "ucp_worker_arm failed; progress thread stops");
                break;
            }
        }
    }
    for (_, p) in peers.drain() {
        close(worker, p);
    }
    // SAFETY: the memh and worker were created by Worker::new and are released once, here,
    // after every endpoint is closed; the slab memory is unmapped later by Slab's Drop.
    unsafe {
        sys::ucp_mem_unmap(owned.context, owned.memh);
        sys::ucp_worker_destroy(worker);
        sys::ucp_cleanup(owned.context);
    }
}

/// Endpoints report a dead peer (UCX's peer error mode), so a pull from a node that died fails
/// instead of hanging. UCX (1.13 and 1.22 alike) has no shared-memory transport that can, so
/// daemons on one machine talk tcp even when UCX_TLS allows shared memory (`ucx_perftest -t
/// ucp_get` with `-e` on 1.13: 744 MB/s, without: 39.7 GB/s). `DYADFS_BENCH_UCX_NO_PEER_ERRORS=1`
/// turns the mode off, for measuring dyadfs's own ceiling over shared memory on one machine only
/// (docs/BENCHMARKS.md): a peer that dies then leaves its pulls to the peer timeout and their
/// slots lost.
fn err_mode() -> sys::ucp_err_handling_mode_t {
    if std::env::var_os("DYADFS_BENCH_UCX_NO_PEER_ERRORS").is_some_and(|v| v == "1") {
        sys::UCP_ERR_HANDLING_MODE_NONE
    } else {
        sys::UCP_ERR_HANDLING_MODE_PEER
    }
}

fn connect(worker: sys::ucp_worker_h, info: &PeerInfo) -> Result<Peer, UcxError> {
    let failed = Box::new(std::sync::atomic::AtomicBool::new(false));
    let params = sys::ucp_ep_params_t {
        field_mask: (sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
            | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
            | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64,
        address: info.worker_address.as_ptr() as *const sys::ucp_address_t,
        err_mode: err_mode(),
        err_handler: sys::ucp_err_handler_t {
            cb: Some(peer_failed),
            arg: &*failed as *const _ as *mut c_void,
        },
        ..Default::default()
    };
    let mut ep: sys::ucp_ep_h = ptr::null_mut();
    // SAFETY: a live worker; the address bytes are a worker address from the peer and outlive
    // the call; the error handler's arg outlives the endpoint (see peer_failed).
    check("ucp_ep_create", unsafe {
        sys::ucp_ep_create(worker, &params, &mut ep)
    })?;
    let mut rkey: sys::ucp_rkey_h = ptr::null_mut();
    // SAFETY: a live endpoint and the peer's packed rkey bytes.
    if let Err(e) = check("ucp_ep_rkey_unpack", unsafe {
        sys::ucp_ep_rkey_unpack(ep, info.rkey.as_ptr() as *const c_void, &mut rkey)
    }) {
        close(
            worker,
            Peer {
                ep,
                rkey: ptr::null_mut(),
                failed,
            },
        );
        return Err(e);
    }
    Ok(Peer { ep, rkey, failed })
}

fn close(worker: sys::ucp_worker_h, p: Peer) {
    if !p.rkey.is_null() {
        // SAFETY: the rkey was unpacked for this endpoint and is destroyed once.
        unsafe { sys::ucp_rkey_destroy(p.rkey) };
    }
    let params = sys::ucp_request_param_t {
        op_attr_mask: 0,
        flags: sys::UCP_EP_CLOSE_FLAG_FORCE,
        ..Default::default()
    };
    // SAFETY: a live endpoint, closed once; force mode does not wait for the peer.
    let req = unsafe { sys::ucp_ep_close_nbx(p.ep, &params) };
    if !req.is_null() && !sys::ucs_ptr_is_err(req) {
        // SAFETY: req is a live request of this worker, polled to completion then freed.
        unsafe {
            while sys::ucp_request_check_status(req) == sys::UCS_INPROGRESS as sys::ucs_status_t {
                sys::ucp_worker_progress(worker);
            }
            sys::ucp_request_free(req);
        }
    }
    drop(p.failed);
}

/// Posts a get into `slot`, whose registration (`memh`, the slab's) is handed to UCX: it then
/// never looks the buffer up in a registration cache, which needs UCX's memory hooks (off in the
/// UCX scripts/install-deps.sh installs: they cost every start of the binary 0.4 s).
fn post_get(
    p: &Peer,
    memh: sys::ucp_mem_h,
    remote_addr: u64,
    slot: Slot,
    len: usize,
    done: GetDone,
) {
    let buffer = slot.as_ptr();
    let pending = Box::into_raw(Box::new(PendingGet { slot, done }));
    let mut params = sys::ucp_request_param_t {
        op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK
            | sys::UCP_OP_ATTR_FIELD_USER_DATA
            | sys::UCP_OP_ATTR_FIELD_MEMH,
        user_data: pending as *mut c_void,
        memh,
        ..Default::default()
    };
    params.cb.send = Some(get_done);
    // SAFETY: the endpoint and rkey are live; `buffer` is the slot's registered memory of at
    // least `len` bytes, owned by the request (inside `pending`) until the callback runs.
    let req = unsafe {
        sys::ucp_get_nbx(
            p.ep,
            buffer as *mut c_void,
            len,
            remote_addr,
            p.rkey,
            &params,
        )
    };
    if req.is_null() || sys::ucs_ptr_is_err(req) {
        // Completed (or failed) at once: the callback will not run, reclaim here.
        // SAFETY: `pending` came from Box::into_raw above and UCX did not take it.
        let pending = unsafe { Box::from_raw(pending) };
        let result = check("ucp_get_nbx", sys::ucs_ptr_status(req));
        pending.done.complete((pending.slot, result));
    }
}

/// The version of the UCX library this process loads (`ucp_get_version_string`) and where it
/// is, or why none loads.
pub fn version() -> String {
    match sys::load() {
        Ok(path) => {
            // SAFETY: loaded; UCX returns a static NUL-terminated string, valid for the process.
            let v = unsafe { std::ffi::CStr::from_ptr(sys::ucp_get_version_string()) };
            format!("{} ({})", v.to_string_lossy(), path.display())
        }
        Err(why) => format!("not loaded: {why}"),
    }
}
