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
//!
//! **Exactly once.** Every write is one MULTI/EXEC holding the results and
//! the source offsets they cover, stored in the hash `skein:offsets:<checkpoint>`
//! (field `<topic>:<partition>`, value the next offset to read; option
//! `checkpoint`, default `default`). A restarted query resumes its source from
//! [`stored_offsets`]. A write whose offsets are all at or behind the stored
//! ones is a replay and changes nothing, so a re-delivered epoch does not
//! double a count. This needs one writer per checkpoint: the query's last
//! stage must be a single function (`--group-size 1`), and it must emit per
//! epoch (`'emit' 'updates'`), so that the offsets of a write cover exactly
//! the rows it carries.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Int64Type, SchemaRef, TimeUnit, TimestampMillisecondType,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use redis::aio::MultiplexedConnection;
use skein_engine::error::{EngineError, Result as EngineResult};
use skein_engine::payload::SourceOffset;
use skein_engine::sink::{Sink, SinkConfig, SinkFactory, SinkWrite};
use tracing::debug;

use crate::error::{Result, SinkError};

pub const KIND: &str = "REDIS";

/// Replies can take longer than the client's default 500 ms on a loaded
/// machine (a MULTI/EXEC of thousands of commands); a timeout there would
/// fail a write that Redis is about to apply.
fn connection_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_secs(10)))
        .set_response_timeout(Some(std::time::Duration::from_secs(30)))
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
/// Rows carry a campaign (or an ad, mapped to its campaign through the
/// `SET <ad_id> <campaign_id>` keys of `ysb setup`, read once and cached as
/// YSB's RedisAdCampaignCache does), a window start and a count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YsbLayout {
    /// Column with the campaign id; or with the ad id if `ad_lookup`.
    pub key_column: String,
    pub ad_lookup: bool,
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
    "ad.column",
    "window.column",
    "count.column",
    "ttl.seconds",
    "checkpoint",
];

#[derive(Debug, Clone)]
pub struct RedisSinkConfig {
    pub url: String,
    pub layout: Layout,
    pub key_template: String,
    /// Positive: EXPIRE with zero or less deletes the key it was meant to keep.
    pub ttl_seconds: Option<i64>,
    pub checkpoint: String,
}

impl RedisSinkConfig {
    pub fn from_sink_config(config: &SinkConfig) -> Result<Self> {
        let opt = |k: &str| config.options.get(k).cloned();
        let need =
            |k: &str| opt(k).ok_or_else(|| SinkError::Config(format!("option {k:?} is required")));
        let layout = match opt("layout").as_deref().unwrap_or("string") {
            "string" => Layout::String {
                value: need("value")?,
            },
            "hash" => Layout::Hash,
            "list" => Layout::List {
                value: need("value")?,
            },
            "ysb" => {
                let (key_column, ad_lookup) = match (opt("campaign.column"), opt("ad.column")) {
                    (Some(c), None) => (c, false),
                    (None, Some(a)) => (a, true),
                    (None, None) => ("campaign_id".to_string(), false),
                    (Some(_), Some(_)) => {
                        return Err(SinkError::Config(
                            "give campaign.column or ad.column, not both".into(),
                        ));
                    }
                };
                Layout::Ysb(YsbLayout {
                    key_column,
                    ad_lookup,
                    window_column: opt("window.column").unwrap_or_else(|| "window_start".into()),
                    count_column: opt("count.column").unwrap_or_else(|| "seen_count".into()),
                })
            }
            other => {
                return Err(SinkError::Config(format!(
                    "layout {other:?}; known: string, hash, list, ysb"
                )));
            }
        };
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
                        SinkError::Config(format!(
                            "ttl.seconds = {v:?}: give whole seconds from 1 to {}",
                            i64::MAX
                        ))
                    })
            })
            .transpose()?;
        let url = if config.location.starts_with("redis://") {
            config.location.clone()
        } else {
            format!("redis://{}", config.location)
        };
        Ok(RedisSinkConfig {
            url,
            layout,
            key_template,
            ttl_seconds,
            checkpoint: opt("checkpoint").unwrap_or_else(|| "default".into()),
        })
    }
}

/// Reads a table's options as the sink will, for CREATE TABLE.
pub fn check_config(config: &SinkConfig) -> EngineResult<()> {
    RedisSinkConfig::from_sink_config(config)
        .map(drop)
        .map_err(|e| EngineError::Sink {
            sink: format!("redis {}", config.location),
            reason: e.to_string(),
        })
}

pub struct RedisSink {
    config: RedisSinkConfig,
    client: redis::Client,
    connection: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    /// ad -> campaign, loaded at the first write (YSB with `ad.column`).
    campaigns: tokio::sync::OnceCell<HashMap<String, String>>,
}

impl RedisSink {
    pub fn new(config: RedisSinkConfig) -> Result<Self> {
        Ok(RedisSink {
            client: redis::Client::open(config.url.as_str())?,
            config,
            connection: tokio::sync::Mutex::new(None),
            campaigns: tokio::sync::OnceCell::new(),
        })
    }

    async fn connection(&self) -> Result<MultiplexedConnection> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&connection_config())
            .await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn write_inner(&self, write: SinkWrite<'_>) -> Result<()> {
        let mut con = self.connection().await?;
        let okey = offsets_key(&self.config.checkpoint);
        let offsets = latest_offsets(&write.offsets);
        if !offsets.is_empty() {
            let fields: Vec<&String> = offsets.keys().collect();
            let stored: Vec<Option<i64>> = redis::cmd("HMGET")
                .arg(&okey)
                .arg(&fields)
                .query_async(&mut con)
                .await?;
            let advances = offsets
                .values()
                .zip(&stored)
                .any(|(new, old)| old.is_none_or(|old| *new > old));
            if !advances {
                debug!(
                    epoch = write.epoch,
                    "redis sink: replayed epoch, nothing to write"
                );
                return Ok(());
            }
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        match &self.config.layout {
            Layout::Ysb(ysb) => self.ysb_commands(ysb, &write, &mut con, &mut pipe).await?,
            layout => self.generic_commands(layout, &write, &mut pipe)?,
        }
        if !offsets.is_empty() {
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
        }
        let _: () = pipe.query_async(&mut con).await?;
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
                    SinkError::Config(format!("no column {name:?} in the query's output"))
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

    async fn ysb_commands(
        &self,
        ysb: &YsbLayout,
        write: &SinkWrite<'_>,
        con: &mut MultiplexedConnection,
        pipe: &mut redis::Pipeline,
    ) -> Result<()> {
        let counts = self.ysb_counts(ysb, write, con).await?;
        if counts.is_empty() {
            return Ok(());
        }
        // Which windows and window lists exist already (one round trip).
        let mut probe = redis::pipe();
        for (campaign, window) in counts.keys() {
            probe
                .hget(campaign, window.to_string())
                .hget(campaign, "windows");
        }
        let existing: Vec<Option<String>> = probe.query_async(con).await?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or_default();
        let mut new_lists: HashMap<&str, String> = HashMap::new();
        for (((campaign, window), n), known) in counts.iter().zip(existing.chunks(2)) {
            let window_ts = window.to_string();
            // UUIDs derived from the names, so a retried write reuses them.
            let window_uuid = match &known[0] {
                Some(u) => u.clone(),
                None => {
                    let u = name_uuid(&[campaign.as_bytes(), window_ts.as_bytes()]);
                    let list = match (&known[1], new_lists.get(campaign.as_str())) {
                        (Some(l), _) => l.clone(),
                        (None, Some(l)) => l.clone(),
                        (None, None) => {
                            let l = name_uuid(&[campaign.as_bytes(), b"windows"]);
                            pipe.hset(campaign, "windows", &l).ignore();
                            new_lists.insert(campaign, l.clone());
                            l
                        }
                    };
                    pipe.hset(campaign, &window_ts, &u).ignore();
                    pipe.lpush(&list, &window_ts).ignore();
                    u
                }
            };
            pipe.hincr(&window_uuid, "seen_count", *n).ignore();
            pipe.hset(&window_uuid, "time_updated", now.to_string())
                .ignore();
            if let Some(ttl) = self.config.ttl_seconds {
                pipe.expire(&window_uuid, ttl).ignore();
            }
        }
        Ok(())
    }

    /// (campaign, window start ms) -> count, summed over the write's rows.
    async fn ysb_counts(
        &self,
        ysb: &YsbLayout,
        write: &SinkWrite<'_>,
        con: &mut MultiplexedConnection,
    ) -> Result<BTreeMap<(String, i64), i64>> {
        let column = |name: &str| {
            write.schema.index_of(name).map_err(|_| {
                SinkError::Config(format!(
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
        let campaigns = if ysb.ad_lookup {
            Some(
                self.campaigns
                    .get_or_try_init(|| load_ad_campaigns(con.clone()))
                    .await?,
            )
        } else {
            None
        };
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
                let key = keys.value(row);
                let campaign = match campaigns {
                    Some(map) => map.get(key).cloned().ok_or_else(|| {
                        SinkError::Other(format!("ad {key:?} has no campaign in Redis"))
                    })?,
                    None => key.to_string(),
                };
                *counts.entry((campaign, windows.value(row))).or_insert(0) += n.value(row);
            }
        }
        Ok(counts)
    }
}

/// Moves a hash field forward only: `HSET key field max(old, new)`.
const MAX_FIELD_SCRIPT: &str = "local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) \
     if old == nil or tonumber(ARGV[2]) > old then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end \
     return 0";

/// The ad -> campaign map `ysb setup` leaves in Redis, in one command.
async fn load_ad_campaigns(mut con: MultiplexedConnection) -> Result<HashMap<String, String>> {
    let map: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(AD_CAMPAIGN_HASH)
        .query_async(&mut con)
        .await?;
    if map.is_empty() {
        return Err(SinkError::Other(format!(
            "no ad -> campaign mapping in Redis (hash {AD_CAMPAIGN_HASH}); run `skein ysb setup`"
        )));
    }
    Ok(map)
}

/// The hash `ysb setup` fills with ad -> campaign (beside YSB's own
/// `SET <ad> <campaign>` keys), read in one command.
pub const AD_CAMPAIGN_HASH: &str = "ysb:ad_campaign";

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
            let close = rest[open..]
                .find('}')
                .map(|c| open + c)
                .ok_or_else(|| SinkError::Config(format!("key {template:?}: unclosed '{{'")))?;
            if open > 0 {
                parts.push(KeyPart::Text(rest[..open].to_string()));
            }
            let name = &rest[open + 1..close];
            let i = schema
                .index_of(name)
                .map_err(|_| SinkError::Config(format!("key {template:?}: no column {name:?}")))?;
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
        self.write_inner(write)
            .await
            .map_err(|e| EngineError::Sink {
                sink: self.config.url.clone(),
                reason: e.to_string(),
            })
    }
}

#[derive(Debug, Default)]
pub struct RedisSinkFactory;

impl SinkFactory for RedisSinkFactory {
    fn create(&self, config: &SinkConfig) -> EngineResult<Arc<dyn Sink>> {
        let err = |e: SinkError| EngineError::Sink {
            sink: config.location.clone(),
            reason: e.to_string(),
        };
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
    fn latest_offset_wins() {
        let o = |p, off| SourceOffset {
            source: "t".into(),
            partition: p,
            offset: off,
        };
        let m = latest_offsets(&[o(0, 5), o(1, 3), o(0, 9)]);
        assert_eq!(m["t:0"], 9);
        assert_eq!(m["t:1"], 3);
    }
}
