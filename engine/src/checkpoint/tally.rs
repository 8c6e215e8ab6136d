//! What went wrong since a query started, and what each member measured,
//! kept across instances for `skein status` and `skein ui`: records sent
//! to dead letters, late rows set aside, failed sink writes (the counts),
//! and invocations, their handler times, retries, rows and bytes sent,
//! state bytes and watermark (the figures). Each member keeps its own (its
//! whole life, every instance). A member that writes an object per epoch
//! it checkpoints (a source member's log entry, a stateful member's state)
//! carries them in that object's header, at no extra request; any other
//! member writes them alone as `tally/<stage>-<member>.json`: at once when
//! a count changes, and figures alone at most every [`FIGURES_EVERY`], so
//! an epoch that counts nothing costs no request. A replayed epoch counts
//! again: these are counts of events seen, not of results.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{CheckpointStore, Kind, StateKind};
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

    /// Each count the larger of the two.
    fn max(&mut self, other: &Tally) {
        self.dead_letters = self.dead_letters.max(other.dead_letters);
        self.late_rows = self.late_rows.max(other.late_rows);
        self.sink_errors = self.sink_errors.max(other.sink_errors);
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

    /// Every member's record, by (stage, member): per member the newest of
    /// its objects that carries one, or its record written alone (where a
    /// member has both, the larger of each count, both being totals, and
    /// the later figures).
    pub async fn member_records(&self) -> Result<Vec<((u32, u32), MemberRecord)>> {
        let mut by_member: BTreeMap<(u32, u32), MemberRecord> = BTreeMap::new();
        for o in self.backend.list(&self.key(&["tally"])).await? {
            let name = o.key.filename().unwrap_or_default();
            let Some(member) = name.strip_suffix(".json").and_then(parse_member) else {
                continue;
            };
            if let Some(r) = self.get_json::<MemberRecord>(&o.key).await? {
                by_member.entry(member).or_default().merge(r);
            }
        }
        // The newest object of each member directory.
        let mut newest: BTreeMap<(u32, u32), (u64, object_store::path::Path)> = BTreeMap::new();
        for (key, epoch, _) in self.list_epochs(&["members"]).await? {
            let name = key.filename().unwrap_or_default();
            let (Some(_), Some(member)) = (StateKind::of_name(name), member_of(&key)) else {
                continue;
            };
            if newest.get(&member).is_none_or(|(e, _)| epoch > *e) {
                newest.insert(member, (epoch, key));
            }
        }
        for (member, (_, key)) in newest {
            let Some(bytes) = self.backend.get(&key).await? else {
                continue;
            };
            if let Some(r) = super::member::decode(&key, bytes)?.tally {
                by_member.entry(member).or_default().merge(r);
            }
        }
        Ok(by_member.into_iter().collect())
    }
}

impl MemberRecord {
    /// Take `other`, another record of the same member: each count the
    /// larger, the later figures.
    fn merge(&mut self, other: MemberRecord) {
        self.counts.max(&other.counts);
        let later = match (&self.figures, &other.figures) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(a), Some(b)) => b.at_ms > a.at_ms,
        };
        if later {
            self.figures = other.figures;
        }
    }
}

/// `<stage>-<member>` as numbers.
fn parse_member(name: &str) -> Option<(u32, u32)> {
    let (stage, member) = name.split_once('-')?;
    Some((stage.parse().ok()?, member.parse().ok()?))
}

/// The (stage, member) of a member object's key (its directory).
fn member_of(key: &object_store::path::Path) -> Option<(u32, u32)> {
    let parts: Vec<_> = key.parts().collect();
    let dir = parts.len().checked_sub(2).and_then(|i| parts.get(i))?;
    parse_member(dir.as_ref())
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
    /// What the store held when this instance first wrote (or what the
    /// object a cold instance started from carried); `None` until then.
    before: Option<MemberRecord>,
    /// `here` when last written.
    written: Tally,
    /// `live.changes` when last written.
    written_changes: u64,
    /// When it last wrote, with the totals then (for rates).
    written_at: Option<(Instant, u64, u64)>,
}

impl Counts {
    /// The member's record now: what came before and what this instance
    /// counted and measured; taken as written.
    fn record(&mut self, before: MemberRecord) -> MemberRecord {
        let mut counts = before.counts;
        counts.add(&self.here);
        let earlier = before.figures.clone().unwrap_or_default();
        let rows = earlier.rows_out + self.live.rows_out;
        let bytes = earlier.bytes_out + self.live.bytes_out;
        let (rows_per_s, bytes_per_s) = match self.written_at {
            Some((at, r, b)) if at.elapsed() > Duration::ZERO => {
                let s = at.elapsed().as_secs_f64();
                ((rows - r) as f64 / s, (bytes - b) as f64 / s)
            }
            _ => (0.0, 0.0),
        };
        let figures = MemberFigures {
            at_ms: now_ms(),
            epoch: self.live.epoch.or(earlier.epoch),
            invocations: earlier.invocations + self.live.invocations,
            retries: earlier.retries + self.live.retries,
            rows_out: rows,
            bytes_out: bytes,
            rows_per_s,
            bytes_per_s,
            state_bytes: self.live.state_bytes,
            watermark_ms: self.live.watermark_ms.or(earlier.watermark_ms),
            durations_ms: self.live.durations_ms.iter().copied().collect(),
            reasons: latest_reasons(&earlier.reasons, &self.live.reasons),
        };
        self.before = Some(before);
        self.written = self.here;
        self.written_changes = self.live.changes;
        self.written_at = Some((Instant::now(), rows, bytes));
        MemberRecord {
            counts,
            figures: Some(figures),
        }
    }
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

    /// What earlier instances of the member counted and measured, as a
    /// cold instance read it from the object it started from; ignored
    /// once set.
    pub fn counted_before(&self, before: Option<MemberRecord>) {
        let mut c = self.counts.lock().expect("tally");
        if c.before.is_none() {
            c.before = Some(before.unwrap_or_default());
        }
    }

    /// The member's record to carry in the object it is about to write
    /// (every object carries it, so the newest holds the totals and the
    /// latest figures); none while nothing was counted or measured.
    pub fn carry(&self) -> Option<MemberRecord> {
        let mut c = self.counts.lock().expect("tally");
        let before = c.before.clone().unwrap_or_default();
        if c.here == Tally::default() && c.live.changes == 0 && before == MemberRecord::default() {
            return None;
        }
        Some(c.record(before))
    }

    /// Write the member's record alone (a member that writes no objects of
    /// its own) if its counts changed since the last write, or its figures
    /// did and [`FIGURES_EVERY`] has passed.
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
            None => store
                .get_json::<MemberRecord>(&key)
                .await?
                .unwrap_or_default(),
        };
        let record = self.counts.lock().expect("tally").record(before);
        store.put_json(Kind::Other, &key, &record).await
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

        // A member that writes objects carries its totals in them: its
        // newest one counts, on top of what a cold instance read.
        let source = MemberTally::default();
        source.counted_before(Some(MemberRecord {
            counts: Tally {
                dead_letters: 5,
                ..Default::default()
            },
            figures: None,
        }));
        source.count(|t| t.dead_letters += 1);
        source.measure(|l| l.rows_out += 4);
        let puts = cs.puts();
        for epoch in [7, 8] {
            let object = crate::checkpoint::MemberObject {
                tally: source.carry(),
                ..Default::default()
            };
            cs.put_member(1, 1, epoch, object).await.unwrap();
            source.count(|t| t.dead_letters += 1);
        }
        assert_eq!(
            cs.puts(),
            puts + 2,
            "the counts cost no request of their own"
        );
        assert_eq!(source.carry().map(|r| r.counts.dead_letters), Some(8));
        assert_eq!(cs.tally().await.unwrap().dead_letters, 2 + 7);
        let records = cs.member_records().await.unwrap();
        let (_, carried) = records.iter().find(|(m, _)| *m == (1, 1)).unwrap();
        let figures = carried.figures.as_ref().expect("figures ride along");
        assert_eq!(figures.rows_out, 4);
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
