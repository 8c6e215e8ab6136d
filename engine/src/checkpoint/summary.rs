//! What a checkpoint store says about a query's progress, for `skein
//! status`: the last epoch decided and the last committed, with the times
//! their objects were written, and the bytes of state held.

use serde::{Deserialize, Serialize};

use super::{CheckpointStore, Commit, StateKind, epoch_name};
use crate::error::Result;

/// What a checkpoint store holds, for `skein status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StoreSummary {
    /// The last epoch the driver decided (and may have fired).
    pub last_epoch: Option<u64>,
    /// When it was decided, Unix ms.
    pub last_epoch_ms: Option<i64>,
    /// The last committed epoch, if any.
    pub committed: Option<Commit>,
    /// When it was committed, Unix ms.
    pub committed_ms: Option<i64>,
    /// Bytes of every member's state objects (whole states and changes).
    pub state_bytes: u64,
}

impl CheckpointStore {
    /// Summarise the store for `skein status`: its last commit, its last
    /// decided epoch and when they were written.
    pub async fn summary(&self) -> Result<StoreSummary> {
        let log = self.driver_log().await?;
        let commit_key = self.key(&["commit.json"]);
        let mut out = StoreSummary {
            committed: log.committed,
            last_epoch: log.highest().or(log.committed.map(|c| c.epoch)),
            ..Default::default()
        };
        out.committed_ms = self.backend.modified_ms(&commit_key).await;
        // A decision stands alone, or came with the commit.
        if let Some(e) = out.last_epoch {
            let lone = self.key(&["epochs", &format!("{}.json", epoch_name(e))]);
            out.last_epoch_ms = match self.backend.modified_ms(&lone).await {
                Some(ms) => Some(ms),
                None => out.committed_ms,
            };
        }
        out.state_bytes = self
            .list_epochs(&["members"])
            .await?
            .into_iter()
            .filter(|(key, _, _)| {
                key.filename()
                    .and_then(StateKind::of_name)
                    .is_some_and(|k| k.is_some())
            })
            .map(|(_, _, size)| size)
            .sum();
        Ok(out)
    }
}
