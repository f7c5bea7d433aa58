//! The fetch logic's ports: what it asks of the locator ([`Locate`]) and of peers ([`Pull`]),
//! and the daemon's adapters to them (the RPC service's [`ServiceLink`], the transport's
//! [`Puller`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::core::Version;
use crate::locator::membership::{Membership, NodeId};
use crate::locator::proto::{Msg, PageMap};
use crate::locator::service::LocatorService;
use crate::locator::tiers::Reply;
use crate::transport::TransportError;
use crate::transport::pull::{self, Puller, Sink, Want};

/// What the fetch logic asks of the locator.
pub trait Locate: Send + Sync + 'static {
    fn me(&self) -> NodeId;
    fn membership(&self) -> &Membership;
    /// Bound on waiting for another node's fetch.
    fn timeout(&self) -> Duration;
    /// What this node should do about a file it misses, asking for at most `within`.
    fn locate(&self, path: &str, version: Version, within: Duration) -> Reply;
    /// This node was told to fetch and could not read the backing store.
    fn fetch_failed(&self, path: &str, version: Version);
    /// Nodes that failed recently: tried last as holders.
    fn suspects(&self) -> Vec<NodeId>;
    /// A pull from `holder` failed: it is no holder of this version; unless it answered (it
    /// said it has not got the bytes) it is suspect; a chunk that failed its checksum is
    /// reported to it.
    fn pull_failed(&self, path: &str, version: Version, holder: NodeId, error: &TransportError);
    /// Whether the cluster declared `node` down: it is never tried.
    fn is_down(&self, node: NodeId) -> bool;
    /// Which pages `holder` has of `path` at `version` in the window of byte `offset`:
    /// `Some(None)` if it holds no copy, `None` if it did not say (see
    /// [`LocatorService::pages_of`]). By default nobody says.
    fn pages_of(
        &self,
        _holder: NodeId,
        _file: (&str, Version, u64),
        _within: Duration,
    ) -> Option<Option<PageMap>> {
        None
    }
}

/// Pulls a byte range from the holder at an address, waiting at most `within` for each answer.
pub trait Pull: Send + Sync + 'static {
    fn pull(
        &self,
        peer: SocketAddr,
        want: &Want,
        sink: Sink<'_>,
        within: Duration,
    ) -> Result<u64, TransportError>;

    /// Pulls several whole small files from one holder at once (see [`Puller::pull_batch`]);
    /// by default it cannot, and the caller pulls them one by one.
    fn pull_batch(
        &self,
        _peer: SocketAddr,
        _wants: &[Want],
        _sink: pull::BatchSink<'_>,
        _within: Duration,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        Err(TransportError::Local("no batched pulls".into()))
    }
}

impl Pull for Puller {
    fn pull(
        &self,
        peer: SocketAddr,
        want: &Want,
        sink: Sink<'_>,
        within: Duration,
    ) -> Result<u64, TransportError> {
        Puller::pull_within(self, peer, want, sink, within)
    }

    fn pull_batch(
        &self,
        peer: SocketAddr,
        wants: &[Want],
        sink: pull::BatchSink<'_>,
        within: Duration,
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        Puller::pull_batch(self, peer, wants, sink, within)
    }
}

/// The daemon's locator: the RPC service, its blocking calls answered on `runtime` when this
/// node is the addressee.
pub struct ServiceLink {
    pub service: Arc<LocatorService>,
    pub runtime: tokio::runtime::Handle,
}

impl Locate for ServiceLink {
    fn me(&self) -> NodeId {
        self.service.me()
    }

    fn membership(&self) -> &Membership {
        &self.service.membership
    }

    fn timeout(&self) -> Duration {
        self.service.timeout
    }

    fn locate(&self, path: &str, version: Version, within: Duration) -> Reply {
        self.service.locate(&self.runtime, path, version, within)
    }

    fn fetch_failed(&self, path: &str, version: Version) {
        self.runtime
            .block_on(self.service.fetch_failed(path, version));
    }

    fn suspects(&self) -> Vec<NodeId> {
        self.service.suspects()
    }

    fn pull_failed(&self, path: &str, version: Version, holder: NodeId, error: &TransportError) {
        self.service
            .node
            .holder_failed(&(path.to_string(), version), holder);
        match error {
            TransportError::Remote { .. } | TransportError::Forged { .. } => {}
            TransportError::Checksum { offset, .. } => {
                let msg = Msg::BadChunk {
                    path: path.to_string(),
                    version,
                    offset: *offset,
                };
                let service = self.service.clone();
                self.runtime.spawn(async move {
                    service.call(holder, msg).await;
                });
            }
            _ => self.service.failed(holder, error),
        }
    }

    fn is_down(&self, node: NodeId) -> bool {
        self.service.liveness.is_down(node)
    }

    fn pages_of(
        &self,
        holder: NodeId,
        file: (&str, Version, u64),
        within: Duration,
    ) -> Option<Option<PageMap>> {
        self.service.pages_of(&self.runtime, holder, file, within)
    }
}
