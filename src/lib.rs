//! dyadfs: a FUSE filesystem that caches a shared-file-system dataset on node-local NVMe and
//! hands produced files between the nodes of a job. README.md says how to use it;
//! docs/ARCHITECTURE.md draws the modules below and which uses which; each module's header
//! says what it holds.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod backing;
pub mod cache;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod core;
pub mod daemon;
pub mod fill;
pub mod fs;
pub mod fstab;
pub mod fuse;
pub mod install;
pub mod locator;
pub mod metrics;
pub mod node;
pub mod stats;
pub mod sys;
pub mod trace;
pub mod transport;
