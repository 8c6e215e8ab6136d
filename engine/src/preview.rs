//! A preview: a query run in-process on its live tables to see what it
//! produces before it is deployed. It writes no sink (its rows go to an
//! in-memory collector and are handed out as each epoch completes), keeps
//! no checkpoint store (so it commits no offsets and keeps no notes), and
//! reads from where each table's `'startup'` option says, `latest` by
//! default. It ends after a number of rows or seconds, whichever first.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::record_batch::RecordBatch;
use object_store::memory::InMemory;
use serde::Serialize;

use crate::catalog::Catalog;
use crate::changelog;
use crate::dead_letter::rows_as_json;
use crate::driver::run_local_until;
use crate::epochs::{StopAfter, stop_signal};
use crate::error::{EngineError, Result};
use crate::local::LocalRuntime;
use crate::planner::{PlanOptions, QueryPlan, plan_query, session};
use crate::sink::{COLLECT_KIND, CollectSinkFactory, SinkConfig};

/// The option a table kind takes to say where reading starts.
const STARTUP_OPTION: &str = "startup";
/// With `'startup' 'at_timestamp'`: from when, ms since the epoch.
const STARTUP_TIME_OPTION: &str = "startup.timestamp.ms";

/// Where a preview's tables start reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviewStart {
    /// Records produced from now on.
    Latest,
    /// Everything the tables hold.
    Earliest,
    /// Records from this time on (ms since the epoch): Kafka's record
    /// timestamps, Kinesis' arrival times.
    At(i64),
}

impl PreviewStart {
    /// `latest`, `earliest`, ms since the epoch, or a time such as
    /// `2026-11-28T10:00:00Z` (UTC unless it says).
    pub fn parse(s: &str) -> Result<PreviewStart> {
        let s = s.trim();
        match s {
            "latest" => return Ok(PreviewStart::Latest),
            "earliest" => return Ok(PreviewStart::Earliest),
            _ => {}
        }
        if let Ok(ms) = s.parse::<i64>() {
            return Ok(PreviewStart::At(ms));
        }
        datafusion::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos(s)
            .map(|ns| PreviewStart::At(ns.div_euclid(1_000_000)))
            .map_err(|_| {
                EngineError::Context(format!(
                    "from {s:?}: latest, earliest, ms since the epoch, or a time such as \
                     2026-11-28T10:00:00Z"
                ))
            })
    }
}

/// How a preview runs.
#[derive(Debug, Clone)]
pub struct PreviewOptions {
    /// Stop once this many rows came out.
    pub rows: usize,
    /// Stop after this long.
    pub seconds: Duration,
    /// Where tables that take a `'startup'` option start reading, unless
    /// they declare it.
    pub from: PreviewStart,
    /// The time between epochs.
    pub interval: Duration,
    /// Members of each function group.
    pub group_size: usize,
}

impl Default for PreviewOptions {
    fn default() -> Self {
        PreviewOptions {
            rows: 100,
            seconds: Duration::from_secs(30),
            from: PreviewStart::Latest,
            interval: Duration::from_millis(500),
            group_size: 1,
        }
    }
}

/// One row of a preview: its values as displayed, and its kind.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PreviewRow {
    /// `insert` (a row added, or any row of a result that only grows) or
    /// `delete` (a row of an updating result taken back).
    pub op: &'static str,
    /// The row as a JSON object of displayed values.
    pub row: serde_json::Value,
}

/// What a preview hands out as it runs.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PreviewEvent {
    /// The query runs: its first epoch has read, so every table stands
    /// where it starts (a record produced from now on is read). Its
    /// columns, and whether its result updates.
    Started {
        /// The result's columns.
        columns: Vec<String>,
        /// Whether rows may be taken back (an updating result).
        updates: bool,
    },
    /// The rows an epoch produced.
    Rows {
        /// The epoch.
        epoch: u64,
        /// Its rows, retractions first.
        rows: Vec<PreviewRow>,
    },
    /// The preview ended.
    Ended {
        /// Rows handed out.
        rows: usize,
        /// Records the sources read.
        events: u64,
        /// Epochs run.
        epochs: u64,
        /// Why it ended: `rows`, `seconds`, or `gone` (no one watched).
        reason: &'static str,
        /// Invocations the epochs took (a price per event needs them).
        invocations: u64,
        /// Their handler time rounded up to 1 ms, summed.
        billed_ms: u64,
    },
}

/// Plan `sql` and run it as a preview, handing each event to `on_event`,
/// which answers whether anyone still watches (`false` ends the preview
/// after the epoch in flight: the terminal or the page went away).
pub async fn preview(
    catalog: &Catalog,
    sql: &str,
    options: &PreviewOptions,
    mut on_event: impl FnMut(PreviewEvent) -> bool + Send,
) -> Result<()> {
    let collect = CollectSinkFactory::default();
    let mut catalog = catalog.clone();
    catalog.register_sink(COLLECT_KIND, Arc::new(collect.clone()));
    let plan_options = PlanOptions {
        group_size: options.group_size.max(1),
        interval: Some(options.interval),
        ..Default::default()
    };
    let ctx = session(&catalog, plan_options.group_size);
    let mut plan = plan_query(&ctx, sql, &plan_options).await?;
    into_preview(&mut plan, &catalog, options.from);
    let name = plan.sink.location.clone();
    let sink = collect.sink(&name);
    let mut started = Some(PreviewEvent::Started {
        columns: plan
            .output_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
        updates: plan.updates(),
    });
    let runtime = LocalRuntime::new(catalog, Arc::new(InMemory::new()));
    let (handle, signal) = stop_signal();
    let deadline = handle.clone();
    let seconds = options.seconds;
    let timer = tokio::spawn(async move {
        tokio::time::sleep(seconds).await;
        deadline.stop();
    });
    let stop = StopAfter::Signalled {
        interval: options.interval,
        signal: signal.clone(),
    };
    let (mut seen, mut rows, mut failed) = (None, 0usize, None);
    let mut watched = true;
    let report = run_local_until(&plan, &runtime, &plan_options, stop, |_, _| {
        if let Some(event) = started.take() {
            watched &= on_event(event);
        }
        for (epoch, batches) in sink.writes_after(seen) {
            seen = Some(epoch);
            match preview_rows(&batches) {
                Ok(out) if out.is_empty() => {}
                Ok(out) => {
                    rows += out.len();
                    watched &= on_event(PreviewEvent::Rows { epoch, rows: out });
                }
                Err(e) => failed = Some(e),
            }
        }
        if rows >= options.rows || failed.is_some() || !watched {
            handle.stop();
        }
    })
    .await;
    timer.abort();
    let report = report?;
    if let Some(e) = failed {
        return Err(e);
    }
    let _ = on_event(PreviewEvent::Ended {
        rows,
        events: report.events,
        epochs: report.epochs,
        invocations: report.invocations,
        billed_ms: report.billed_ms,
        reason: if rows >= options.rows {
            "rows"
        } else if !watched {
            "gone"
        } else {
            "seconds"
        },
    });
    Ok(())
}

/// `plan` made a preview: its result goes to the collector, and tables that
/// take a `'startup'` option and declare none start at `from`.
fn into_preview(plan: &mut QueryPlan, catalog: &Catalog, from: PreviewStart) {
    plan.sink = SinkConfig::collect(&format!("preview-{}", plan.query_code));
    let (startup, at) = match from {
        PreviewStart::Latest => ("latest", None),
        PreviewStart::Earliest => ("earliest", None),
        PreviewStart::At(ms) => ("at_timestamp", Some(ms)),
    };
    for stage in &mut plan.stages {
        for leaf in &mut stage.sources {
            let takes = catalog.takes_option(&leaf.config.kind, STARTUP_OPTION);
            if takes && !leaf.config.options.contains_key(STARTUP_OPTION) {
                let options = &mut leaf.config.options;
                options.insert(STARTUP_OPTION.into(), startup.into());
                if let Some(ms) = at {
                    options.insert(STARTUP_TIME_OPTION.into(), ms.to_string());
                }
            }
        }
    }
}

/// Batches as a sink wrote them, as preview rows: a changelog's by its op
/// column, any other's all inserts.
fn preview_rows(batches: &[RecordBatch]) -> Result<Vec<PreviewRow>> {
    let mut out = vec![];
    for b in batches.iter().filter(|b| b.num_rows() > 0) {
        let (ops, plain): (Vec<&'static str>, RecordBatch) = if changelog::is_changelog(&b.schema())
        {
            let ops = changelog::ops(b)?
                .iter()
                .map(|o| match o {
                    Some(changelog::RETRACT) => "delete",
                    _ => "insert",
                })
                .collect();
            (ops, changelog::strip(b)?)
        } else {
            (vec!["insert"; b.num_rows()], b.clone())
        };
        for (op, row) in ops.into_iter().zip(rows_as_json(&plain)?) {
            let row = serde_json::from_str(&row)
                .map_err(|e| EngineError::Context(format!("a preview row: {e}")))?;
            out.push(PreviewRow { op, row });
        }
    }
    Ok(out)
}
