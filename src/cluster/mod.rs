//! What joins the locator to the file system, the cache and the transport on a node of a
//! cluster: `source` the fetch logic of a read (locate, pull, wait for another node's fetch, or
//! read the shared file system) over the `Locate` and `Pull` ports, and the `CacheStore` peers
//! read this node's cache through; `replicate` copies what peers fetched (`--replicate`);
//! `names` the produced namespace over the wire (each directory's names at its name home);
//! `peers` the locator's port to the other members on the transport's RPC.
//! The locator below it is tables, tiers, membership and messages only.

pub mod names;
#[cfg(test)]
mod names_tests;
pub mod peers;
pub mod replicate;
pub mod source;
