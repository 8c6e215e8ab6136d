//! What went wrong since a query started, and what each member measured,
//! kept across instances for `skein status` and `skein ui`: records sent
//! to dead letters, late rows set aside, failed sink writes (the counts),
//! and invocations, their handler times, retries, rows and bytes sent,
//! state bytes and watermark (the figures). Each member keeps its own and
//! writes them as `tally/<stage>-<member>.json`: at once when a count
//! changes, and figures alone at most every [`FIGURES_EVERY`], so an epoch
//! that counts nothing costs no request. A replayed epoch counts again:
//! these are counts of events seen, not of results.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

use super::{CheckpointStore, get_json};
use crate::error::Result;

/// How often a member writes figures that changed while its counts did not.
pub const FIGURES_EVERY: Duration = Duration::from_secs(5);

/// Handler times kept per member, the latest (for p50 and p99).
const DURATIONS_KEPT: usize = 64;

/// Reasons kept per member, the latest.
const REASONS_KEPT: usize = 5;

/// Counts of one member, or summed over a query's members.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Undecodable records the sources set aside.
    pub dead_letters: u64,
    /// Rows that arrived after their window was emitted.
    pub late_rows: u64,
    /// Sink writes that failed.
    pub sink_errors: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.dead_letters += other.dead_letters;
        self.late_rows += other.late_rows;
        self.sink_errors += other.sink_errors;
    }
}

/// What a member measured, as of its last write. Totals are since the
/// query started (every instance of the member); the rest is the latest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberFigures {
    /// When written, Unix ms.
    pub at_ms: i64,
    /// The last epoch it ran.
    pub epoch: Option<u64>,
    /// Invocations served.
    pub invocations: u64,
    /// Throttled invocations it sent again.
    pub retries: u64,
    /// Rows it sent on (or wrote to the sink).
    pub rows_out: u64,
    /// Payload bytes it sent to the next stage.
    pub bytes_out: u64,
    /// Rows per second sent between its last two writes.
    pub rows_per_s: f64,
    /// Payload bytes per second sent between its last two writes.
    pub bytes_per_s: f64,
    /// Bytes of the rows it holds across epochs.
    pub state_bytes: u64,
    /// Its watermark (event time, Unix ms).
    pub watermark_ms: Option<i64>,
    /// Handler times of its latest invocations, ms.
    pub durations_ms: Vec<f64>,
    /// The latest reasons rows were set aside or writes failed.
    pub reasons: Vec<Reason>,
}

/// Why rows were set aside or a write failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    /// When, Unix ms.
    pub at_ms: i64,
    /// `late`, `dead letter` or `sink error`.
    pub kind: String,
    /// The table (or sink) concerned.
    pub table: String,
    /// What happened.
    pub text: String,
}

/// One member's object: its counts and its figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Dead letters, late rows and sink errors since the query started.
    #[serde(flatten)]
    pub counts: Tally,
    /// What it measured; none from a member that has not written them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<MemberFigures>,
}

/// What one instance measures between writes.
#[derive(Debug, Default)]
pub struct Live {
    /// Invocations served by this instance.
    pub invocations: u64,
    /// Throttled invocations it sent again.
    pub retries: u64,
    /// Rows it sent on.
    pub rows_out: u64,
    /// Payload bytes it sent.
    pub bytes_out: u64,
    /// Bytes of the rows it holds now.
    pub state_bytes: u64,
    /// Its watermark now.
    pub watermark_ms: Option<i64>,
    /// The last epoch it ran.
    pub epoch: Option<u64>,
    durations_ms: VecDeque<f64>,
    reasons: VecDeque<Reason>,
    /// Bumped by every change, so a write knows whether it has news.
    changes: u64,
}

impl Live {
    /// One invocation served, taking `took`.
    pub fn invocation(&mut self, took: Duration) {
        self.invocations += 1;
        if self.durations_ms.len() == DURATIONS_KEPT {
            self.durations_ms.pop_front();
        }
        // Tenths of a ms are enough and keep the object small.
        self.durations_ms
            .push_back((took.as_secs_f64() * 10_000.0).round() / 10.0);
    }

    /// A reason rows were set aside or a write failed.
    pub fn reason(&mut self, kind: &str, table: &str, text: impl Into<String>) {
        if self.reasons.len() == REASONS_KEPT {
            self.reasons.pop_front();
        }
        self.reasons.push_back(Reason {
            at_ms: now_ms(),
            kind: kind.to_string(),
            table: table.to_string(),
            text: text.into(),
        });
    }
}

/// The latest [`REASONS_KEPT`] of `earlier` followed by `here`.
fn latest_reasons(earlier: &[Reason], here: &VecDeque<Reason>) -> Vec<Reason> {
    let all: Vec<Reason> = earlier.iter().chain(here).cloned().collect();
    all[all.len().saturating_sub(REASONS_KEPT)..].to_vec()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl CheckpointStore {
    fn tally_key(&self, stage: u32, member: u32) -> object_store::path::Path {
        let name = format!("{}.json", Self::member_dir(stage, member));
        self.key(&["tally", &name])
    }

    /// The sum of every member's counts.
    pub async fn tally(&self) -> Result<Tally> {
        let mut sum = Tally::default();
        for (_, record) in self.member_records().await? {
            sum.add(&record.counts);
        }
        Ok(sum)
    }

    /// Every member's record, by (stage, member).
    pub async fn member_records(&self) -> Result<Vec<((u32, u32), MemberRecord)>> {
        let objects: Vec<_> = self
            .store
            .list(Some(&self.key(&["tally"])))
            .try_collect()
            .await?;
        let mut out = vec![];
        for o in objects {
            let Some((stage, member)) = o
                .location
                .filename()
                .and_then(|f| f.strip_suffix(".json"))
                .and_then(|f| f.split_once('-'))
                .and_then(|(s, m)| Some((s.parse().ok()?, m.parse().ok()?)))
            else {
                continue;
            };
            if let Some(r) = get_json::<MemberRecord>(&self.store, &o.location).await? {
                out.push(((stage, member), r));
            }
        }
        Ok(out)
    }
}

/// One instance's counts and figures of its member, added to what earlier
/// instances of the member wrote.
#[derive(Debug, Default)]
pub struct MemberTally {
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    /// Counted by this instance.
    here: Tally,
    /// Measured by this instance.
    live: Live,
    /// What the store held when this instance first wrote; `None` until then.
    before: Option<MemberRecord>,
    /// `here` when last written.
    written: Tally,
    /// `live.changes` when last written.
    written_changes: u64,
    /// When it last wrote, with the totals then (for rates).
    written_at: Option<(Instant, u64, u64)>,
}

impl MemberTally {
    /// Add to the counts with `f`.
    pub fn count(&self, f: impl FnOnce(&mut Tally)) {
        f(&mut self.counts.lock().expect("tally").here);
    }

    /// Add to the figures with `f`.
    pub fn measure(&self, f: impl FnOnce(&mut Live)) {
        let mut c = self.counts.lock().expect("tally");
        f(&mut c.live);
        c.live.changes += 1;
    }

    /// Write the member's record if its counts changed since the last
    /// write, or its figures did and [`FIGURES_EVERY`] has passed.
    pub async fn save(&self, store: &CheckpointStore, stage: u32, member: u32) -> Result<()> {
        let before = {
            let c = self.counts.lock().expect("tally");
            let counts_changed = c.here != c.written;
            let figures_due = c.live.changes != c.written_changes
                && c.written_at
                    .is_none_or(|(at, ..)| at.elapsed() >= FIGURES_EVERY);
            if !counts_changed && !figures_due {
                return Ok(());
            }
            c.before.clone()
        };
        let key = store.tally_key(stage, member);
        let before = match before {
            Some(b) => b,
            None => get_json::<MemberRecord>(&store.store, &key)
                .await?
                .unwrap_or_default(),
        };
        let (record, here, changes, rows, bytes) = {
            let c = self.counts.lock().expect("tally");
            let mut counts = before.counts;
            counts.add(&c.here);
            let earlier = before.figures.clone().unwrap_or_default();
            let rows = earlier.rows_out + c.live.rows_out;
            let bytes = earlier.bytes_out + c.live.bytes_out;
            let (rows_per_s, bytes_per_s) = match c.written_at {
                Some((at, r, b)) if at.elapsed() > Duration::ZERO => {
                    let s = at.elapsed().as_secs_f64();
                    ((rows - r) as f64 / s, (bytes - b) as f64 / s)
                }
                _ => (0.0, 0.0),
            };
            let figures = MemberFigures {
                at_ms: now_ms(),
                epoch: c.live.epoch.or(earlier.epoch),
                invocations: earlier.invocations + c.live.invocations,
                retries: earlier.retries + c.live.retries,
                rows_out: rows,
                bytes_out: bytes,
                rows_per_s,
                bytes_per_s,
                state_bytes: c.live.state_bytes,
                watermark_ms: c.live.watermark_ms.or(earlier.watermark_ms),
                durations_ms: c.live.durations_ms.iter().copied().collect(),
                reasons: latest_reasons(&earlier.reasons, &c.live.reasons),
            };
            let record = MemberRecord {
                counts,
                figures: Some(figures),
            };
            (record, c.here, c.live.changes, rows, bytes)
        };
        store.put_json(&key, &record).await?;
        let mut c = self.counts.lock().expect("tally");
        c.before = Some(before);
        c.written = here;
        c.written_changes = changes;
        c.written_at = Some((Instant::now(), rows, bytes));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use object_store::path::Path;

    use super::*;

    #[tokio::test]
    async fn counts_add_up_across_instances_and_unchanged_counts_are_not_written() {
        let store = Arc::new(InMemory::new());
        let cs = CheckpointStore::open(store.clone(), Path::from("q"), "code")
            .await
            .unwrap();
        let first = MemberTally::default();
        first.count(|t| t.dead_letters += 2);
        first.save(&cs, 1, 0).await.unwrap();
        first.count(|t| t.late_rows += 3);
        first.save(&cs, 1, 0).await.unwrap();
        let written = cs.bytes_written();
        first.save(&cs, 1, 0).await.unwrap();
        assert_eq!(cs.bytes_written(), written, "nothing new, nothing written");

        // A recycled instance of the same member goes on from the store.
        let second = MemberTally::default();
        second.count(|t| t.sink_errors += 1);
        second.save(&cs, 1, 0).await.unwrap();
        let other = MemberTally::default();
        other.count(|t| t.late_rows += 10);
        other.save(&cs, 2, 1).await.unwrap();
        assert_eq!(
            cs.tally().await.unwrap(),
            Tally {
                dead_letters: 2,
                late_rows: 13,
                sink_errors: 1
            }
        );
    }

    #[tokio::test]
    async fn figures_ride_with_counts_or_alone_at_most_every_few_seconds() {
        let cs = CheckpointStore::open(Arc::new(InMemory::new()), Path::from("q"), "code")
            .await
            .unwrap();
        let first = MemberTally::default();
        first.measure(|l| {
            l.invocation(std::time::Duration::from_micros(3_040));
            l.rows_out += 5;
            l.bytes_out += 100;
            l.state_bytes = 7;
            l.watermark_ms = Some(9);
            l.reason("late", "bids", "1 row");
        });
        first.save(&cs, 1, 0).await.unwrap();
        let puts = cs.puts();
        first.measure(|l| l.rows_out += 5);
        first.save(&cs, 1, 0).await.unwrap();
        assert_eq!(cs.puts(), puts, "figures alone wait for FIGURES_EVERY");
        first.count(|t| t.late_rows += 1);
        first.save(&cs, 1, 0).await.unwrap();
        assert_eq!(
            cs.puts(),
            puts + 1,
            "a count is written at once, figures with it"
        );
        let records = cs.member_records().await.unwrap();
        let (key, record) = &records[0];
        assert_eq!(*key, (1, 0));
        assert_eq!(record.counts.late_rows, 1);
        let f = record.figures.as_ref().unwrap();
        assert_eq!((f.invocations, f.rows_out, f.bytes_out), (1, 10, 100));
        assert_eq!((f.state_bytes, f.watermark_ms), (7, Some(9)));
        assert_eq!(f.durations_ms, vec![3.0]);
        assert_eq!(f.reasons.len(), 1);

        // A recycled instance goes on from the totals in the store.
        let second = MemberTally::default();
        second.measure(|l| {
            l.invocation(std::time::Duration::from_millis(1));
            l.rows_out += 1;
        });
        second.save(&cs, 1, 0).await.unwrap();
        let records = cs.member_records().await.unwrap();
        let f = records[0].1.figures.clone().unwrap();
        assert_eq!((f.invocations, f.rows_out), (2, 11));
        assert_eq!(f.reasons.len(), 1, "earlier reasons are kept");
        assert_eq!(cs.tally().await.unwrap().late_rows, 1);
    }
}
