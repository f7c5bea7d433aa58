//! Moving bytes between nodes, and nothing about what they mean: [`frame`] and [`wire`] (pure
//! framing and the transport's messages), [`auth`] (the job-secret handshake, pure) and
//! [`handshake`] (it, over a socket), [`server`] (the control port: pulls served from a
//! [`server::ChunkStore`], RPCs handed to an [`server::RpcHandler`]; [`serving`] the bounded
//! threads its pull connections share), [`rpc`] (the RPC client), [`pull`] (the puller) and
//! [`ucx`] (the data plane, the only UCX-aware code). It knows no locator, filesystem or command
//! line: those sit above it.

pub mod auth;
pub mod error;
pub mod frame;
pub mod handshake;
pub mod pending;
pub mod plane;
pub mod pull;
pub mod rpc;
pub mod server;
pub mod serving;
pub mod session;
mod stream;
pub mod ucx;
pub mod wire;

pub use error::TransportError;
