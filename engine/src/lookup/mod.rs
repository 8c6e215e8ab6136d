//! Lookup tables: a `CREATE EXTERNAL TABLE` with a `lookup.key` option is
//! not read as a stream but joined with one. Each batch of the stream asks
//! the table's connector for the keys it has not seen lately (one batched
//! request), through a bounded cache with a TTL, in the stage that reads
//! the stream: the table is never shuffled.
//!
//! The engine knows only the [`Lookup`] trait and the options every lookup
//! table takes; a connector crate registers a [`LookupFactory`] for its kind
//! (`Catalog::register_lookup`), as it registers a source.

pub mod cache;
pub mod exec;
pub mod plan;
pub mod set_aside;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::source::SourceConfig;

/// Names the key column and makes the table a lookup table.
pub const OPT_KEY: &str = "lookup.key";
/// Put before every key asked for (`campaign:` asks `campaign:<key>`).
pub const OPT_KEY_PREFIX: &str = "lookup.key.prefix";
/// Most keys held in the cache (0: no cache).
pub const OPT_CACHE_SIZE: &str = "lookup.cache.size";
/// How long a cached answer (found or not) is used, in ms.
pub const OPT_CACHE_TTL_MS: &str = "lookup.cache.ttl.ms";
/// What a stream row without a match does: `join` or `dead-letter`.
pub const OPT_MISSING: &str = "lookup.missing";
/// The options every lookup table takes, whatever its kind.
pub const LOOKUP_OPTIONS: &[&str] = &[
    OPT_KEY,
    OPT_KEY_PREFIX,
    OPT_CACHE_SIZE,
    OPT_CACHE_TTL_MS,
    OPT_MISSING,
];

/// Keys a lookup cache holds by default.
pub const DEFAULT_CACHE_SIZE: usize = 100_000;
/// How long a cached row lives by default, in ms.
pub const DEFAULT_CACHE_TTL_MS: u64 = 60_000;

/// Stream rows set aside because their key had no match, in this process.
pub static LOOKUP_MISSES_SET_ASIDE: AtomicU64 = AtomicU64::new(0);

/// What a stream row whose key has no match does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MissingPolicy {
    /// What the join says: an inner join drops the row, a left join fills
    /// the table's columns with NULLs.
    Join,
    /// The row leaves the join, whatever its type, for the stream table's
    /// dead-letter destination, with the reason.
    DeadLetter,
}

/// A lookup table's own options, checked at CREATE TABLE.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupOptions {
    /// The key column.
    pub key: String,
    /// Put before each key's text when it is asked for.
    #[serde(default)]
    pub key_prefix: String,
    /// The other columns, in declared order: what the connector fetches.
    pub values: Vec<String>,
    /// Keys the cache holds.
    pub cache_size: usize,
    /// How long a cached row lives, in ms.
    pub cache_ttl_ms: u64,
    /// What a key with no row gives.
    pub missing: MissingPolicy,
}

impl LookupOptions {
    /// Whether the table is declared as a lookup table.
    pub fn declared(config: &SourceConfig) -> bool {
        config.options.contains_key(OPT_KEY)
    }

    /// The lookup options of a table declaration, checked against its schema.
    pub fn from_config(config: &SourceConfig, schema: &SchemaRef) -> Result<Self> {
        let key = config.option(OPT_KEY).unwrap_or_default().to_string();
        let field = schema.field_with_name(&key).map_err(|_| {
            EngineError::plan(format!(
                "{OPT_KEY} = {key:?}: the table has no such column (it has {})",
                column_list(schema)
            ))
        })?;
        if !can_be_key(field.data_type()) {
            return Err(EngineError::plan(format!(
                "{OPT_KEY} = {key:?}: the key column is {}, which cannot be a lookup key \
                 (declare it VARCHAR or an integer type)",
                field.data_type()
            )));
        }
        let values: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| *n != key)
            .collect();
        if values.is_empty() {
            return Err(EngineError::plan(
                "a lookup table needs a value column besides its key",
            ));
        }
        let number = |name: &str, default: u64| -> Result<u64> {
            match config.option(name) {
                None => Ok(default),
                Some(v) => v.trim().parse::<u64>().map_err(|_| {
                    EngineError::plan(format!("{name} = {v:?}: give a whole number from 0"))
                }),
            }
        };
        let missing = match config.option(OPT_MISSING).unwrap_or("join") {
            "join" => MissingPolicy::Join,
            "dead-letter" => MissingPolicy::DeadLetter,
            other => {
                return Err(EngineError::plan(format!(
                    "{OPT_MISSING} = {other:?}: give 'join' or 'dead-letter'"
                )));
            }
        };
        Ok(LookupOptions {
            key,
            key_prefix: config
                .option(OPT_KEY_PREFIX)
                .unwrap_or_default()
                .to_string(),
            values,
            cache_size: number(OPT_CACHE_SIZE, DEFAULT_CACHE_SIZE as u64)? as usize,
            cache_ttl_ms: number(OPT_CACHE_TTL_MS, DEFAULT_CACHE_TTL_MS)?,
            missing,
        })
    }
}

/// Whether values of `t` can be keys: text as it is, integers as their
/// decimal text. Floats (`0.1` has no one text), binary and nested values
/// cannot.
pub fn can_be_key(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, value) => can_be_key(value),
        t => {
            t.is_integer() || matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
        }
    }
}

fn column_list(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One key's values, one per value column (in [`LookupOptions::values`]
/// order); a NULL where the table holds none for that column.
pub type LookupRow = Vec<Option<String>>;

/// Fetches rows of a lookup table by key. Implementations wait out outages
/// of their store (retrying) and fail with a clear error otherwise.
#[async_trait]
pub trait Lookup: Send + Sync + std::fmt::Debug {
    /// The row of each key, in order; `None` where the table has no row.
    async fn get(&self, keys: &[String]) -> Result<Vec<Option<LookupRow>>>;
}

/// Builds the [`Lookup`] of a table kind. One factory per kind.
pub trait LookupFactory: Send + Sync {
    /// The kind's own options (besides [`LOOKUP_OPTIONS`]).
    fn options(&self) -> &'static [&'static str];

    /// The lookup of a table declared as `config`; bad options are errors here.
    fn create(&self, config: &SourceConfig, options: &LookupOptions) -> Result<Arc<dyn Lookup>>;
}
