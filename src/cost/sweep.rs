//! What a standing query costs against its epoch interval and checkpoint
//! interval, for `skein cost`: one in-process run per epoch interval, its
//! checkpoint writes counted by kind, and the month priced at each commit
//! cadence on S3 Standard and on S3 Express One Zone.
//!
//! A standing query writes one log entry per source member every epoch if
//! its input is Kinesis (or pushed batches), and only at commits if it is
//! Kafka (between them the entries ride in Kafka's committed offsets); at
//! every commit one object per stateful member and one for the driver (the
//! commit, carrying the decisions up to the next one). A run (over a
//! generator, which logs every epoch) counts the objects of each kind; the
//! steady state at a commit every `k` epochs is then
//! `entries / epochs + (states / commits + 1) / k` per epoch on Kinesis,
//! `(entries / epochs + states / commits + 1) / k` on Kafka, free of the
//! run's first decision and its last commit.

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use skein_cost::{CostReport, Measured, ModelOptions, Prices, estimate};
use skein_engine::checkpoint::PutCounts;
use skein_engine::epochs::STANDING_CHECKPOINT;

use super::report::dollars;

/// One in-process run of the query at one epoch interval.
pub(crate) struct LocalRun {
    /// What it measured; `events` is the whole stream's.
    pub measured: Measured,
    pub epochs: u64,
    pub functions: usize,
    /// Epochs between its commits.
    pub checkpoint_interval: u64,
    /// Its checkpoint writes, by kind.
    pub puts: PutCounts,
    pub query_code: String,
    /// The input the generator stands for.
    pub input: Input,
}

/// The input a priced query reads, which decides where its source members
/// keep their offsets log between commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Input {
    /// Kafka: in the consumer group's committed offsets (no object-store
    /// write), and in the store at commits.
    Kafka,
    /// Kinesis or pushed batches: an object-store write per source member
    /// every epoch.
    Kinesis,
}

/// Epochs a run of `epochs` commits: every `k`-th from the first, and the last.
fn commits(epochs: u64, k: u64) -> u64 {
    let k = k.max(1);
    let at_multiples = epochs.div_ceil(k);
    let last_too = epochs > 0 && !(epochs - 1).is_multiple_of(k);
    at_multiples + u64::from(last_too)
}

impl LocalRun {
    /// Billed milliseconds of all functions per epoch: at one member per
    /// group, an upper bound on what any one member does.
    pub fn busy_ms_per_epoch(&self) -> f64 {
        self.measured.billed_ms as f64 / self.epochs.max(1) as f64
    }

    /// Checkpoint writes per epoch of a standing query committing every `k` epochs.
    pub fn puts_per_epoch(&self, k: u64) -> f64 {
        let epochs = self.epochs.max(1) as f64;
        let commits = commits(self.epochs, self.checkpoint_interval).max(1) as f64;
        let per_commit = self.puts.states as f64 / commits + 1.0;
        let entries = self.puts.entries as f64 / epochs;
        let k = k.max(1) as f64;
        match self.input {
            Input::Kinesis => entries + per_commit / k,
            Input::Kafka => (entries + per_commit) / k,
        }
    }

    /// What the run measured, with the checkpoint writes of the steady
    /// state at a commit every `k` epochs.
    pub fn steady(&self, k: u64) -> Measured {
        let puts = (self.puts_per_epoch(k) * self.epochs as f64).round() as u64;
        Measured {
            checkpoint_puts: puts,
            ..self.measured.clone()
        }
    }
}

/// One row of the sweep.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SweepRow {
    pub interval_s: f64,
    pub checkpoint_interval: u64,
    pub checkpoint_puts_per_epoch: f64,
    /// Lambda arm64, a month, checkpoints on S3 Standard / S3 Express One Zone.
    pub arm64_usd_per_month: f64,
    pub arm64_s3_express_usd_per_month: f64,
    /// The checkpoint store's part of each.
    pub object_store_share: f64,
    pub s3_express_object_store_share: f64,
    pub flink_usd_per_month: f64,
}

/// Commit cadences of the sweep: every epoch, and about every 10 s and 60 s.
fn cadences(interval: Duration) -> Vec<u64> {
    let mut ks = vec![1];
    for every in [STANDING_CHECKPOINT, Duration::from_secs(60)] {
        let k = (every.as_secs_f64() / interval.as_secs_f64())
            .round()
            .max(1.0) as u64;
        if !ks.contains(&k) {
            ks.push(k);
        }
    }
    ks
}

/// Price `run` at each cadence.
pub(crate) fn rows(
    run: &LocalRun,
    interval: Duration,
    prices: &Prices,
    model: &ModelOptions,
) -> Vec<SweepRow> {
    cadences(interval)
        .into_iter()
        .map(|k| {
            let c = estimate(&run.steady(k), prices, model);
            row(&c, interval, k, run.puts_per_epoch(k))
        })
        .collect()
}

fn row(c: &CostReport, interval: Duration, k: u64, puts_per_epoch: f64) -> SweepRow {
    let month = |l: &skein_cost::LambdaCost| l.usd_per_month.unwrap_or_default();
    let share = |l: &skein_cost::LambdaCost| {
        l.object_store_usd_per_million_events / l.usd_per_million_events.max(f64::MIN_POSITIVE)
    };
    let (arm, arm_express) = (&c.lambda[1], &c.lambda_s3_express[1]);
    SweepRow {
        interval_s: interval.as_secs_f64(),
        checkpoint_interval: k,
        checkpoint_puts_per_epoch: puts_per_epoch,
        arm64_usd_per_month: month(arm),
        arm64_s3_express_usd_per_month: month(arm_express),
        object_store_share: share(arm),
        s3_express_object_store_share: share(arm_express),
        flink_usd_per_month: c.flink.usd_per_month.unwrap_or_default(),
    }
}

/// The epoch intervals to sweep: `--sweep-intervals` (`1s,10s,...`),
/// each once.
pub(crate) fn intervals(sweep_intervals: &str) -> Result<Vec<Duration>> {
    let mut out: Vec<Duration> = vec![];
    for part in sweep_intervals
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let d = crate::args::parse_duration(part)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("--sweep-intervals: {part:?}"))?;
        if d.is_zero() {
            anyhow::bail!("--sweep-intervals: {part:?} is not longer than zero");
        }
        if !out.contains(&d) {
            out.push(d);
        }
    }
    Ok(out)
}

/// The sweep as text.
pub(crate) fn table(rows: &[SweepRow]) -> String {
    let mut out = String::from(
        "\nagainst the epoch and checkpoint intervals (Lambda arm64 a month; object-store share of it):\n",
    );
    out.push_str(&format!(
        "{:>7} {:>14} {:>10} {:>18} {:>22} {:>12}\n",
        "epoch", "commit every", "PUT/epoch", "S3", "S3 Express One Zone", "÷ Flink"
    ));
    for r in rows {
        let every = r.interval_s * r.checkpoint_interval as f64;
        out.push_str(&format!(
            "{:>6}s {:>14} {:>10.2} {:>18} {:>22} {:>12}\n",
            trim_float(r.interval_s),
            format!("{} ({}s)", r.checkpoint_interval, trim_float(every)),
            r.checkpoint_puts_per_epoch,
            format!(
                "${} ({:.0}%)",
                dollars(r.arm64_usd_per_month),
                100.0 * r.object_store_share
            ),
            format!(
                "${} ({:.0}%)",
                dollars(r.arm64_s3_express_usd_per_month),
                100.0 * r.s3_express_object_store_share
            ),
            format!(
                "{:.3} / {:.3}",
                r.arm64_usd_per_month / r.flink_usd_per_month,
                r.arm64_s3_express_usd_per_month / r.flink_usd_per_month
            ),
        ));
    }
    out
}

fn trim_float(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_of_a_run() {
        assert_eq!(commits(20, 1), 20);
        assert_eq!(commits(20, 10), 3, "0, 10 and the last, 19");
        assert_eq!(commits(21, 10), 3, "0, 10, 20");
        assert_eq!(commits(1, 10), 1);
    }

    #[test]
    fn steady_state_writes_follow_the_cadence() {
        // 20 epochs, 2 source members, 8 stateful ones, a commit every 10.
        let run = LocalRun {
            measured: Measured::default(),
            epochs: 20,
            functions: 10,
            checkpoint_interval: 10,
            puts: PutCounts {
                entries: 40,
                states: 24,
                driver: 4,
                other: 0,
            },
            query_code: String::new(),
            input: Input::Kinesis,
        };
        assert!((run.puts_per_epoch(10) - (2.0 + 0.9)).abs() < 1e-9);
        assert!((run.puts_per_epoch(1) - 11.0).abs() < 1e-9);
        assert_eq!(run.steady(10).checkpoint_puts, 58);
        // Kafka keeps the entries between commits: only commits write.
        let kafka = LocalRun {
            input: Input::Kafka,
            ..run
        };
        assert!((kafka.puts_per_epoch(10) - 1.1).abs() < 1e-9);
        assert!((kafka.puts_per_epoch(1) - 11.0).abs() < 1e-9);
        assert_eq!(cadences(Duration::from_secs(1)), [1, 10, 60]);
        assert_eq!(cadences(Duration::from_secs(60)), [1]);
    }
}
