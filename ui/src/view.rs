//! What the API answers: a row per query for the list, and one query's
//! page (graph, lag per partition, watermarks, checkpoints, set-aside rows,
//! SQL and explain, time series, cost), from what [`crate::records`] read
//! and, for lag per partition, the sources themselves (as `skein status`).

use serde::Serialize;
use skein_engine::checkpoint::{CheckpointFigures, Point, Progress, Reason, Tally, Totals};
use skein_engine::planner::QueryPlan;
use skein_engine::status::PartitionStatus;

use crate::catalog::{Backend, Found};
use crate::graph::Graph;
use crate::records::Records;

/// A query as the list shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `<backend>/<query code>`, its address under /api/queries/.
    pub id: String,
    pub backend: Backend,
    pub query_code: String,
    /// `running`, `stopped`, `failing` or `deployed` (on Lambda, without a
    /// schedule: it runs when `skein run --backend lambda` drives it).
    pub state: String,
    /// The last failed epoch's error, while the query has not committed
    /// since.
    pub error: Option<String>,
    /// Where its checkpoints are.
    pub location: String,
    /// The query's first line of SQL that is not a table declaration.
    pub title: String,
    /// The query's name (`--name`, a `-- name:` line, its file's stem).
    pub name: Option<String>,
    pub last_epoch: Option<u64>,
    pub committed_epoch: Option<u64>,
    /// When the last commit was written, Unix ms.
    pub committed_ms: Option<i64>,
    /// Records the sources were behind after the latest epoch.
    pub lag: Option<u64>,
    pub watermark_ms: Option<i64>,
    /// How far the watermark trails the wall clock, ms.
    pub watermark_delay_ms: Option<i64>,
    pub events_per_s: Option<f64>,
    /// Priced on Lambda arm64 from what the query used (skein-cost).
    pub usd_per_million_events: Option<f64>,
}

/// One point of the time series.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesPoint {
    /// The bucket's start, Unix ms.
    pub t: i64,
    pub events_per_s: f64,
    pub lag: Option<u64>,
    /// The mean epoch duration in the bucket, ms.
    pub epoch_ms: f64,
    /// Members of all function groups at the bucket's last epoch.
    pub members: Option<u32>,
}

/// What one query's page shows.
#[derive(Debug, Clone, Serialize)]
pub struct Detail {
    #[serde(flatten)]
    pub summary: Summary,
    pub sql: Option<String>,
    pub explain: Option<String>,
    pub graph: Option<Graph>,
    /// Lag per source partition, asked of the sources now.
    pub partitions: Vec<PartitionStatus>,
    /// Why the partitions could not be asked, if they could not.
    pub partitions_error: Option<String>,
    pub checkpoints: Vec<CheckpointFigures>,
    /// Dead letters, late rows and sink errors since the query started.
    pub set_aside: Tally,
    /// The latest reasons, newest first.
    pub reasons: Vec<Reason>,
    /// The last hour.
    pub series: Vec<SeriesPoint>,
    pub totals: Totals,
    pub state_bytes: u64,
    /// The schedule's state (standing queries on Lambda).
    pub schedule: Option<String>,
    /// Whether the page offers stop and start.
    pub controls: bool,
    /// The functions deployed (Lambda).
    pub functions: Vec<String>,
    /// Why the query could not be planned, if it could not.
    pub plan_error: Option<String>,
}

/// The state of a query: see [`Summary::state`].
fn state(found: &Found, records: &Records, schedule: Option<&str>) -> (String, Option<String>) {
    let committed_ms = records.commit.as_ref().map(|c| c.progress.at_ms);
    let failing = records
        .failure
        .as_ref()
        .filter(|f| committed_ms.is_none_or(|c| f.at_ms > c));
    let error = failing.map(|f| format!("epoch {}: {}", f.epoch, f.message));
    let state = match (found.backend, failing, schedule) {
        (Backend::Local, _, _) if found.pid.is_some() => "running",
        (_, Some(_), _) => "failing",
        (Backend::Local, None, _) => "stopped",
        (Backend::Lambda, None, Some("ENABLED")) => "running",
        (Backend::Lambda, None, Some(_)) => "stopped",
        (Backend::Lambda, None, None) => "deployed",
    };
    (state.to_string(), error)
}

/// The first line of a query that is neither a declaration nor a comment.
fn title(sql: &str) -> String {
    let statements = sql.split(';').map(str::trim).filter(|s| !s.is_empty());
    let query = statements
        .map(|s| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .find(|s| !s.trim_start().to_ascii_uppercase().starts_with("CREATE "))
        .unwrap_or_default();
    let words: Vec<&str> = query.split_whitespace().collect();
    let line = words.join(" ");
    match line.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line,
    }
}

/// $ per million events on Lambda arm64 for what `totals` used.
pub fn usd_per_million(totals: &Totals) -> Option<f64> {
    if totals.events == 0 {
        return None;
    }
    let measured = skein_cost::Measured {
        events: totals.events,
        invocations: totals.usage.invocations,
        billed_ms: totals.usage.billed_ms,
        checkpoint_puts: totals.usage.checkpoint_puts,
        checkpoint_bytes: totals.usage.checkpoint_bytes,
        checkpoint_gets: 0,
        cpu_s: totals.usage.cpu_ms as f64 / 1000.0,
    };
    let report = skein_cost::estimate(
        &measured,
        &skein_cost::Prices::default(),
        &skein_cost::ModelOptions::default(),
    );
    report
        .lambda
        .iter()
        .find(|l| l.arch == skein_cost::Arch::Arm64)
        .map(|l| l.usd_per_million_events)
}

/// The list row of a query.
pub fn summary(found: &Found, records: &Records, schedule: Option<&str>, now_ms: i64) -> Summary {
    let (state, error) = state(found, records, schedule);
    let progress = records.commit.as_ref().map(|c| &c.progress);
    let recent = progress.filter(|p| p.at_ms > 0);
    Summary {
        id: format!("{}/{}", found.backend.name(), found.code),
        backend: found.backend,
        query_code: found.code.clone(),
        state,
        error,
        location: found.location.clone(),
        name: found.name.clone(),
        title: found
            .sql
            .as_ref()
            .map(|(s, _)| title(s))
            .unwrap_or_default(),
        last_epoch: records.summary.last_epoch,
        committed_epoch: records.commit.as_ref().map(|c| c.commit.epoch),
        committed_ms: records.summary.committed_ms,
        lag: recent.and_then(|p| p.lag),
        watermark_ms: recent.and_then(|p| p.watermark_ms),
        watermark_delay_ms: recent.and_then(|p| p.watermark_ms).map(|w| now_ms - w),
        events_per_s: recent.map(|p| p.events_per_s),
        usd_per_million_events: recent.and_then(|p| usd_per_million(&p.totals)),
    }
}

/// The time series of `progress`: events per second, lag and mean epoch
/// duration per bucket (the bucket in progress up to `progress.at_ms`).
pub fn series(progress: &Progress) -> Vec<SeriesPoint> {
    let bucket = skein_engine::checkpoint::BUCKET_MS;
    progress
        .history
        .iter()
        .map(|p: &Point| {
            let span_ms = (progress.at_ms - p.t).clamp(1000, bucket);
            SeriesPoint {
                t: p.t,
                events_per_s: p.events as f64 * 1000.0 / span_ms as f64,
                lag: p.lag,
                members: p.members,
                epoch_ms: if p.epochs > 0 {
                    p.epoch_ms / f64::from(p.epochs)
                } else {
                    0.0
                },
            }
        })
        .collect()
}

/// The pieces of a page that need more than the store.
pub struct Live {
    pub plan: Result<std::sync::Arc<QueryPlan>, String>,
    pub partitions: Result<Vec<PartitionStatus>, String>,
    pub schedule: Option<String>,
}

/// One query's page.
pub fn detail(found: &Found, records: &Records, live: Live, now_ms: i64) -> Detail {
    let summary = summary(found, records, live.schedule.as_deref(), now_ms);
    let progress = records
        .commit
        .as_ref()
        .map(|c| c.progress.clone())
        .unwrap_or_default();
    let mut set_aside = Tally::default();
    let mut reasons: Vec<Reason> = vec![];
    for (_, r) in &records.members {
        set_aside.dead_letters += r.counts.dead_letters;
        set_aside.late_rows += r.counts.late_rows;
        set_aside.sink_errors += r.counts.sink_errors;
        if let Some(f) = &r.figures {
            reasons.extend(f.reasons.iter().cloned());
        }
    }
    reasons.sort_by_key(|r| std::cmp::Reverse(r.at_ms));
    reasons.truncate(10);
    let (plan, plan_error) = match live.plan {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(e)),
    };
    let (partitions, partitions_error) = match live.partitions {
        Ok(p) => (p, None),
        Err(e) => (vec![], Some(e)),
    };
    let mut checkpoints = progress.checkpoints.clone();
    checkpoints.reverse();
    Detail {
        sql: found.sql.as_ref().map(|(s, _)| s.clone()),
        explain: plan.as_ref().map(|p| p.explain()),
        // The boxes list the members of each group's size now.
        graph: plan.as_ref().map(|p| {
            let now = p
                .with_layout(&records.layout)
                .unwrap_or_else(|_| p.as_ref().clone());
            crate::graph::graph(&now, &records.members, now_ms)
        }),
        // Lambda: the schedule; local: the process (stop only).
        controls: found.spec.is_some() || (found.backend == Backend::Local && found.pid.is_some()),
        schedule: live.schedule,
        partitions,
        partitions_error,
        checkpoints,
        set_aside,
        reasons,
        series: series(&progress),
        totals: progress.totals,
        state_bytes: records.summary.state_bytes,
        functions: found.functions.clone(),
        plan_error,
        summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_title_skips_declarations_and_comments() {
        let sql = "-- hot items\nCREATE EXTERNAL TABLE bid STORED AS KAFKA LOCATION 'b';\n\
                   -- the query\nINSERT INTO out\nSELECT count(*) FROM bid;";
        assert_eq!(title(sql), "INSERT INTO out SELECT count(*) FROM bid");
    }

    fn found(backend: Backend, pid: Option<u32>) -> Found {
        Found {
            backend,
            code: "q1".into(),
            store: None,
            location: String::new(),
            sql: None,
            name: None,
            pid,
            spec: None,
            functions: vec![],
        }
    }

    #[test]
    fn states_from_the_process_the_schedule_and_the_last_failure() {
        use skein_engine::checkpoint::{Commit, CommitRecord, Failure};
        let committed_at = |at_ms| {
            let mut progress = Progress::default();
            progress.at_ms = at_ms;
            CommitRecord {
                commit: Commit {
                    epoch: 3,
                    last: false,
                },
                progress,
            }
        };
        let mut records = Records {
            commit: Some(committed_at(1_000)),
            failure: Some(Failure {
                at_ms: 2_000,
                epoch: 4,
                message: "kafka topic t: broker down".into(),
            }),
            ..Default::default()
        };
        let local = found(Backend::Local, None);
        assert_eq!(
            state(&local, &records, None),
            (
                "failing".to_string(),
                Some("epoch 4: kafka topic t: broker down".into())
            )
        );
        let running = found(Backend::Local, Some(42));
        assert_eq!(state(&running, &records, None).0, "running");
        // Committed since: the failure is history.
        records.commit = Some(committed_at(3_000));
        assert_eq!(state(&local, &records, None), ("stopped".into(), None));
        let lambda = found(Backend::Lambda, None);
        assert_eq!(state(&lambda, &records, Some("ENABLED")).0, "running");
        assert_eq!(state(&lambda, &records, Some("DISABLED")).0, "stopped");
        assert_eq!(state(&lambda, &records, None).0, "deployed");
    }

    #[test]
    fn a_query_is_priced_from_what_it_used() {
        let mut totals = Totals::default();
        assert_eq!(usd_per_million(&totals), None);
        totals.events = 1_000_000;
        totals.usage.invocations = 1000;
        let usd = usd_per_million(&totals).unwrap();
        // 1,000 requests at $0.20 per million, and no duration.
        assert!(usd > 0.0 && usd < 0.01, "{usd}");
    }
}
