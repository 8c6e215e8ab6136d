//! The expected result of the YSB query for what was generated.

use std::collections::BTreeMap;
use std::path::Path;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::TimestampMillisecondType;
use datafusion::arrow::record_batch::RecordBatch;

use super::{EVENT_TYPES, WINDOW_MS, YsbCampaigns, YsbEventRef, write_file};
use crate::error::{GeneratorError, Result};

/// View counts per (campaign, window start), the figures the benchmark query must
/// produce. Generators running in parallel each keep one and [`merge`](Self::merge) them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YsbGroundTruth {
    window_ms: i64,
    /// (campaign index, window start ms) -> views.
    views: BTreeMap<(u32, i64), u64>,
}

impl Default for YsbGroundTruth {
    fn default() -> Self {
        Self::new(WINDOW_MS)
    }
}

impl YsbGroundTruth {
    /// Counts in tumbling windows of `window_ms` (the benchmark uses 10 000).
    pub fn new(window_ms: i64) -> Self {
        assert!(window_ms > 0, "window length must be positive");
        YsbGroundTruth {
            window_ms,
            views: BTreeMap::new(),
        }
    }

    pub fn window_ms(&self) -> i64 {
        self.window_ms
    }

    /// The start of the window holding `time_ms`.
    pub fn window_start(&self, time_ms: i64) -> i64 {
        time_ms.div_euclid(self.window_ms) * self.window_ms
    }

    /// Counts `event` if it is a view.
    pub fn record(&mut self, event: &YsbEventRef<'_>) {
        if event.is_view() {
            self.add(event.campaign_index, event.event_time, 1);
        }
    }

    fn add(&mut self, campaign_index: u32, time_ms: i64, views: u64) {
        *self
            .views
            .entry((campaign_index, self.window_start(time_ms)))
            .or_default() += views;
    }

    /// Counts the views of a batch of [`super::ysb_schema`] (e.g. one read back from a
    /// topic); ads not in `campaigns` are an error.
    pub fn record_batch(&mut self, batch: &RecordBatch, campaigns: &YsbCampaigns) -> Result<()> {
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| GeneratorError::Malformed {
                    what: "YSB batch",
                    detail: format!("no column {name}"),
                })
        };
        let wrong_type = |name: &str| GeneratorError::Malformed {
            what: "YSB batch",
            detail: format!("column {name} has an unexpected type"),
        };
        let ad_ids = column("ad_id")?
            .as_string_opt::<i32>()
            .ok_or_else(|| wrong_type("ad_id"))?;
        let event_types = column("event_type")?
            .as_string_opt::<i32>()
            .ok_or_else(|| wrong_type("event_type"))?;
        let times = column("event_time")?
            .as_primitive_opt::<TimestampMillisecondType>()
            .ok_or_else(|| wrong_type("event_time"))?;
        for row in 0..batch.num_rows() {
            if event_types.is_null(row) || event_types.value(row) != EVENT_TYPES[0] {
                continue;
            }
            let ad = ad_ids.value(row);
            let campaign =
                campaigns
                    .campaign_index_of_ad(ad)
                    .ok_or_else(|| GeneratorError::Malformed {
                        what: "YSB batch",
                        detail: format!("unknown ad {ad}"),
                    })?;
            self.add(campaign as u32, times.value(row), 1);
        }
        Ok(())
    }

    /// Adds the counts of another accumulator with the same window length.
    pub fn merge(&mut self, other: &YsbGroundTruth) {
        assert_eq!(
            self.window_ms, other.window_ms,
            "merging different window lengths"
        );
        for (&(campaign, start), &views) in &other.views {
            *self.views.entry((campaign, start)).or_default() += views;
        }
    }

    /// Views of campaign `campaign_index` in the window starting at `window_start_ms`.
    pub fn views(&self, campaign_index: usize, window_start_ms: i64) -> u64 {
        self.views
            .get(&(campaign_index as u32, window_start_ms))
            .copied()
            .unwrap_or(0)
    }

    /// All views counted.
    pub fn total_views(&self) -> u64 {
        self.views.values().sum()
    }

    /// (campaign index, window start ms, views) for every non-empty window, ordered.
    pub fn iter(&self) -> impl Iterator<Item = (usize, i64, u64)> + '_ {
        self.views
            .iter()
            .map(|(&(c, start), &views)| (c as usize, start, views))
    }

    /// Writes `campaign_id,window_start_ms,views` lines, with that header, ordered by
    /// campaign index then window.
    pub fn write_csv(&self, path: &Path, campaigns: &YsbCampaigns) -> Result<()> {
        use std::fmt::Write as _;
        let mut text = String::from("campaign_id,window_start_ms,views\n");
        for (campaign, start, views) in self.iter() {
            let _ = writeln!(
                text,
                "{},{start},{views}",
                campaigns.campaign_ids()[campaign]
            );
        }
        write_file(path, text.as_bytes())
    }
}
