//! `STORED AS YSB_REDIS`: YSB's result layout, the one of
//! yahoo/streaming-benchmarks' `CampaignProcessorCommon`, as a sink kind.
//! For each (campaign, window) with `n` new views:
//! * hash `<campaign_id>`: field `<window start ms>` -> window UUID, field
//!   `windows` -> the UUID of the campaign's window list;
//! * `LPUSH <window list UUID> <window start ms>` when the window is new;
//! * hash `<window UUID>`: `HINCRBY seen_count n`, `time_updated` = now (ms).
//!
//! Counts add up, so whole windows and per-epoch deltas (`'emit' 'updates'`)
//! both give the window's total. The layout is a
//! [`RedisLayout`] of the generic Redis sink, whose MULTI/EXEC holds these
//! commands with the member's epoch marker and the offsets they cover: a
//! replayed epoch adds nothing, an outage is waited out, and the shared
//! options (`checkpoint`, `ttl.seconds`, `retry.timeout.ms`) mean what they
//! mean for `STORED AS REDIS`.
//!
//! Rows carry a campaign, a window start and a count: which campaign an ad
//! belongs to is the query's business (a join with a lookup table, see
//! queries/ysb.sql), not the sink's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, TimeUnit, TimestampMillisecondType};
use skein_engine::catalog::{Catalog, TableOptions};
use skein_engine::error::{EngineError, Result as EngineResult};
use skein_engine::sink::{Sink, SinkCapabilities, SinkConfig, SinkFactory, SinkRows, SinkWrite};
use skein_sinks::error::{ConnectorError, Result};
use skein_sinks::redis::{RETRY_OPTION, RedisLayout, RedisSink, RedisSinkOptions};

pub const KIND: &str = "YSB_REDIS";

/// The options of a `STORED AS YSB_REDIS` table: the columns it reads, then
/// the Redis sink's shared ones (`skein_sinks::redis::SHARED_OPTIONS`).
pub const OPTIONS: &[&str] = &[
    "campaign.column",
    "window.column",
    "count.column",
    "ttl.seconds",
    "checkpoint",
    RETRY_OPTION,
];

/// Register the sink kind in the catalog: `CREATE EXTERNAL TABLE ...
/// STORED AS YSB_REDIS` then declares one.
pub fn register_sinks(catalog: &mut Catalog) {
    catalog.register_sink(KIND, Arc::new(YsbSinkFactory));
}

/// YSB's layout: which columns hold the campaign, the window start and the count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YsbLayout {
    /// Option `campaign.column`, default `campaign_id`.
    pub campaign_column: String,
    /// Option `window.column`, default `window_start`.
    pub window_column: String,
    /// Option `count.column`, default `seen_count`.
    pub count_column: String,
}

impl YsbLayout {
    pub fn from_sink_config(config: &SinkConfig) -> Self {
        let opt = |k: &str, default: &str| {
            config
                .options
                .get(k)
                .cloned()
                .unwrap_or_else(|| default.into())
        };
        YsbLayout {
            campaign_column: opt("campaign.column", "campaign_id"),
            window_column: opt("window.column", "window_start"),
            count_column: opt("count.column", "seen_count"),
        }
    }

    /// (campaign, window start ms) -> count, summed over the write's rows.
    fn window_counts(&self, write: &SinkWrite<'_>) -> Result<BTreeMap<(String, i64), i64>> {
        let column = |name: &str| {
            write.schema.index_of(name).map_err(|_| {
                ConnectorError::Config(format!(
                    "the YSB layout needs a column {name:?}; the query gives {:?}",
                    write
                        .schema
                        .fields()
                        .iter()
                        .map(|f| f.name())
                        .collect::<Vec<_>>()
                ))
            })
        };
        let (k, w, c) = (
            column(&self.campaign_column)?,
            column(&self.window_column)?,
            column(&self.count_column)?,
        );
        let mut counts = BTreeMap::new();
        let SinkRows::Append(rows) = &write.rows else {
            return Err(ConnectorError::Config(
                "the YSB_REDIS sink adds counts up and takes no updating result".into(),
            ));
        };
        for batch in rows {
            let keys = cast(batch.column(k), &DataType::Utf8)?;
            let keys = keys.as_string::<i32>();
            let windows = cast(
                batch.column(w),
                &DataType::Timestamp(TimeUnit::Millisecond, None),
            )?;
            let windows = windows.as_primitive::<TimestampMillisecondType>();
            let n = cast(batch.column(c), &DataType::Int64)?;
            let n = n.as_primitive::<Int64Type>();
            for row in 0..batch.num_rows() {
                if keys.is_null(row) || windows.is_null(row) || n.is_null(row) {
                    continue;
                }
                *counts
                    .entry((keys.value(row).to_string(), windows.value(row)))
                    .or_insert(0) += n.value(row);
            }
        }
        Ok(counts)
    }
}

impl RedisLayout for YsbLayout {
    fn add_commands(
        &self,
        write: &SinkWrite<'_>,
        ttl_seconds: Option<i64>,
        pipe: &mut redis::Pipeline,
    ) -> Result<()> {
        let counts = self.window_counts(write)?;
        if counts.is_empty() {
            return Ok(());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or_default();
        // One script for every window: whether a window is new is decided
        // inside EXEC, so members adding to one campaign's window at once
        // list it once, and each adds its own count.
        let script = pipe
            .cmd("EVAL")
            .arg(WINDOWS_SCRIPT)
            .arg(0)
            .arg(now)
            .arg(ttl_seconds.unwrap_or(0));
        for ((campaign, window), n) in &counts {
            let window_ts = window.to_string();
            // UUIDs derived from the names, so a retried write reuses them.
            script
                .arg(campaign)
                .arg(&window_ts)
                .arg(name_uuid(&[campaign.as_bytes(), window_ts.as_bytes()]))
                .arg(name_uuid(&[campaign.as_bytes(), b"windows"]))
                .arg(*n);
        }
        script.ignore();
        Ok(())
    }
}

/// Adds counts to YSB windows. ARGV: now (ms), TTL seconds (0: none), then
/// per window: campaign, window start, UUID and window-list UUID to use if
/// new, count. A window new to its campaign gets its UUID in the campaign's
/// hash and its start pushed on the campaign's window list.
const WINDOWS_SCRIPT: &str = r#"
local now, ttl = ARGV[1], tonumber(ARGV[2])
for i = 3, #ARGV, 5 do
  local campaign, window = ARGV[i], ARGV[i + 1]
  local uuid = redis.call('HGET', campaign, window)
  if not uuid then
    uuid = ARGV[i + 2]
    redis.call('HSET', campaign, window, uuid)
    local list = redis.call('HGET', campaign, 'windows')
    if not list then
      list = ARGV[i + 3]
      redis.call('HSET', campaign, 'windows', list)
    end
    redis.call('LPUSH', list, window)
  end
  redis.call('HINCRBY', uuid, 'seen_count', ARGV[i + 4])
  redis.call('HSET', uuid, 'time_updated', now)
  if ttl > 0 then redis.call('EXPIRE', uuid, ttl) end
end
return 0
"#;

/// A UUID-shaped name derived from `parts` (FNV-1a, two seeds).
fn name_uuid(parts: &[&[u8]]) -> String {
    let hash = |seed: u64| {
        let mut h = seed;
        for p in parts {
            for b in p.iter().chain(b"\x1f") {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    };
    let (a, b) = (hash(0xcbf2_9ce4_8422_2325), hash(0x8422_2325_cbf2_9ce4));
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// Reads a table's options as the sink will, for CREATE TABLE.
pub fn check_config(config: &SinkConfig) -> EngineResult<()> {
    RedisSinkOptions::from_sink_config(config)
        .map(drop)
        .map_err(|e| sink_error(config, e))
}

fn sink_error(config: &SinkConfig, e: ConnectorError) -> EngineError {
    e.for_sink(format!("{KIND} {}", config.location))
}

#[derive(Debug, Default)]
pub struct YsbSinkFactory;

#[async_trait::async_trait]
impl SinkFactory for YsbSinkFactory {
    fn options(&self) -> TableOptions {
        TableOptions::only(OPTIONS)
    }

    /// The Redis sink's machinery: exactly once, offsets under 'checkpoint'.
    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities::EXACTLY_ONCE_WITH_OFFSETS
    }

    async fn committed_offsets(
        &self,
        config: &SinkConfig,
        source: &str,
    ) -> EngineResult<Option<BTreeMap<i32, i64>>> {
        skein_sinks::redis::committed_offsets(config, source).await
    }

    fn check(&self, config: &SinkConfig) -> EngineResult<()> {
        check_config(config)
    }

    fn create(&self, config: &SinkConfig) -> EngineResult<Arc<dyn Sink>> {
        let options =
            RedisSinkOptions::from_sink_config(config).map_err(|e| sink_error(config, e))?;
        let layout = Arc::new(YsbLayout::from_sink_config(config));
        Ok(Arc::new(
            RedisSink::new(options, layout).map_err(|e| sink_error(config, e))?,
        ))
    }
}

#[cfg(test)]
mod tests;
