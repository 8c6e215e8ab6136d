//! The Redis sink: `CREATE EXTERNAL TABLE t (...) STORED AS REDIS LOCATION
//! 'redis://host:port' OPTIONS (...)`, then `INSERT INTO t SELECT ...`.
//!
//! Layouts (option `layout`):
//! * `string`: `SET <key> <value column>` per row;
//! * `hash`: `HSET <key> <column> <value>` for every column not in the key;
//! * `list`: `RPUSH <key> <value column>` per row;
//! * `ysb`: the layout of yahoo/streaming-benchmarks' CampaignProcessorCommon
//!   (see [`YsbLayout`]).
//!
//! `key` is a template such as `user:{user_id}` whose `{column}` parts are
//! replaced by the row's values; `value` names the value column of `string`
//! and `list`; `ttl.seconds` sets an expiry on every key written.
//! `retry.timeout.ms` (default 2 minutes) is how long a write waits out a
//! Redis outage, retrying (see [`super::conn`]).
//!
//! **Exactly once, at any group size.** Every write is one MULTI/EXEC holding
//! its commands and the member's epoch marker, `HSET skein:epochs:<name>
//! <run>/<member> <epoch>`, where `<name>` is the `checkpoint` option or, without
//! it, the query. A write at or below its member's marker is a replay and
//! changes nothing (see [`crate::epochs`]); a member reads its marker once,
//! at its first write, since it is the only writer of its field.
//!
//! With `'emit' 'updates'` each epoch carries only its part of a window (a
//! delta): `list` appends it and `ysb` adds it (HINCRBY), but `string` and
//! `hash` would overwrite one delta with the next, so that combination is
//! refused when the sink is declared.
//!
//! The same MULTI/EXEC also stores the source offsets a write covers in the
//! hash `skein:offsets:<checkpoint>` (field `<topic>:<partition>`, value the
//! next offset to read; `checkpoint` defaults to `default` there), from which
//! a query with `'startup' 'checkpoint'` resumes ([`stored_offsets`]). They
//! decide no replay.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Int64Type, SchemaRef, TimeUnit, TimestampMillisecondType,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use redis::aio::MultiplexedConnection;
use skein_engine::error::Result as EngineResult;
use skein_engine::payload::SourceOffset;
use skein_engine::planner::{EMIT_OPTION, EMIT_UPDATES};
use skein_engine::sink::{Sink, SinkConfig, SinkFactory, SinkWrite};
use tracing::debug;

pub use super::conn::REDIS_WAIT;
use super::conn::{RETRY_OPTION, RedisConnection, connection_config, retry_timeout, url_of};
use crate::epochs::{Runs, is_replay, marker_field, marker_name};
use crate::error::{ConnectorError, Result};

pub const KIND: &str = "REDIS";

/// The hash holding the epoch markers kept under `name`.
pub fn epochs_key(name: &str) -> String {
    format!("skein:epochs:{name}")
}

/// The hash holding a checkpoint's offsets.
pub fn offsets_key(checkpoint: &str) -> String {
    format!("skein:offsets:{checkpoint}")
}

/// The offsets stored for `topic` under `checkpoint`: partition -> next offset.
pub async fn stored_offsets(
    url: &str,
    checkpoint: &str,
    topic: &str,
) -> Result<BTreeMap<i32, i64>> {
    let client = redis::Client::open(url)?;
    let mut con = client
        .get_multiplexed_async_connection_with_config(&connection_config())
        .await?;
    let all: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(offsets_key(checkpoint))
        .query_async(&mut con)
        .await?;
    Ok(all
        .into_iter()
        .filter_map(|(field, offset)| {
            let (t, p) = field.rsplit_once(':')?;
            (t == topic).then(|| Some((p.parse().ok()?, offset)))?
        })
        .collect())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    String { value: String },
    Hash,
    List { value: String },
    Ysb(YsbLayout),
}

/// YSB's result layout. For each (campaign, window) with `n` new views:
/// * hash `<campaign_id>`: field `<window start ms>` -> window UUID, field
///   `windows` -> the UUID of the campaign's window list;
/// * `LPUSH <window list UUID> <window start ms>` when the window is new;
/// * hash `<window UUID>`: `HINCRBY seen_count n`, `time_updated` = now (ms).
///
/// Counts add up, so whole windows and per-epoch deltas (`'emit' 'updates'`)
/// both give the window's total; the epoch marker keeps a replayed epoch
/// from adding its counts twice.
///
/// Rows carry a campaign, a window start and a count: which campaign an ad
/// belongs to is the query's business (a join with a lookup table, see
/// queries/ysb.sql), not the sink's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YsbLayout {
    /// Column with the campaign id (option `campaign.column`).
    pub key_column: String,
    pub window_column: String,
    pub count_column: String,
}

/// The options of a `STORED AS REDIS` table, read by
/// [`RedisSinkConfig::from_sink_config`].
pub const OPTIONS: &[&str] = &[
    "layout",
    "key",
    "value",
    "campaign.column",
    "window.column",
    "count.column",
    "ttl.seconds",
    "checkpoint",
    RETRY_OPTION,
];

#[derive(Debug, Clone)]
pub struct RedisSinkConfig {
    pub url: String,
    pub layout: Layout,
    pub key_template: String,
    /// Positive: EXPIRE with zero or less deletes the key it was meant to keep.
    pub ttl_seconds: Option<i64>,
    /// Names the epoch markers and the stored offsets (option `checkpoint`).
    pub checkpoint: Option<String>,
    /// How long a write waits for Redis to come back (option
    /// `retry.timeout.ms`, default 2 minutes like the Kafka source's wait
    /// for its broker).
    pub retry_timeout: Duration,
}

impl RedisSinkConfig {
    pub fn from_sink_config(config: &SinkConfig) -> Result<Self> {
        let opt = |k: &str| config.options.get(k).cloned();
        let need = |k: &str| {
            opt(k).ok_or_else(|| ConnectorError::Config(format!("option {k:?} is required")))
        };
        let layout = match opt("layout").as_deref().unwrap_or("string") {
            "string" => Layout::String {
                value: need("value")?,
            },
            "hash" => Layout::Hash,
            "list" => Layout::List {
                value: need("value")?,
            },
            "ysb" => Layout::Ysb(YsbLayout {
                key_column: opt("campaign.column").unwrap_or_else(|| "campaign_id".into()),
                window_column: opt("window.column").unwrap_or_else(|| "window_start".into()),
                count_column: opt("count.column").unwrap_or_else(|| "seen_count".into()),
            }),
            other => {
                return Err(ConnectorError::Config(format!(
                    "layout {other:?}; known: string, hash, list, ysb"
                )));
            }
        };
        if config.options.get(EMIT_OPTION).map(String::as_str) == Some(EMIT_UPDATES)
            && let Layout::String { .. } | Layout::Hash = layout
        {
            let name = opt("layout").unwrap_or_else(|| "string".into());
            return Err(ConnectorError::Config(format!(
                "layout {name:?} with 'emit' 'updates' would overwrite each epoch's partial result \
                 with the next: use layout 'list' or 'ysb', or drop 'emit' 'updates' to write whole windows"
            )));
        }
        let key_template = match &layout {
            Layout::Ysb(_) => String::new(),
            _ => need("key")?,
        };
        let ttl_seconds = opt("ttl.seconds")
            .map(|v| {
                v.trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|t| *t > 0)
                    .ok_or_else(|| {
                        ConnectorError::Config(format!(
                            "ttl.seconds = {v:?}: give whole seconds from 1 to {}",
                            i64::MAX
                        ))
                    })
            })
            .transpose()?;
        let url = url_of(&config.location);
        Ok(RedisSinkConfig {
            url,
            layout,
            key_template,
            ttl_seconds,
            checkpoint: opt("checkpoint").filter(|c| !c.is_empty()),
            retry_timeout: retry_timeout(opt(RETRY_OPTION).as_deref())?,
        })
    }
}

/// Reads a table's options as the sink will, for CREATE TABLE.
pub fn check_config(config: &SinkConfig) -> EngineResult<()> {
    RedisSinkConfig::from_sink_config(config)
        .map(drop)
        .map_err(|e| e.for_sink(format!("redis {}", config.location)))
}

pub struct RedisSink {
    config: RedisSinkConfig,
    redis: RedisConnection,
    runs: Runs,
    /// (run, member) -> the member's marker as last read or written; absent
    /// while unknown (before the first write, or after a write that failed
    /// and may or may not have been applied).
    markers: tokio::sync::Mutex<HashMap<(String, u32), Option<u64>>>,
}

impl RedisSink {
    pub fn new(config: RedisSinkConfig) -> Result<Self> {
        Ok(RedisSink {
            redis: RedisConnection::open(&config.url, config.retry_timeout)?,
            config,
            runs: Runs::new(),
            markers: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// One write, retried while Redis is away (up to `retry_timeout`). A
    /// retry is safe: a write Redis applied before the connection broke has
    /// moved its member's epoch marker, which the retry reads again, so it
    /// is a replay and is skipped.
    async fn write_retrying(&self, write: &SinkWrite<'_>) -> Result<()> {
        self.redis
            .retrying("redis sink", |con| self.write_inner(write, con))
            .await
    }

    async fn write_inner(
        &self,
        write: &SinkWrite<'_>,
        mut con: MultiplexedConnection,
    ) -> Result<()> {
        let ekey = epochs_key(marker_name(self.config.checkpoint.as_deref(), write));
        let run = self.runs.of(write);
        let field = marker_field(run, write.member);
        let slot = (run.to_string(), write.member);
        // Held for the whole write: a member's writes come one at a time.
        let mut markers = self.markers.lock().await;
        let committed = match markers.get(&slot) {
            Some(known) => *known,
            None => {
                redis::cmd("HGET")
                    .arg(&ekey)
                    .arg(&field)
                    .query_async(&mut con)
                    .await?
            }
        };
        markers.insert(slot.clone(), committed);
        if is_replay(committed, write.epoch) {
            debug!(
                epoch = write.epoch,
                member = write.member,
                "redis sink: replayed epoch, nothing to write"
            );
            return Ok(());
        }
        let okey = offsets_key(self.config.checkpoint.as_deref().unwrap_or("default"));
        let offsets = latest_offsets(&write.offsets);
        if offsets.is_empty() && write.batches.iter().all(|b| b.num_rows() == 0) {
            // Nothing to make atomic: a replay of it writes nothing either.
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        match &self.config.layout {
            Layout::Ysb(ysb) => self.ysb_commands(ysb, write, &mut pipe)?,
            layout => self.generic_commands(layout, write, &mut pipe)?,
        }
        // HSET only moves forward: a partition never goes back.
        for (field, offset) in &offsets {
            pipe.cmd("EVAL")
                .arg(MAX_FIELD_SCRIPT)
                .arg(1)
                .arg(&okey)
                .arg(field)
                .arg(offset)
                .ignore();
        }
        pipe.hset(&ekey, &field, write.epoch).ignore();
        // Unknown until EXEC answers: if it does not, the next attempt reads
        // the marker again rather than trust this one.
        markers.remove(&slot);
        let _: () = pipe.query_async(&mut con).await?;
        markers.insert(slot, Some(write.epoch));
        Ok(())
    }

    fn generic_commands(
        &self,
        layout: &Layout,
        write: &SinkWrite<'_>,
        pipe: &mut redis::Pipeline,
    ) -> Result<()> {
        let template = KeyTemplate::parse(&self.config.key_template, &write.schema)?;
        let options = FormatOptions::default();
        for batch in &write.batches {
            let formatters: Vec<ArrayFormatter<'_>> = batch
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<std::result::Result<_, _>>()?;
            let column = |name: &str| -> Result<usize> {
                write.schema.index_of(name).map_err(|_| {
                    ConnectorError::Config(format!("no column {name:?} in the query's output"))
                })
            };
            for row in 0..batch.num_rows() {
                let key = template.render(&formatters, row);
                match layout {
                    Layout::String { value } => {
                        let v = formatters[column(value)?].value(row).to_string();
                        pipe.set(&key, v).ignore();
                    }
                    Layout::List { value } => {
                        let v = formatters[column(value)?].value(row).to_string();
                        pipe.rpush(&key, v).ignore();
                    }
                    Layout::Hash => {
                        for (i, f) in write.schema.fields().iter().enumerate() {
                            if !template.columns.contains(&i) {
                                pipe.hset(&key, f.name(), formatters[i].value(row).to_string())
                                    .ignore();
                            }
                        }
                    }
                    Layout::Ysb(_) => unreachable!("handled by ysb_commands"),
                }
                if let Some(ttl) = self.config.ttl_seconds {
                    pipe.expire(&key, ttl).ignore();
                }
            }
        }
        Ok(())
    }

    /// Adds the YSB commands of `write` to `pipe`.
    fn ysb_commands(
        &self,
        ysb: &YsbLayout,
        write: &SinkWrite<'_>,
        pipe: &mut redis::Pipeline,
    ) -> Result<()> {
        let counts = ysb_counts(ysb, write)?;
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
            .arg(YSB_WINDOWS_SCRIPT)
            .arg(0)
            .arg(now)
            .arg(self.config.ttl_seconds.unwrap_or(0));
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

/// (campaign, window start ms) -> count, summed over the write's rows.
fn ysb_counts(ysb: &YsbLayout, write: &SinkWrite<'_>) -> Result<WindowCounts> {
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
        column(&ysb.key_column)?,
        column(&ysb.window_column)?,
        column(&ysb.count_column)?,
    );
    let mut counts = BTreeMap::new();
    for batch in &write.batches {
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

/// (key, window start ms) -> count.
type WindowCounts = BTreeMap<(String, i64), i64>;

/// Moves a hash field forward only: `HSET key field max(old, new)`.
const MAX_FIELD_SCRIPT: &str = "local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) \
     if old == nil or tonumber(ARGV[2]) > old then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end \
     return 0";

/// Adds counts to YSB windows. ARGV: now (ms), TTL seconds (0: none), then
/// per window: campaign, window start, UUID and window-list UUID to use if
/// new, count. A window new to its campaign gets its UUID in the campaign's
/// hash and its start pushed on the campaign's window list.
const YSB_WINDOWS_SCRIPT: &str = r#"
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

/// The latest offset per `<topic>:<partition>` field.
fn latest_offsets(offsets: &[SourceOffset]) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for o in offsets {
        let e = out
            .entry(format!("{}:{}", o.source, o.partition))
            .or_insert(o.offset);
        *e = (*e).max(o.offset);
    }
    out
}

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

/// `prefix:{col}:{other}` with the columns resolved against a schema.
struct KeyTemplate {
    parts: Vec<KeyPart>,
    columns: Vec<usize>,
}

enum KeyPart {
    Text(String),
    Column(usize),
}

impl KeyTemplate {
    fn parse(template: &str, schema: &SchemaRef) -> Result<Self> {
        let mut parts = vec![];
        let mut columns = vec![];
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let close = rest[open..].find('}').map(|c| open + c).ok_or_else(|| {
                ConnectorError::Config(format!("key {template:?}: unclosed '{{'"))
            })?;
            if open > 0 {
                parts.push(KeyPart::Text(rest[..open].to_string()));
            }
            let name = &rest[open + 1..close];
            let i = schema.index_of(name).map_err(|_| {
                ConnectorError::Config(format!("key {template:?}: no column {name:?}"))
            })?;
            parts.push(KeyPart::Column(i));
            columns.push(i);
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(KeyPart::Text(rest.to_string()));
        }
        Ok(KeyTemplate { parts, columns })
    }

    fn render(&self, formatters: &[ArrayFormatter<'_>], row: usize) -> String {
        let mut key = String::new();
        for p in &self.parts {
            match p {
                KeyPart::Text(t) => key.push_str(t),
                KeyPart::Column(i) => key.push_str(&formatters[*i].value(row).to_string()),
            }
        }
        key
    }
}

#[async_trait]
impl Sink for RedisSink {
    async fn write(&self, write: SinkWrite<'_>) -> EngineResult<()> {
        self.write_retrying(&write)
            .await
            .map_err(|e| e.for_sink(format!("redis {}", self.config.url)))
    }
}

#[derive(Debug, Default)]
pub struct RedisSinkFactory;

impl SinkFactory for RedisSinkFactory {
    fn create(&self, config: &SinkConfig) -> EngineResult<Arc<dyn Sink>> {
        let err = |e: ConnectorError| e.for_sink(format!("redis {}", config.location));
        let c = RedisSinkConfig::from_sink_config(config).map_err(err)?;
        Ok(Arc::new(RedisSink::new(c).map_err(err)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_uuid_shaped_and_stable() {
        let a = name_uuid(&[b"c1", b"1000"]);
        assert_eq!(a, name_uuid(&[b"c1", b"1000"]));
        assert_ne!(a, name_uuid(&[b"c1", b"2000"]));
        assert_eq!(a.len(), 36);
    }

    #[test]
    fn ttl_must_be_positive_and_fit_expire() {
        let config = |ttl: &str| SinkConfig {
            kind: KIND.into(),
            location: "127.0.0.1:6379".into(),
            options: [("layout", "hash"), ("key", "k:{id}"), ("ttl.seconds", ttl)]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let ttl = |v: &str| RedisSinkConfig::from_sink_config(&config(v)).map(|c| c.ttl_seconds);
        assert_eq!(ttl("60").unwrap(), Some(60));
        assert_eq!(ttl(&i64::MAX.to_string()).unwrap(), Some(i64::MAX));
        // Above i64::MAX it used to wrap to a negative EXPIRE, deleting the keys.
        for bad in [
            "9223372036854775808",
            "18446744073709551615",
            "0",
            "-5",
            "soon",
        ] {
            let err = ttl(bad).unwrap_err().to_string();
            assert!(
                err.contains("ttl.seconds") && err.contains("from 1 to"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn retry_option_and_no_ad_lookup() {
        let config = |opts: &[(&str, &str)]| {
            let mut options: BTreeMap<String, String> = [("layout", "ysb")]
                .iter()
                .chain(opts)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            options.insert("checkpoint".into(), "c".into());
            RedisSinkConfig::from_sink_config(&SinkConfig {
                kind: KIND.into(),
                location: "redis://127.0.0.1:1".into(),
                options,
            })
        };
        let c = config(&[]).unwrap();
        assert_eq!(c.retry_timeout, REDIS_WAIT);
        let Layout::Ysb(ysb) = &c.layout else {
            panic!("ysb layout")
        };
        assert_eq!(ysb.key_column, "campaign_id");
        let c = config(&[("retry.timeout.ms", "500")]).unwrap();
        assert_eq!(c.retry_timeout, Duration::from_millis(500));
        assert!(config(&[("retry.timeout.ms", "soon")]).is_err());
        // Ads map to campaigns in the query (a lookup join), not here.
        assert!(!OPTIONS.contains(&"ad.column"));
    }

    #[test]
    fn latest_offset_wins() {
        let o = |p, off| SourceOffset {
            source: "t".into(),
            partition: p,
            offset: off,
            position: None,
        };
        let m = latest_offsets(&[o(0, 5), o(1, 3), o(0, 9)]);
        assert_eq!(m["t:0"], 9);
        assert_eq!(m["t:1"], 3);
    }
}
