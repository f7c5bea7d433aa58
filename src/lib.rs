//! dyadfs: a FUSE filesystem that caches a shared-file-system dataset on node-local NVMe.
//! See README.md for usage and ../GUIDE-style design notes in each module.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cache;
pub mod cli;
pub mod cluster;
pub mod core;
pub mod daemon;
pub mod fs;
pub mod fstab;
pub mod install;
pub mod locator;
pub mod metrics;
pub mod stats;
pub mod sys;
pub mod trace;
pub mod transport;
