//! What a checkpoint store says about a query's progress, for `skein
//! status`: the last epoch decided and the last committed, with the times
//! their objects were written, and the bytes of state held.

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use serde::Serialize;

use super::{CheckpointStore, Commit, epoch_name};
use crate::error::Result;

/// What a checkpoint store holds, for `skein status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreSummary {
    /// The last epoch the driver decided (and fired).
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
    /// planned epoch and when they were written.
    pub async fn summary(&self) -> Result<StoreSummary> {
        let mut out = StoreSummary {
            committed: self.committed().await?,
            last_epoch: self.last_planned_epoch().await?,
            ..Default::default()
        };
        out.committed_ms = self.modified_ms(&["commit.json"]).await;
        if let Some(e) = out.last_epoch {
            let name = format!("{}.json", epoch_name(e));
            out.last_epoch_ms = self.modified_ms(&["epochs", &name]).await;
        }
        let states: Vec<_> = self
            .store
            .list(Some(&self.key(&["state"])))
            .try_collect()
            .await?;
        out.state_bytes = states.iter().map(|o| o.size).sum();
        Ok(out)
    }

    async fn modified_ms(&self, parts: &[&str]) -> Option<i64> {
        let meta = self.store.head(&self.key(parts)).await.ok()?;
        Some(meta.last_modified.timestamp_millis())
    }
}
