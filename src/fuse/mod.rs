//! The FUSE session: the request handlers once (`ops`), answering through reply traits
//! (`reply`), and two transports that bring requests to them: fuser on /dev/fuse (`dev`,
//! which also answers INIT, FORGET and INTERRUPT, and sends notifications), and the kernel's
//! FUSE-over-io_uring queues (`ring`), one per CPU, which carry every other request once
//! registered. `session` mounts, picks the transport and runs the session for the daemon, or
//! serves a mount another process made (`fusermount`: a user's mount the node service serves).
//! The I/O-mode rules of opens and the offsets of listings are the core's; the session's kernel
//! resources (its device, passthrough backing ids) are held here.

mod admission;
pub mod caller;
mod convert;
pub mod dev;
mod finishers;
pub mod fusermount;
pub mod io_modes;
pub mod ops;
#[cfg(test)]
mod ops_tests;
pub mod passthrough;
pub mod reply;
pub mod ring;
pub mod running;
pub mod session;
mod waiting;

pub use dev::{FuseAdapter, FuseTransport};
