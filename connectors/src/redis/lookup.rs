//! Redis as a lookup table: `CREATE EXTERNAL TABLE t (key VARCHAR, ...)
//! STORED AS REDIS LOCATION 'redis://host:port' OPTIONS ('lookup.key' 'key')`.
//!
//! How a row maps to Redis, by the number of value columns (the columns
//! besides the key):
//! * one: the string at the key (`SET <key> <value>`, as YSB's setup writes
//!   `SET <ad_id> <campaign_id>`), fetched with one `MGET` per batch;
//! * several: the hash at the key, one field per column named as the column
//!   (`HSET <key> <column> <value> ...`), fetched with `HMGET` pipelined; a
//!   missing field is a NULL, a missing hash no row.
//!
//! A key holding another type is an error naming the key and its type. A
//! Redis outage is waited out and retried like the sink's writes
//! ([`super::conn`], option `retry.timeout.ms`).

use std::sync::Arc;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use skein_engine::error::Result as EngineResult;
use skein_engine::lookup::{Lookup, LookupFactory, LookupOptions, LookupRow};
use skein_engine::source::SourceConfig;

use super::conn::{RETRY_OPTION, RedisConnection, is_outage, retry_timeout, url_of};
use crate::error::{ConnectorError, Result};

/// Options of a Redis lookup table besides the engine's `lookup.*`.
pub const OPTIONS: &[&str] = &[RETRY_OPTION];

/// Keys per command (MGET) or per pipeline (HMGET).
const CHUNK: usize = 10_000;

#[derive(Debug, Default)]
pub struct RedisLookupFactory;

impl LookupFactory for RedisLookupFactory {
    fn options(&self) -> &'static [&'static str] {
        OPTIONS
    }

    fn create(
        &self,
        config: &SourceConfig,
        options: &LookupOptions,
    ) -> EngineResult<Arc<dyn Lookup>> {
        let err = |e: ConnectorError| e.for_source(format!("redis {}", config.location));
        let wait = retry_timeout(config.option(RETRY_OPTION)).map_err(err)?;
        let redis = RedisConnection::open(&url_of(&config.location), wait).map_err(err)?;
        Ok(Arc::new(RedisLookup {
            redis,
            values: options.values.clone(),
        }))
    }
}

pub struct RedisLookup {
    redis: RedisConnection,
    /// The value columns: one is a string, several are hash fields.
    values: Vec<String>,
}

impl std::fmt::Debug for RedisLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisLookup({})", self.redis.url)
    }
}

#[async_trait]
impl Lookup for RedisLookup {
    async fn get(&self, keys: &[String]) -> EngineResult<Vec<Option<LookupRow>>> {
        self.redis
            .retrying("redis lookup", |con| self.fetch(con, keys))
            .await
            .map_err(|e| e.for_source(format!("redis {}", self.redis.url)))
    }
}

impl RedisLookup {
    async fn fetch(
        &self,
        mut con: MultiplexedConnection,
        keys: &[String],
    ) -> Result<Vec<Option<LookupRow>>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(CHUNK) {
            if self.values.len() == 1 {
                out.extend(self.strings(&mut con, chunk).await?);
            } else {
                out.extend(self.hashes(&mut con, chunk).await?);
            }
        }
        Ok(out)
    }

    /// One value column: MGET. MGET answers nil for a key of another type,
    /// so the keys it has no string for are asked their TYPE.
    async fn strings(
        &self,
        con: &mut MultiplexedConnection,
        keys: &[String],
    ) -> Result<Vec<Option<LookupRow>>> {
        let found: Vec<Option<String>> = redis::cmd("MGET").arg(keys).query_async(con).await?;
        let absent: Vec<&String> = keys
            .iter()
            .zip(&found)
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k)
            .collect();
        if !absent.is_empty() {
            check_types(con, &absent, "string", "SET <key> <value>").await?;
        }
        Ok(found
            .into_iter()
            .map(|v| v.map(|v| vec![Some(v)]))
            .collect())
    }

    /// Several value columns: HMGET per key, pipelined.
    async fn hashes(
        &self,
        con: &mut MultiplexedConnection,
        keys: &[String],
    ) -> Result<Vec<Option<LookupRow>>> {
        let mut pipe = redis::pipe();
        for k in keys {
            pipe.cmd("HMGET").arg(k).arg(&self.values);
        }
        let found: Vec<Vec<Option<String>>> = match pipe.query_async(con).await {
            Ok(f) => f,
            // WRONGTYPE, most likely: name the key.
            Err(e) if !is_outage(&e) => {
                let all: Vec<&String> = keys.iter().collect();
                check_types(con, &all, "hash", "HSET <key> <column> <value> ...").await?;
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        };
        Ok(found
            .into_iter()
            .map(|fields| fields.iter().any(Option::is_some).then_some(fields))
            .collect())
    }
}

/// Fails naming the first of `keys` that holds something other than
/// `want` (or nothing).
async fn check_types(
    con: &mut MultiplexedConnection,
    keys: &[&String],
    want: &str,
    written_as: &str,
) -> Result<()> {
    let mut pipe = redis::pipe();
    for k in keys {
        pipe.cmd("TYPE").arg(*k);
    }
    let types: Vec<String> = pipe.query_async(con).await?;
    match keys
        .iter()
        .zip(&types)
        .find(|(_, t)| *t != "none" && *t != want)
    {
        Some((k, t)) => Err(ConnectorError::Other(format!(
            "key {k:?} holds a {t}, and this table reads a {want} ({written_as})"
        ))),
        None => Ok(()),
    }
}
