//! Where each sink member's health is kept for `skein status`: written as
//! `sinks/<stage>-<member>.json` when the sink starts failing, at each
//! failed attempt, and when it writes again; a sink that never failed
//! writes nothing here.

use futures::TryStreamExt;

use super::{CheckpointStore, get_json};
use crate::error::Result;
use crate::sink_health::SinkHealthReport;

impl CheckpointStore {
    fn sink_health_key(&self, stage: u32, member: u32) -> object_store::path::Path {
        let name = format!("{}.json", Self::member_dir(stage, member));
        self.key(&["sinks", &name])
    }

    /// Save what one sink member reports.
    pub async fn put_sink_health(
        &self,
        stage: u32,
        member: u32,
        report: &SinkHealthReport,
    ) -> Result<()> {
        self.put_json(&self.sink_health_key(stage, member), report)
            .await
    }

    /// What every sink member last reported, failing ones first.
    pub async fn sink_health(&self) -> Result<Vec<SinkHealthReport>> {
        let objects: Vec<_> = self
            .store
            .list(Some(&self.key(&["sinks"])))
            .try_collect()
            .await?;
        let mut out = vec![];
        for o in objects {
            if let Some(r) = get_json::<SinkHealthReport>(&self.store, &o.location).await? {
                out.push(r);
            }
        }
        out.sort_by_key(|r| std::cmp::Reverse(r.consecutive_failures));
        Ok(out)
    }
}
