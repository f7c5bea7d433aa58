//! `dyadfs status` as a node's locator answers it: every member, whether it is up, suspect or
//! down, and what its cache holds (asked of each member not known to be down, all at once,
//! each bounded).

use std::sync::Arc;
use std::time::Duration;

use super::proto::Msg;
use super::service::LocatorService;
use crate::stats::{MemberStatus, StatusReport};

/// The longest `status` waits for a member's counts.
const ASK_FOR: Duration = Duration::from_secs(1);

impl LocatorService {
    pub async fn status(self: &Arc<Self>) -> StatusReport {
        let suspects = self.suspects();
        let mut calls = tokio::task::JoinSet::new();
        let mut members: Vec<MemberStatus> = self
            .membership
            .members()
            .map(|m| {
                let state = if m.id == self.me() {
                    "self"
                } else if self.liveness.is_down(m.id) {
                    "down"
                } else if suspects.contains(&m.id) {
                    "suspect"
                } else {
                    "up"
                };
                if state != "down" {
                    let (me, id) = (self.clone(), m.id);
                    calls.spawn(
                        async move { (id, me.call_within(id, Msg::CountHeld, ASK_FOR).await) },
                    );
                }
                MemberStatus {
                    id: m.id,
                    addr: m.addr.to_string(),
                    rack: m.rack.clone(),
                    state: state.into(),
                    files: None,
                    bytes: None,
                }
            })
            .collect();
        while let Some(r) = calls.join_next().await {
            if let Ok((id, Some(Msg::Held { files, bytes }))) = r
                && let Some(m) = members.iter_mut().find(|m| m.id == id)
            {
                (m.files, m.bytes) = (Some(files), Some(bytes));
            }
        }
        members.sort_by_key(|m| m.id);
        StatusReport {
            node: self.me(),
            members,
        }
    }
}
