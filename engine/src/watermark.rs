//! Event time: per-partition watermarks at the sources, and how watermarks
//! combine downstream.
//!
//! A source instance keeps, per partition it owns (Kafka partition, Kinesis
//! shard), the largest event time read from it. Its watermark is the
//! minimum over its partitions that are not idle, less the table's allowed
//! lateness: a partition read ahead of the others cannot close windows the
//! others still have rows for. A partition is idle once it is caught up and
//! has had no record for `idle.timeout` (or it has finished for good); idle
//! partitions do not hold windows open, and count again as soon as they
//! have data. When every partition is idle the instance reports itself idle
//! with the furthest watermark it knows.
//!
//! Downstream, a stage's watermark is the minimum over its senders that are
//! not idle ([`WatermarkMin`]); every watermark only moves forward.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, Int64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::source::{PartitionProgress, SourceConfig};

/// The table options of event time, which every source kind takes.
pub use crate::table_options::{
    EVENT_TIME_OPTIONS, OPT_EVENT_TIME, OPT_IDLE_TIMEOUT, OPT_LATE, OPT_LATENESS_MS,
};

/// How long a caught-up partition may go without a record before it stops
/// holding windows open. Long enough that a producer's pause between
/// batches does not count, short enough that a quiet partition delays
/// results by seconds, not minutes.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// What happens to a row that arrives after its window was emitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatePolicy {
    /// Dropped and counted.
    #[default]
    Drop,
    /// Sent to the table's dead-letter destination with reason `late`.
    DeadLetter,
}

/// A table's event-time options, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTimeOptions {
    /// Index of the event-time column in the table's schema.
    pub column: Option<usize>,
    /// How late a row may be, in ms.
    pub lateness_ms: i64,
    /// How long a quiet partition takes to become idle.
    pub idle_timeout: Duration,
    /// What happens to late rows.
    pub late: LatePolicy,
}

impl EventTimeOptions {
    /// Read and check the options; a bad value is an error naming it.
    pub fn from_config(config: &SourceConfig, schema: &SchemaRef) -> Result<Self> {
        let bad = |key: &str, value: &str, want: &str| {
            EngineError::plan(format!(
                "table {}: option '{key}' is {value:?}; {want}",
                config.location
            ))
        };
        let column = match config.option(OPT_EVENT_TIME) {
            Some(c) => Some(
                schema
                    .index_of(c)
                    .map_err(|_| bad(OPT_EVENT_TIME, c, "it must name a column of the table"))?,
            ),
            None => None,
        };
        let lateness_ms = match config.option(OPT_LATENESS_MS) {
            Some(v) => v
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| bad(OPT_LATENESS_MS, v, "expected milliseconds, 0 or more"))?,
            None => 0,
        };
        let idle_timeout = match config.option(OPT_IDLE_TIMEOUT) {
            Some(v) => parse_duration_option(v).ok_or_else(|| {
                bad(
                    OPT_IDLE_TIMEOUT,
                    v,
                    "expected a duration like 500ms, 10s or 2m (a bare number is milliseconds)",
                )
            })?,
            None => DEFAULT_IDLE_TIMEOUT,
        };
        let late = match config.option(OPT_LATE) {
            None | Some("drop") => LatePolicy::Drop,
            Some("dead-letter") => LatePolicy::DeadLetter,
            Some(v) => return Err(bad(OPT_LATE, v, "expected 'drop' or 'dead-letter'")),
        };
        Ok(EventTimeOptions {
            column,
            lateness_ms,
            idle_timeout,
            late,
        })
    }
}

/// `500ms`, `10s`, `2m`, `1h`; a bare number is milliseconds.
pub fn parse_duration_option(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let ms = match unit.trim() {
        "" | "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }?;
    Some(Duration::from_millis(ms))
}

/// A watermark as it travels: its value (`None`: no event time seen yet
/// anywhere upstream) and whether every sender behind it is idle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Watermark {
    /// The watermark in ms since the epoch; `None` before any event time.
    pub value: Option<i64>,
    /// Every sender behind it is idle.
    pub idle: bool,
}

/// A timestamp column as ms since the epoch, whatever its unit.
pub fn times_ms(col: &dyn Array) -> Result<Int64Array> {
    let ts = cast(col, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
    let ms = cast(&ts, &DataType::Int64)?;
    ms.as_any()
        .downcast_ref::<Int64Array>()
        .cloned()
        .ok_or_else(|| EngineError::plan("event time column is not a timestamp"))
}

/// The largest event time, in ms, of a timestamp column.
pub fn max_event_time(col: &dyn Array) -> Result<Option<i64>> {
    Ok(datafusion::arrow::compute::max(&times_ms(col)?))
}

#[derive(Debug, Clone)]
struct PartitionClock {
    max_event_time: Option<i64>,
    /// When the partition last had a record (or was first seen).
    last_record: Instant,
    caught_up: bool,
    finished: bool,
}

impl PartitionClock {
    fn idle(&self, now: Instant, timeout: Duration) -> bool {
        self.finished || (self.caught_up && now.duration_since(self.last_record) >= timeout)
    }
}

/// A [`SourceClock`] as a checkpoint keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockState {
    /// Each partition's clock, by partition.
    pub partitions: BTreeMap<String, SavedPartition>,
    /// The last watermark reported.
    pub reported: Option<i64>,
}

/// One partition's clock, as a checkpoint keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedPartition {
    /// The latest event time seen.
    pub max_event_time: Option<i64>,
    /// It had read up to its end at open.
    pub caught_up: bool,
    /// It reached its end for good.
    pub finished: bool,
}

/// The event-time state of one table at one source instance.
#[derive(Debug, Clone)]
pub struct SourceClock {
    column: usize,
    lateness_ms: i64,
    idle_timeout: Duration,
    partitions: BTreeMap<String, PartitionClock>,
    /// The highest watermark reported: reports never go back.
    reported: Option<i64>,
}

impl SourceClock {
    /// A clock reading event time from `column`.
    pub fn new(column: usize, lateness_ms: i64, idle_timeout: Duration) -> Self {
        SourceClock {
            column,
            lateness_ms,
            idle_timeout,
            partitions: BTreeMap::new(),
            reported: None,
        }
    }

    /// Take in one pull: the event times of each partition's batches and
    /// whether it is caught up.
    pub fn observe(
        &mut self,
        batches: &[RecordBatch],
        progress: &[PartitionProgress],
        now: Instant,
    ) -> Result<()> {
        for p in progress {
            let clock = self
                .partitions
                .entry(p.partition.clone())
                .or_insert_with(|| PartitionClock {
                    max_event_time: None,
                    last_record: now,
                    caught_up: false,
                    finished: false,
                });
            let mut rows = 0;
            for &i in &p.batches {
                let Some(b) = batches.get(i) else { continue };
                rows += b.num_rows();
                if let Some(m) = max_event_time(b.column(self.column).as_ref())? {
                    clock.max_event_time = Some(clock.max_event_time.map_or(m, |x| x.max(m)));
                }
            }
            if rows > 0 {
                clock.last_record = now;
            }
            clock.caught_up = p.caught_up;
            clock.finished = p.finished;
        }
        Ok(())
    }

    /// What a checkpoint keeps of the clock.
    pub fn save(&self) -> ClockState {
        ClockState {
            partitions: self
                .partitions
                .iter()
                .map(|(name, p)| {
                    (
                        name.clone(),
                        SavedPartition {
                            max_event_time: p.max_event_time,
                            caught_up: p.caught_up,
                            finished: p.finished,
                        },
                    )
                })
                .collect(),
            reported: self.reported,
        }
    }

    /// Take back a saved clock; idle timers start again at `now`.
    pub fn restore(&mut self, state: &ClockState, now: Instant) {
        self.partitions = state
            .partitions
            .iter()
            .map(|(name, p)| {
                (
                    name.clone(),
                    PartitionClock {
                        max_event_time: p.max_event_time,
                        last_record: now,
                        caught_up: p.caught_up,
                        finished: p.finished,
                    },
                )
            })
            .collect();
        self.reported = state.reported;
    }

    /// The largest event time read from any partition, lateness aside.
    pub fn newest(&self) -> Option<i64> {
        self.partitions
            .values()
            .filter_map(|p| p.max_event_time)
            .max()
    }

    /// The instance's watermark for this table as of `now`.
    pub fn watermark(&mut self, now: Instant) -> Watermark {
        let lateness = self.lateness_ms;
        let behind = |t: Option<i64>| t.unwrap_or(i64::MIN).saturating_sub(lateness);
        let active: Vec<i64> = self
            .partitions
            .values()
            .filter(|p| !p.idle(now, self.idle_timeout))
            .map(|p| behind(p.max_event_time))
            .collect();
        let (value, idle) = match active.iter().min() {
            // A partition with nothing read yet holds everything back.
            Some(&min) => (Some(min), false),
            // Every partition idle (or none known yet): the furthest point.
            None => (
                self.partitions
                    .values()
                    .filter_map(|p| p.max_event_time)
                    .max()
                    .map(|t| t.saturating_sub(lateness)),
                !self.partitions.is_empty(),
            ),
        };
        let value = match (value, self.reported) {
            (Some(v), Some(r)) => Some(v.max(r)),
            (v, r) => v.or(r),
        };
        self.reported = value;
        Watermark { value, idle }
    }
}

/// Combines the watermarks of several senders (or tables): the minimum over
/// those that are not idle; when all are idle, the furthest of them, and
/// idle. A sender without event time (`value` None, not idle) constrains
/// nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct WatermarkMin {
    active: Option<i64>,
    idle_max: Option<i64>,
    any_active: bool,
    any: bool,
}

impl WatermarkMin {
    /// Take one sender's watermark into account.
    pub fn add(&mut self, w: Watermark) {
        self.any = true;
        if w.idle {
            if let Some(v) = w.value {
                self.idle_max = Some(self.idle_max.map_or(v, |m| m.max(v)));
            }
        } else {
            self.any_active = true;
            if let Some(v) = w.value {
                self.active = Some(self.active.map_or(v, |m| m.min(v)));
            }
        }
    }

    /// The combined watermark.
    pub fn result(&self) -> Watermark {
        if self.any_active {
            Watermark {
                value: self.active,
                idle: false,
            }
        } else {
            Watermark {
                value: self.idle_max,
                idle: self.any,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::TimestampMillisecondArray;
    use datafusion::arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    fn batch(times: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        )]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(TimestampMillisecondArray::from(times.to_vec()))],
        )
        .unwrap()
    }

    fn progress(partition: &str, batches: Vec<usize>, caught_up: bool) -> PartitionProgress {
        PartitionProgress {
            partition: partition.into(),
            batches,
            caught_up,
            drained: caught_up,
            finished: false,
            lag: None,
        }
    }

    #[test]
    fn the_partition_behind_holds_the_watermark() {
        let mut clock = SourceClock::new(0, 100, Duration::from_secs(10));
        let now = Instant::now();
        let batches = [batch(&[5_000, 9_000]), batch(&[2_000])];
        clock
            .observe(
                &batches,
                &[progress("0", vec![0], false), progress("1", vec![1], false)],
                now,
            )
            .unwrap();
        assert_eq!(
            clock.watermark(now),
            Watermark {
                value: Some(1_900),
                idle: false
            }
        );
    }

    #[test]
    fn a_partition_with_nothing_read_yet_holds_everything() {
        let mut clock = SourceClock::new(0, 0, Duration::from_secs(10));
        let now = Instant::now();
        clock
            .observe(
                &[batch(&[5_000])],
                &[progress("0", vec![0], false), progress("1", vec![], false)],
                now,
            )
            .unwrap();
        assert_eq!(clock.watermark(now).value, Some(i64::MIN));
    }

    #[test]
    fn an_idle_partition_stops_holding_and_counts_again_with_data() {
        let timeout = Duration::from_millis(50);
        let mut clock = SourceClock::new(0, 0, timeout);
        let t0 = Instant::now();
        clock
            .observe(
                &[batch(&[9_000]), batch(&[1_000])],
                &[progress("0", vec![0], false), progress("1", vec![1], true)],
                t0,
            )
            .unwrap();
        assert_eq!(clock.watermark(t0).value, Some(1_000));
        let later = t0 + timeout;
        clock
            .observe(
                &[],
                &[progress("0", vec![], false), progress("1", vec![], true)],
                later,
            )
            .unwrap();
        assert_eq!(clock.watermark(later).value, Some(9_000));
        // Partition 1 has data again: it counts, but the watermark never
        // goes back.
        clock
            .observe(
                &[batch(&[12_000]), batch(&[3_000])],
                &[progress("0", vec![0], false), progress("1", vec![1], false)],
                later,
            )
            .unwrap();
        assert_eq!(clock.watermark(later).value, Some(9_000));
    }

    #[test]
    fn all_idle_reports_the_furthest_point_as_idle() {
        let mut clock = SourceClock::new(0, 0, Duration::ZERO);
        let now = Instant::now();
        clock
            .observe(
                &[batch(&[4_000]), batch(&[7_000])],
                &[progress("0", vec![0], true), progress("1", vec![1], true)],
                now,
            )
            .unwrap();
        assert_eq!(
            clock.watermark(now),
            Watermark {
                value: Some(7_000),
                idle: true
            }
        );
    }

    #[test]
    fn the_minimum_skips_idle_senders_unless_all_are() {
        let mut m = WatermarkMin::default();
        m.add(Watermark {
            value: Some(10),
            idle: false,
        });
        m.add(Watermark {
            value: Some(50),
            idle: true,
        });
        m.add(Watermark {
            value: Some(30),
            idle: false,
        });
        m.add(Watermark {
            value: None,
            idle: true,
        });
        assert_eq!(
            m.result(),
            Watermark {
                value: Some(10),
                idle: false
            }
        );
        let mut all_idle = WatermarkMin::default();
        all_idle.add(Watermark {
            value: Some(50),
            idle: true,
        });
        all_idle.add(Watermark {
            value: Some(20),
            idle: true,
        });
        assert_eq!(
            all_idle.result(),
            Watermark {
                value: Some(50),
                idle: true
            }
        );
    }

    #[test]
    fn options_are_checked() {
        let schema: SchemaRef = batch(&[]).schema();
        let config = |pairs: &[(&str, &str)]| SourceConfig {
            kind: "KAFKA".into(),
            location: "ev".into(),
            options: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let ok = EventTimeOptions::from_config(
            &config(&[
                ("event_time", "ts"),
                ("idle.timeout", "1s"),
                ("late", "dead-letter"),
            ]),
            &schema,
        )
        .unwrap();
        assert_eq!(ok.column, Some(0));
        assert_eq!(ok.idle_timeout, Duration::from_secs(1));
        assert_eq!(ok.late, LatePolicy::DeadLetter);
        for (k, v) in [
            ("lateness_ms", "abc"),
            ("lateness_ms", "-5"),
            ("idle.timeout", "soon"),
            ("late", "keep"),
            ("event_time", "nope"),
        ] {
            let err = EventTimeOptions::from_config(&config(&[(k, v)]), &schema)
                .unwrap_err()
                .to_string();
            assert!(err.contains(k) && err.contains(v), "{err}");
        }
    }
}
