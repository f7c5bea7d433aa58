//! The hierarchical sample locator: which nodes hold a copy of a file, asked tier by tier
//! (node -> rack -> global). `membership` says who is in the cluster and who is home for a
//! path (from a peers file or a `rendezvous` directory); `node` is the node tier's answer
//! cache, which `hints` fills from the global homes' feeds; `tiers` holds the rack and global tables and their coordination rules; `names` is
//! the namespace of produced files. `proto` is what the tiers say to one another (an RPC
//! payload of the transport), `pages` how large one may grow, `check` what a message from the
//! wire must satisfy, `peers` the port its messages leave by, and `service` one daemon's
//! locator answering and asking them (unit-tested among in-process peers, `loopback`). It knows no file system or cache: what
//! joins it to them (a read's fetch logic, replication, produced names over the wire) is the
//! cluster module, above it.

pub mod check;
pub mod error;
mod failover;
mod fetching;
pub mod gossip;
mod hints;
#[cfg(test)]
pub(crate) mod loopback;
pub mod membership;
pub mod name_calls;
pub mod names;
pub mod node;
pub mod pages;
pub mod peers;
pub mod proto;
pub mod rendezvous;
pub mod service;
#[cfg(test)]
mod service_tests;
mod table;
pub mod tiers;
pub mod watching;

pub use membership::{Member, Membership, NodeId, PeersError};
pub use tiers::{GlobalHome, Key, RackHome, RackLookup, Reply, pick_holder};
