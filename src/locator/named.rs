//! Which of a holder's objects any name points at, asked of every member: a holder that
//! restarted keeps objects whose names a crash lost (killed between keeping an object and
//! publishing its name, or between unpublishing and deleting it), which no name can reach and
//! nothing would ever delete. The names pointing at its objects live at their directories'
//! homes and backups, so only the answers of every member together say which are unnamed.

use std::collections::HashSet;
use std::sync::Arc;

use super::proto::Msg;
use super::service::LocatorService;
use crate::core::NodeId;
use crate::core::sync::lock;

impl LocatorService {
    /// Every object of `holder` some member's names point at, or `None` if a member did not
    /// answer (then nothing may be taken as unnamed).
    pub async fn objects_named(self: &Arc<Self>, holder: NodeId) -> Option<HashSet<String>> {
        let mut named: HashSet<String> = lock(&self.names)
            .entries()
            .filter(|(_, _, n)| !n.dir && n.holder == holder)
            .map(|(_, _, n)| n.object.clone())
            .collect();
        let others: Vec<NodeId> = self
            .membership
            .members()
            .map(|m| m.id)
            .filter(|&id| id != self.me())
            .collect();
        for node in others {
            let mut after = None;
            loop {
                let ask = Msg::ObjectsNamed {
                    holder,
                    after: after.clone(),
                };
                let Some(Msg::Objects { objects, more }) = self.call(node, ask).await else {
                    return None;
                };
                // Each page moves forward, or a member could keep this node asking forever.
                if more
                    && objects
                        .last()
                        .is_none_or(|l| after.as_ref().is_some_and(|a| l <= a))
                {
                    return None;
                }
                after = objects.last().cloned();
                named.extend(objects);
                if !more {
                    break;
                }
            }
        }
        Some(named)
    }
}
