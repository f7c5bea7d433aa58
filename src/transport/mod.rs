//! Moving chunks between nodes: the control channel's wire format ([`wire`], pure), the pull
//! protocol over tokio TCP ([`pull`]) and the UCX data plane ([`ucx`], the only UCX-aware code).

pub mod auth;
pub mod pull;
pub mod tool;
pub mod ucx;
pub mod wire;

/// Gives the calling thread the lowest CPU priority (nice 19; Linux sets it per thread): the
/// threads of background copies (`--replicate`) then run on CPU the readers leave idle.
pub fn lower_thread_priority() {
    // SAFETY: gettid has no preconditions; setpriority only reads its arguments.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(error = %e, "a background thread keeps its priority");
    }
}
