//! The vocabulary every layer shares, and nothing else: a file's [`Version`] and [`Kind`], a
//! node's id, a produced [`names::Name`] and the [`names::Namespace`] that holds names, the
//! [`source::Source`] port that missing chunks come from (and, for unit tests, `mem_source`, its
//! in-memory double), the rules a path from outside must follow ([`paths`]), and `HOST:PORT` as
//! an operator writes it ([`addr`]). Every other module may use it; it uses none of them, so the
//! arrows between the layers above only point down.

pub mod addr;
mod ids;
mod kind;
#[cfg(test)]
pub(crate) mod mem_source;
pub mod names;
pub mod paths;
pub mod source;
pub mod sync;

pub use ids::{NodeId, Version, path_hash, version_at, version_of};
pub use kind::Kind;
