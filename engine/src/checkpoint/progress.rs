//! What the driver records with each commit besides the commit itself, for
//! `skein ui`: totals since the store was created, the last hour of
//! events, epochs and lag in [`BUCKET_MS`] buckets, the last
//! [`CHECKPOINTS_KEPT`] checkpoints. It rides in the commit object the
//! driver writes anyway (no request of its own), and carries over from one
//! commit (and one run) to the next. A failed epoch is written apart
//! (`failure.json`), being rare and possibly before any commit.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::Commit;
use crate::usage::Usage;

/// Width of one point of the history, ms.
pub const BUCKET_MS: i64 = 15_000;

/// How far back the history goes, ms.
pub const HISTORY_MS: i64 = 3_600_000;

/// Checkpoints described, the latest.
pub const CHECKPOINTS_KEPT: usize = 20;

/// Epochs the current rate is taken over, the latest.
const RATE_EPOCHS: usize = 10;

/// The commit object: the commit and the progress up to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitRecord {
    /// The commit.
    #[serde(flatten)]
    pub commit: Commit,
    /// What the query did up to it; empty in a store written before.
    #[serde(flatten)]
    pub progress: Progress,
}

/// A query's progress as its driver saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Progress {
    /// When recorded, Unix ms.
    pub at_ms: i64,
    /// Since the store was created.
    pub totals: Totals,
    /// Source records per second over the latest epochs.
    pub events_per_s: f64,
    /// How long the latest epoch took, ms.
    pub epoch_ms: f64,
    /// Records the sources were behind their partitions' ends after the
    /// latest epoch, where they can tell.
    pub lag: Option<u64>,
    /// The lowest watermark the sources sent in the latest epoch, Unix ms.
    pub watermark_ms: Option<i64>,
    /// The last hour, oldest first.
    pub history: Vec<Point>,
    /// The latest checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointFigures>,
    /// (end Unix ms, events) of the latest epochs, for the rate.
    #[serde(skip)]
    recent: VecDeque<(i64, u64)>,
}

/// Everything the query did since its store was created.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    /// Source records, each epoch counted once.
    pub events: u64,
    /// Epochs run.
    pub epochs: u64,
    /// Invocations, handler time, CPU, payload bytes and checkpoint writes
    /// of every function, as far as the driver can see them.
    #[serde(flatten)]
    pub usage: Usage,
}

/// One bucket of the history.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The bucket's start, Unix ms.
    pub t: i64,
    /// Source records in epochs that ended in it.
    pub events: u64,
    /// Epochs that ended in it.
    pub epochs: u32,
    /// Their durations summed, ms.
    pub epoch_ms: f64,
    /// The lag after its last epoch.
    pub lag: Option<u64>,
    /// Members of all function groups after its last epoch (they change
    /// with a rescale).
    #[serde(default)]
    pub members: Option<u32>,
}

/// One checkpoint: the epoch committed and what committing it cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointFigures {
    /// The epoch committed.
    pub epoch: u64,
    /// When, Unix ms.
    pub at_ms: i64,
    /// From firing the epoch to its commit, ms.
    pub duration_ms: f64,
    /// Bytes written to the store since the previous commit.
    pub bytes: u64,
    /// Objects written to the store since the previous commit (requests).
    pub requests: u64,
}

/// The last failed epoch (`failure.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// When, Unix ms.
    pub at_ms: i64,
    /// The epoch that failed.
    pub epoch: u64,
    /// The error.
    pub message: String,
}

/// What one epoch did, as [`Progress::epoch`] takes it.
#[derive(Debug, Clone, Default)]
pub struct EpochFigures {
    /// Source records.
    pub events: u64,
    /// From firing to quiet, ms.
    pub took_ms: f64,
    /// The sources' lag after it.
    pub lag: Option<u64>,
    /// The sources' lowest watermark.
    pub watermark_ms: Option<i64>,
    /// What the functions used in it.
    pub usage: Usage,
    /// Members of all function groups it ran with.
    pub members: Option<u32>,
}

impl Progress {
    /// Take one epoch that ended at `now_ms`.
    pub fn epoch(&mut self, now_ms: i64, e: EpochFigures) {
        self.at_ms = now_ms;
        self.totals.events += e.events;
        self.totals.epochs += 1;
        self.totals.usage.add(&e.usage);
        self.epoch_ms = e.took_ms;
        self.lag = e.lag.or(self.lag);
        self.watermark_ms = e.watermark_ms.or(self.watermark_ms);
        if self.recent.len() == RATE_EPOCHS {
            self.recent.pop_front();
        }
        self.recent.push_back((now_ms, e.events));
        self.events_per_s = rate(&self.recent, e.took_ms);
        let t = now_ms - now_ms.rem_euclid(BUCKET_MS);
        match self.history.last_mut() {
            Some(p) if p.t == t => {
                p.events += e.events;
                p.epochs += 1;
                p.epoch_ms += e.took_ms;
                p.lag = e.lag.or(p.lag);
                p.members = e.members.or(p.members);
            }
            _ => self.history.push(Point {
                t,
                events: e.events,
                epochs: 1,
                epoch_ms: e.took_ms,
                lag: e.lag,
                members: e.members,
            }),
        }
        let oldest = now_ms - HISTORY_MS;
        let stale = self.history.iter().take_while(|p| p.t < oldest).count();
        self.history.drain(..stale);
    }

    /// Take one checkpoint.
    pub fn checkpoint(&mut self, c: CheckpointFigures) {
        self.checkpoints.push(c);
        let over = self.checkpoints.len().saturating_sub(CHECKPOINTS_KEPT);
        self.checkpoints.drain(..over);
    }
}

/// Events per second over the epochs in `recent` (end time, events): from
/// the end of the first to the end of the last, the first's events left
/// out; with one epoch, its events over its duration.
fn rate(recent: &VecDeque<(i64, u64)>, took_ms: f64) -> f64 {
    match (recent.front(), recent.back()) {
        (Some(first), Some(last)) if last.0 > first.0 => {
            let events: u64 = recent.iter().skip(1).map(|(_, e)| e).sum();
            events as f64 * 1000.0 / (last.0 - first.0) as f64
        }
        (_, Some(last)) if took_ms > 0.0 => last.1 as f64 * 1000.0 / took_ms,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_fill_buckets_and_the_history_keeps_one_hour() {
        let mut p = Progress::default();
        let start = 10 * HISTORY_MS;
        for i in 0..10 {
            p.epoch(
                start + i * 1000,
                EpochFigures {
                    events: 100,
                    took_ms: 50.0,
                    lag: Some(10 - i as u64),
                    ..Default::default()
                },
            );
        }
        assert_eq!(p.totals.events, 1000);
        assert_eq!(p.history.len(), 1, "ten 1-s epochs in one 15-s bucket");
        assert_eq!(p.history[0].epochs, 10);
        assert_eq!(p.history[0].lag, Some(1));
        // 900 events between the first and the last epoch's end, in 9 s.
        assert!((p.events_per_s - 100.0).abs() < 1e-9, "{}", p.events_per_s);
        p.epoch(start + HISTORY_MS + 20_000, EpochFigures::default());
        assert_eq!(p.history.len(), 1, "the bucket an hour old is gone");
        for e in 0..30 {
            p.checkpoint(CheckpointFigures {
                epoch: e,
                ..Default::default()
            });
        }
        assert_eq!(p.checkpoints.len(), CHECKPOINTS_KEPT);
        assert_eq!(p.checkpoints[0].epoch, 10);
    }

    #[test]
    fn a_commit_written_before_progress_reads() {
        let record: CommitRecord = serde_json::from_str(r#"{"epoch":4,"last":false}"#).unwrap();
        assert_eq!(record.commit.epoch, 4);
        assert_eq!(record.progress, Progress::default());
        let text = serde_json::to_string(&record).unwrap();
        let back: Commit = serde_json::from_str(&text).unwrap();
        assert_eq!(back.epoch, 4);
    }
}
