//! Who the members of a cluster are and which of them this node is: its id (`--node-id` or a
//! launcher's rank), and the members from the peers file or a rendezvous directory. Mount's
//! checks ask before anything is made; the wiring asks again to build the cluster.

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::UserError;
use super::config::MountConfig;
use crate::locator::Membership;

/// This node's id: `--node-id`, else the launcher's rank variable.
pub(crate) fn node_id(args: &MountConfig) -> Result<u32, UserError> {
    if let Some(id) = args.cluster.node_id {
        return Ok(id);
    }
    match crate::locator::membership::node_id_from_launcher() {
        Some((var, id)) => {
            tracing::info!(var, id, "node id from the launcher");
            Ok(id)
        }
        None => Err(UserError::NoNodeId),
    }
}

/// The members the peers file names, this node among them.
pub(crate) fn membership(file: &Path, id: u32) -> Result<Membership, UserError> {
    let path = || file.to_path_buf();
    let text = fs::read_to_string(file).map_err(|source| UserError::PeersFile {
        path: path(),
        source,
    })?;
    Membership::parse(&text, id).map_err(|source| UserError::Peers {
        path: path(),
        source,
    })
}

/// The members: the peers file, or those that met in the rendezvous directory.
pub(crate) fn members(args: &MountConfig, id: u32) -> Result<Membership, UserError> {
    match (&args.cluster.peers, &args.cluster.rendezvous) {
        (Some(file), _) => membership(file, id),
        (None, Some(dir)) => {
            let me = crate::locator::Member {
                id,
                addr: args
                    .cluster
                    .listen
                    .ok_or(UserError::RendezvousNeedsListen)?,
                rack: args.cluster.rack.clone(),
            };
            let k = args.cluster.nodes.unwrap_or(1) as usize;
            let wait = args.cluster.peer_timeout.max(Duration::from_secs(60));
            crate::locator::rendezvous::rendezvous(dir, &me, k, wait)
                .map_err(|e| UserError::Rendezvous(e.to_string()))
        }
        (None, None) => unreachable!("a cluster mount has peers or a rendezvous"),
    }
}
