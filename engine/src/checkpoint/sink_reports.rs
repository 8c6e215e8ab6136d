//! Where each sink member's health is kept for `skein status`: written as
//! `sinks/<stage>-<member>.json` when the sink starts failing, at each
//! failed attempt, and when it writes again; a sink that never failed
//! writes nothing here.

use super::{CheckpointStore, Kind};
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
        self.put_json(Kind::Other, &self.sink_health_key(stage, member), report)
            .await
    }

    /// What every sink member last reported, failing ones first.
    pub async fn sink_health(&self) -> Result<Vec<SinkHealthReport>> {
        let mut out = vec![];
        for o in self.backend.list(&self.key(&["sinks"])).await? {
            if let Some(r) = self.get_json::<SinkHealthReport>(&o.key).await? {
                out.push(r);
            }
        }
        out.sort_by_key(|r| std::cmp::Reverse(r.consecutive_failures));
        Ok(out)
    }
}
