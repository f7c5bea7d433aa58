//! How large one locator RPC may grow: a directory's listing is answered a page at a time,
//! bounded by what its entries encode to. So no reply comes near the transport's frame limit
//! (16 MiB) however many entries a table holds: a frame past it is refused by the receiver,
//! and what it carried would be lost.

use crate::transport::frame::MAX_FRAME;

/// The most the entries of a listing's page encode to. Large
/// enough that a page costs far more bytes than its round trip (a million 255-byte names are
/// about 300 pages), small enough to leave the frame limit far off: one entry adds at most a
/// name or path (4 KiB) and a symlink's target (4 KiB) past the bound.
pub const PAGE_BYTES: usize = 1 << 20;

const _: () = assert!(PAGE_BYTES * 2 < MAX_FRAME);
