//! The in-process double of the locator's port to its peers, for unit tests: several
//! [`LocatorService`]s of one job in one process, each message encoded and decoded as on the
//! wire and handed to its addressee's `answer`, and any member made dead (connections refused at
//! once), frozen (nothing comes back: the caller waits out its timeout) or lying (a reply that
//! names a node outside the job) at any moment. Like mountpoint-s3's failure-injecting client,
//! it lets failover, rack lookups, publishes and names be tested without processes.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::membership::NodeId;
use super::peers::{PeerFuture, Peers};
use super::proto::{self, Msg};
use super::service::LocatorService;
use super::tiers::Reply;
use crate::core::sync::lock;
use crate::transport::TransportError;

/// What is wrong with a member, as its callers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Its process is gone: a call is refused at once.
    Dead,
    /// Stopped (SIGSTOP, a hung host): a call waits out its whole timeout.
    Frozen,
    /// It answers every message with holders outside the job.
    Lying,
}

/// The members of one job and the runtime their messages run on.
pub struct Net {
    services: Mutex<HashMap<NodeId, Weak<LocatorService>>>,
    faults: Mutex<HashMap<NodeId, Fault>>,
    /// Messages that reached each member (answered by it, whatever the answer).
    delivered: Mutex<HashMap<NodeId, usize>>,
    runtime: tokio::runtime::Runtime,
}

impl Net {
    pub fn new() -> Arc<Net> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a test runtime");
        Arc::new(Net {
            services: Mutex::default(),
            faults: Mutex::default(),
            delivered: Mutex::default(),
            runtime,
        })
    }

    /// The port member `from` sends through.
    pub fn port(self: &Arc<Self>, from: NodeId) -> Arc<dyn Peers> {
        Arc::new(Port {
            net: self.clone(),
            from,
        })
    }

    /// Puts `service` on the net under its id (in place of an earlier process of that id).
    pub fn join(&self, service: &Arc<LocatorService>) {
        lock(&self.services).insert(service.me(), Arc::downgrade(service));
    }

    /// Makes `node` faulty (`Some`) or healthy again (`None`).
    pub fn fault(&self, node: NodeId, fault: Option<Fault>) {
        let mut faults = lock(&self.faults);
        match fault {
            Some(f) => faults.insert(node, f),
            None => faults.remove(&node),
        };
    }

    /// How many messages reached `node` so far.
    pub fn delivered(&self, node: NodeId) -> usize {
        lock(&self.delivered).get(&node).copied().unwrap_or(0)
    }

    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// `payload` (an encoded message) from `from` to `to`, answered as its process would.
    async fn deliver(
        &self,
        from: NodeId,
        to: NodeId,
        peer: SocketAddr,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Msg, TransportError> {
        let fault = lock(&self.faults).get(&to).copied();
        let service = lock(&self.services).get(&to).and_then(Weak::upgrade);
        let refused = || TransportError::Io {
            peer,
            source: io::ErrorKind::ConnectionRefused.into(),
        };
        let timed_out = TransportError::Timeout {
            peer,
            what: "an RPC reply",
            timeout,
        };
        let service = match (fault, service) {
            (Some(Fault::Dead), _) | (None, None) => return Err(refused()),
            (Some(Fault::Frozen), _) => {
                tokio::time::sleep(timeout).await;
                return Err(timed_out);
            }
            (Some(Fault::Lying), _) => return Ok(Msg::Located(Reply::Holders(vec![u32::MAX]))),
            (None, Some(s)) => s,
        };
        *lock(&self.delivered).entry(to).or_default() += 1;
        let msg =
            proto::decode(&payload).map_err(|source| TransportError::Wire { peer, source })?;
        let answer = tokio::time::timeout(timeout, service.answer(Some(from), msg))
            .await
            .map_err(|_| timed_out)?;
        // As on the wire: what comes back is what decodes from the bytes sent.
        proto::decode(&proto::encode(&answer))
            .map_err(|source| TransportError::Wire { peer, source })
    }
}

/// One member's way out to the others.
struct Port {
    net: Arc<Net>,
    from: NodeId,
}

impl Peers for Port {
    fn call<'a>(
        &'a self,
        to: NodeId,
        addr: SocketAddr,
        msg: &Msg,
        timeout: Duration,
    ) -> PeerFuture<'a> {
        let payload = proto::encode(msg);
        Box::pin(self.net.deliver(self.from, to, addr, payload, timeout))
    }

    fn call_blocking(
        &self,
        to: NodeId,
        addr: SocketAddr,
        msg: &Msg,
        timeout: Duration,
    ) -> Result<Msg, TransportError> {
        self.net.block_on(self.call(to, addr, msg, timeout))
    }
}
