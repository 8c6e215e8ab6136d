//! The report of one run of a query, whichever backend ran it (`skein run`,
//! `skein nexmark`, `skein run --backend lambda`): one typed summary that
//! each driver fills, printed as text or as the one JSON object of `--json`.

use std::collections::BTreeMap;

use anyhow::Result;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use serde::{Deserialize, Serialize};
use skein_cost::CostReport;
use skein_engine::epochs::Stopped;
use skein_engine::sink::Discarded;

/// Reads back from the JSON of `--json` too (`serde_json::from_str`), so a
/// program or test can check a run's figures by name; the result rows are
/// not in the JSON, only their count.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// The NEXMark query number, for `skein nexmark`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query: Option<u32>,
    pub query_code: String,
    pub stages: usize,
    pub functions: usize,
    pub invocations: u64,
    pub payload_bytes: u64,
    pub events: u64,
    pub events_per_s: f64,
    pub result_rows: usize,
    pub verified: Option<bool>,
    pub epochs: u64,
    pub elapsed_s: f64,
    /// Rows that came after their window was emitted; counted in-process only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_rows: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_rows_by_table: Option<BTreeMap<String, u64>>,
    pub checkpoint_dir: Option<String>,
    pub resumed_after: Option<u64>,
    pub stopped: Stopped,
    /// What a BLACKHOLE sink discarded (it keeps no rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blackhole: Option<Discarded>,
    /// What only a run on Lambda has.
    #[serde(flatten)]
    pub lambda: Option<OnLambda>,
    pub cost: CostReport,
    /// The result rows to print in text (JSON has their count).
    #[serde(skip)]
    pub rows: Vec<RecordBatch>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct OnLambda {
    /// Always "lambda".
    pub backend: String,
    pub deploy_s: f64,
    pub spilled_contexts: usize,
    pub dead_letters: usize,
    pub recoveries: u32,
}

impl Report {
    /// Events per second over the elapsed time (0 for no time).
    pub fn rate(events: u64, elapsed_s: f64) -> f64 {
        if elapsed_s > 0.0 {
            events as f64 / elapsed_s
        } else {
            0.0
        }
    }

    /// The JSON object of `--json`, or the text with the first `show` rows.
    pub fn render(&self, json: bool, show: usize) -> Result<String> {
        if json {
            Ok(serde_json::to_string(self)?)
        } else {
            self.text(show)
        }
    }

    fn text(&self, show: usize) -> Result<String> {
        let mut out = match &self.blackhole {
            Some(d) => format!(
                "the BLACKHOLE sink discarded {} rows in {} batches",
                d.rows, d.batches
            ),
            None => pretty_format_batches(&limit_rows(&self.rows, show))?.to_string(),
        };
        let kept: usize = self.rows.iter().map(|b| b.num_rows()).sum();
        let (on, deployed) = match &self.lambda {
            Some(l) => (" on Lambda", format!(" (deployed in {:.2} s)", l.deploy_s)),
            None => ("", String::new()),
        };
        out.push_str(&format!(
            "\n{} result rows (showing {}); {} events in {} epochs, {:.3} s{on}, {:.0} events/s\n\
             {} stages, {} functions{deployed}, {} invocations, {} payload bytes",
            self.result_rows,
            kept.min(show),
            self.events,
            self.epochs,
            self.elapsed_s,
            self.events_per_s,
            self.stages,
            self.functions,
            self.invocations,
            self.payload_bytes,
        ));
        if let Some(late) = self.late_rows {
            out.push_str(&format!(", {late} late rows"));
        }
        match self.verified {
            Some(true) => out.push_str("\nverified: equal to single-process DataFusion"),
            Some(false) => out.push_str("\nverified: DIFFERENT from single-process DataFusion"),
            None => {}
        }
        out.push('\n');
        out.push_str(&crate::cost::report::one_line(&self.cost));
        if self.stopped == Stopped::Signal {
            out.push_str(match self.checkpoint_dir {
                Some(_) => {
                    "\nstopped by a signal: open windows wait in the checkpoint for the next run"
                }
                None => {
                    "\nstopped by a signal: without a checkpoint, the last epoch flushed open windows"
                }
            });
        }
        Ok(out)
    }
}

/// The first `n` rows of `batches`.
pub fn limit_rows(batches: &[RecordBatch], n: usize) -> Vec<RecordBatch> {
    let mut out = vec![];
    let mut left = n;
    for b in batches {
        if left == 0 {
            break;
        }
        let take = b.num_rows().min(left);
        out.push(b.slice(0, take));
        left -= take;
    }
    out
}
