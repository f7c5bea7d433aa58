//! Moving chunks between nodes: the control channel's wire format ([`wire`], pure), the pull
//! protocol over tokio TCP ([`pull`]) and the UCX data plane ([`ucx`], the only UCX-aware code).

pub mod pull;
pub mod tool;
pub mod ucx;
pub mod wire;
