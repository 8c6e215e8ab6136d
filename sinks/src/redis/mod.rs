//! The Redis sink: `CREATE EXTERNAL TABLE t (...) STORED AS REDIS LOCATION
//! 'redis://host:port' OPTIONS (...)`, then `INSERT INTO t SELECT ...`.
//!
//! What a write's rows become is its [`RedisLayout`]'s business (see
//! [`layout`]: `string`, `hash` and `list` here, YSB's campaign
//! windows in `skein-ysb` as `STORED AS YSB_REDIS`); what makes it exactly
//! once is this sink's, whatever the layout. The options every layout shares
//! ([`SHARED_OPTIONS`]): `ttl.seconds` sets an expiry on every key written;
//! `retry.timeout.ms` (default 2 minutes) is how long a write waits out a
//! Redis outage, retrying (see [`skein_clients::redis`]); `checkpoint` names the
//! markers and offsets below.
//!
//! **Exactly once, at any group size.** Every write is one MULTI/EXEC holding
//! its commands and the member's epoch marker, `HSET skein:epochs:<name>
//! <run>/<member> <epoch>`, where `<name>` is the `checkpoint` option or, without
//! it, the query. A write at or below its member's marker is a replay and
//! changes nothing (see [`crate::epoch_markers`]); a member reads its marker once,
//! at its first write, since it is the only writer of its field.
//!
//! The same MULTI/EXEC also stores the source offsets a write covers in the
//! hash `skein:offsets:<checkpoint>` (field `<topic>:<partition>`, value the
//! next offset to read; `checkpoint` defaults to `default` there), from which
//! a query with `'startup' 'checkpoint'` resumes ([`stored_offsets`]). They
//! decide no replay.

pub mod layout;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use skein_engine::catalog::TableOptions;
use skein_engine::error::Result as EngineResult;
use skein_engine::payload::SourceOffset;
use skein_engine::sink::{Sink, SinkCapabilities, SinkConfig, SinkFactory, SinkWrite};
use skein_engine::table_options::EMIT_OPTION;
use tracing::debug;

use crate::epoch_markers::{Runs, is_replay, marker_field, marker_name};
use crate::error::{ConnectorError, Result};
pub use layout::{KeyedLayout, Layout, RedisLayout};
pub use skein_clients::redis::KIND;
pub use skein_clients::redis::{REDIS_WAIT, RETRY_OPTION};
use skein_clients::redis::{RedisConnection, connection_config, retry_timeout, url_of};

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

/// The options of every Redis sink, whatever its layout, read by
/// [`RedisSinkOptions::from_sink_config`].
pub const SHARED_OPTIONS: &[&str] = &["ttl.seconds", "checkpoint", RETRY_OPTION];

/// The options of a `STORED AS REDIS` table: its layout's and the shared ones.
pub const OPTIONS: &[&str] = &[
    "layout",
    "key",
    "value",
    "ttl.seconds",
    "checkpoint",
    RETRY_OPTION,
];

/// Where and how a Redis sink writes, whatever its layout.
#[derive(Debug, Clone)]
pub struct RedisSinkOptions {
    pub url: String,
    /// Positive: EXPIRE with zero or less deletes the key it was meant to keep.
    pub ttl_seconds: Option<i64>,
    /// Names the epoch markers and the stored offsets (option `checkpoint`).
    pub checkpoint: Option<String>,
    /// How long a write waits for Redis to come back (option
    /// `retry.timeout.ms`, default 2 minutes like the Kafka source's wait
    /// for its broker).
    pub retry_timeout: Duration,
    /// The table set `retry.timeout.ms`: a bounded run waits it out past
    /// its bound.
    pub retry_timeout_set: bool,
}

impl RedisSinkOptions {
    pub fn from_sink_config(config: &SinkConfig) -> Result<Self> {
        let opt = |k: &str| config.options.get(k).cloned();
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
        Ok(RedisSinkOptions {
            url: url_of(&config.location),
            ttl_seconds,
            checkpoint: opt("checkpoint").filter(|c| !c.is_empty()),
            retry_timeout: retry_timeout(opt(RETRY_OPTION).as_deref())?,
            retry_timeout_set: config.options.contains_key(RETRY_OPTION),
        })
    }
}

/// The offsets of `source` a Redis sink declared as `config` (whatever its
/// layout) committed, when it keeps them (`'checkpoint'`).
pub async fn committed_offsets(
    config: &SinkConfig,
    source: &str,
) -> EngineResult<Option<BTreeMap<i32, i64>>> {
    let err = |e: ConnectorError| e.for_sink(format!("redis {}", config.location));
    let options = RedisSinkOptions::from_sink_config(config).map_err(err)?;
    let Some(checkpoint) = &options.checkpoint else {
        return Ok(None);
    };
    stored_offsets(&options.url, checkpoint, source)
        .await
        .map(Some)
        .map_err(err)
}

/// Reads a table's options as the sink will, for CREATE TABLE.
pub fn check_config(config: &SinkConfig) -> EngineResult<()> {
    RedisSinkOptions::from_sink_config(config)
        .and_then(|_| KeyedLayout::from_sink_config(config))
        .map(drop)
        .map_err(|e| e.for_sink(format!("redis {}", config.location)))
}

pub struct RedisSink {
    config: RedisSinkOptions,
    layout: Arc<dyn RedisLayout>,
    redis: RedisConnection,
    runs: Runs,
    /// (run, member) -> the member's marker as last read or written; absent
    /// while unknown (before the first write, or after a write that failed
    /// and may or may not have been applied).
    markers: tokio::sync::Mutex<HashMap<(String, u32), Option<u64>>>,
}

impl RedisSink {
    /// A sink writing `layout`'s commands, exactly once.
    pub fn new(config: RedisSinkOptions, layout: Arc<dyn RedisLayout>) -> Result<Self> {
        Ok(RedisSink {
            redis: RedisConnection::open(&config.url, config.retry_timeout)?
                .with_own_wait(config.retry_timeout_set),
            config,
            layout,
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
        if offsets.is_empty() && write.rows.is_empty() {
            // Nothing to make atomic: a replay of it writes nothing either.
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        self.layout
            .add_commands(write, self.config.ttl_seconds, &mut pipe)?;
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
}

/// Moves a hash field forward only: `HSET key field max(old, new)`.
const MAX_FIELD_SCRIPT: &str = "local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) \
     if old == nil or tonumber(ARGV[2]) > old then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end \
     return 0";

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

#[async_trait]
impl SinkFactory for RedisSinkFactory {
    /// Its own options, and `emit`, which its layouts read.
    fn options(&self) -> TableOptions {
        TableOptions::only(OPTIONS).and(&[EMIT_OPTION])
    }

    /// Every write is a MULTI/EXEC with its epoch marker and, under
    /// `'checkpoint'`, the offsets it covers.
    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities::EXACTLY_ONCE_WITH_OFFSETS
    }

    async fn committed_offsets(
        &self,
        config: &SinkConfig,
        source: &str,
    ) -> EngineResult<Option<BTreeMap<i32, i64>>> {
        committed_offsets(config, source).await
    }

    fn check(&self, config: &SinkConfig) -> EngineResult<()> {
        check_config(config)
    }

    fn create(&self, config: &SinkConfig) -> EngineResult<Arc<dyn Sink>> {
        let err = |e: ConnectorError| e.for_sink(format!("redis {}", config.location));
        let options = RedisSinkOptions::from_sink_config(config).map_err(err)?;
        let layout = KeyedLayout::from_sink_config(config).map_err(err)?;
        Ok(Arc::new(
            RedisSink::new(options, Arc::new(layout)).map_err(err)?,
        ))
    }

    fn takes_updates(&self, config: &SinkConfig) -> std::result::Result<(), String> {
        KeyedLayout::from_sink_config(config)
            .map_err(|e| e.to_string())?
            .takes_updates()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let ttl = |v: &str| RedisSinkOptions::from_sink_config(&config(v)).map(|c| c.ttl_seconds);
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
    fn retry_option() {
        let config = |opts: &[(&str, &str)]| {
            RedisSinkOptions::from_sink_config(&SinkConfig {
                kind: KIND.into(),
                location: "redis://127.0.0.1:1".into(),
                options: opts
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            })
        };
        assert_eq!(config(&[]).unwrap().retry_timeout, REDIS_WAIT);
        let c = config(&[("retry.timeout.ms", "500")]).unwrap();
        assert_eq!(c.retry_timeout, Duration::from_millis(500));
        assert!(config(&[("retry.timeout.ms", "soon")]).is_err());
        for shared in SHARED_OPTIONS {
            assert!(OPTIONS.contains(shared), "{shared}");
        }
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
