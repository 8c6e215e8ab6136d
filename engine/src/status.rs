//! A query's progress as `skein status QUERY` shows it, read from its
//! checkpoint store and its sources: per source partition the committed
//! offset, the latest and the lag; the watermark of the committed epoch and
//! its delay behind the wall clock; the last epoch run and committed.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::checkpoint::{CheckpointStore, StoreSummary, Tally};
use crate::error::Result;
use crate::planner::QueryPlan;
use crate::sink_health::SinkHealthReport;

/// Where one source partition stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartitionStatus {
    /// The source table.
    pub source: String,
    /// The partition.
    pub partition: i32,
    /// The next offset after the last committed epoch.
    pub committed: Option<i64>,
    /// The partition's end now; `None` where the source cannot tell.
    pub latest: Option<i64>,
    /// How far the committed offset is behind the partition's end, if known.
    pub lag: Option<i64>,
    /// How far the newest record is ahead of the committed position, in ms
    /// of arrival time, where offsets are no record counts (Kinesis:
    /// `MillisBehindLatest`).
    pub behind_ms: Option<i64>,
}

/// What `skein status` reports about a query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryStatus {
    /// The query code.
    pub query_code: String,
    /// Every source partition.
    pub partitions: Vec<PartitionStatus>,
    /// The sum of the partitions' lags.
    pub lag: i64,
    /// The most any partition is behind, in ms (Kinesis).
    pub behind_ms: Option<i64>,
    /// The lowest watermark the source members sent in the committed
    /// epoch, Unix ms.
    pub watermark_ms: Option<i64>,
    /// How far the watermark is behind the wall clock, ms.
    pub watermark_delay_ms: Option<i64>,
    /// What the checkpoint store holds.
    #[serde(flatten)]
    pub store: StoreSummary,
    /// Since the query started (every instance of every member): records
    /// sent to dead letters, late rows set aside, failed sink writes.
    pub since_start: Tally,
    /// What keeps a source from reading now (a schema registry that does
    /// not answer), one line each.
    #[serde(default)]
    pub problems: Vec<String>,
    /// Each sink member that has ever failed, as it last reported: failing
    /// now (`consecutive_failures` > 0) or written again since.
    pub sinks: Vec<SinkHealthReport>,
    /// Every function group's size, by stage id, as of the last commit
    /// (the plan's before the first).
    #[serde(default)]
    pub groups: crate::checkpoint::Layout,
    /// A rescale `skein rescale` asked for that the driver has not
    /// carried out yet.
    #[serde(default)]
    pub rescale_asked: Option<crate::checkpoint::RescaleRequest>,
    /// The last [`RESIZES_SHOWN`] rescales (by hand or `--autoscale`),
    /// oldest first: the first epoch run at the new sizes, and every
    /// group's size from then on. Left empty by [`query_status`] (a list
    /// and a read per rescale, which the page's polling need not pay);
    /// [`resized`] reads it.
    #[serde(default)]
    pub resized: Vec<Resized>,
}

/// Rescales `skein status` lists.
pub const RESIZES_SHOWN: usize = 20;

/// One rescale, as its layout record says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resized {
    /// The first epoch run at these sizes.
    pub from_epoch: u64,
    /// Every group's size, by stage id.
    pub groups: crate::checkpoint::Layout,
}

/// The last [`RESIZES_SHOWN`] rescales the store recorded, oldest first.
pub async fn resized(store: &CheckpointStore) -> Result<Vec<Resized>> {
    Ok(store
        .layouts(RESIZES_SHOWN)
        .await?
        .into_iter()
        .map(|(from_epoch, groups)| Resized { from_epoch, groups })
        .collect())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// The status of `plan`'s query from its checkpoint store; `catalog` builds
/// each source table to ask for its partitions' ends.
pub async fn query_status(
    plan: &QueryPlan,
    store: &CheckpointStore,
    catalog: &Catalog,
) -> Result<QueryStatus> {
    let summary = store.summary().await?;
    let since_start = store.tally().await?;
    let mut groups = plan.layout();
    if let Some((_, layout)) = store.committed_in().await? {
        groups.extend(layout);
    }
    let rescale_asked = store.rescale_request().await?;
    let sinks = store.sink_health().await?;
    let mut committed: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut watermark: Option<i64> = None;
    let mut committed_at: Vec<crate::payload::SourceOffset> = vec![];
    if let Some(commit) = summary.committed {
        for stage in plan.source_stages() {
            for member in 0..stage.members {
                let Some(entry) = store.offsets(stage.id, member, commit.epoch).await? else {
                    continue;
                };
                if let Some(w) = entry.watermark {
                    watermark = Some(watermark.map_or(w, |m: i64| m.min(w)));
                }
                for o in entry.tables.into_iter().flat_map(|t| t.to) {
                    committed.insert((o.source.clone(), o.partition), o.offset);
                    committed_at.push(o);
                }
            }
        }
    }
    let mut latest: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut behind: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut problems: Vec<String> = vec![];
    for stage in plan.source_stages() {
        for leaf in &stage.sources {
            let source = catalog.create_source(&leaf.config, leaf.schema.clone())?;
            for o in source.latest().await? {
                latest.insert((o.source, o.partition), o.offset);
            }
            for (partition, ms) in source.behind_ms(&committed_at).await? {
                behind.insert((leaf.config.location.clone(), partition), ms);
            }
            for p in source.problems().await {
                problems.push(format!("{}: {p}", leaf.table));
            }
        }
    }
    let mut keys: Vec<_> = committed.keys().chain(latest.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    let partitions: Vec<PartitionStatus> = keys
        .into_iter()
        .map(|key| {
            let c = committed.get(&key).copied();
            let l = latest.get(&key).copied();
            PartitionStatus {
                lag: l.map(|l| (l - c.unwrap_or(0)).max(0)),
                behind_ms: behind.get(&key).copied(),
                source: key.0,
                partition: key.1,
                committed: c,
                latest: l,
            }
        })
        .collect();
    // The watermark's lowest value (i64::MIN) means "nothing seen yet".
    let watermark = watermark.filter(|w| *w > i64::MIN);
    Ok(QueryStatus {
        query_code: plan.query_code.clone(),
        lag: partitions.iter().filter_map(|p| p.lag).sum(),
        behind_ms: partitions.iter().filter_map(|p| p.behind_ms).max(),
        partitions,
        watermark_ms: watermark,
        watermark_delay_ms: watermark.map(|w| now_ms() - w),
        store: summary,
        since_start,
        problems,
        sinks,
        groups,
        rescale_asked,
        resized: vec![],
    })
}
