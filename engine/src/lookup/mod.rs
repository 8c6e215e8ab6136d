//! Lookup tables: a `CREATE EXTERNAL TABLE` with a `lookup.key` option is
//! not read as a stream but joined with one. Each batch of the stream asks
//! the table's connector for the keys it has not seen lately (one batched
//! request), through a bounded cache with a TTL, in the stage that reads
//! the stream: the table is never shuffled.
//!
//! The engine knows only the [`Lookup`] trait and the options every lookup
//! table takes; a connector crate registers a [`LookupFactory`] for its kind
//! (`SourceRegistry::register_lookup`), as it registers a source.

pub mod cache;
pub mod exec;
pub mod plan;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::source::{SourceConfig, SourceRegistry};

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

impl SourceRegistry {
    /// Tables of `kind` may be declared as lookup tables.
    pub fn register_lookup(&mut self, kind: &str, factory: Arc<dyn LookupFactory>) {
        self.lookups.insert(kind.to_ascii_uppercase(), factory);
    }

    /// The kinds whose tables may be lookup tables.
    pub fn lookup_kinds(&self) -> Vec<String> {
        self.lookups.keys().cloned().collect()
    }

    /// The options and the lookup of a table declared as one; an unknown
    /// option, a bad value or a kind without lookups is an error.
    pub fn create_lookup(
        &self,
        config: &SourceConfig,
        schema: &SchemaRef,
    ) -> Result<(LookupOptions, Arc<dyn Lookup>)> {
        let kind = config.kind.to_ascii_uppercase();
        let Some(factory) = self.lookups.get(&kind) else {
            let kinds: BTreeSet<&String> = self.lookups.keys().collect();
            return Err(EngineError::plan(format!(
                "{kind} tables cannot be lookup tables ({OPT_KEY}); these can: {kinds:?}"
            )));
        };
        let own = factory.options();
        if let Some(unknown) = config
            .options
            .keys()
            .find(|k| !LOOKUP_OPTIONS.contains(&k.as_str()) && !own.contains(&k.as_str()))
        {
            let mut allowed: Vec<&str> = LOOKUP_OPTIONS.iter().chain(own).copied().collect();
            allowed.sort_unstable();
            return Err(EngineError::plan(format!(
                "unknown option '{unknown}' for a {kind} lookup table; it takes {}",
                allowed.join(", ")
            )));
        }
        let options = LookupOptions::from_config(config, schema)?;
        let lookup = factory.create(config, &options)?;
        Ok((options, lookup))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};

    #[derive(Debug)]
    struct Nothing;

    #[async_trait]
    impl Lookup for Nothing {
        async fn get(&self, keys: &[String]) -> Result<Vec<Option<LookupRow>>> {
            Ok(vec![None; keys.len()])
        }
    }

    struct NothingFactory;

    impl LookupFactory for NothingFactory {
        fn options(&self) -> &'static [&'static str] {
            &["retry.timeout.ms"]
        }
        fn create(&self, _: &SourceConfig, _: &LookupOptions) -> Result<Arc<dyn Lookup>> {
            Ok(Arc::new(Nothing))
        }
    }

    fn check(kind: &str, options: &[(&str, &str)]) -> Result<LookupOptions> {
        let mut registry = SourceRegistry::default();
        registry.register_lookup("KV", Arc::new(NothingFactory));
        let schema = Arc::new(Schema::new(vec![
            Field::new("ad_id", DataType::Utf8, false),
            Field::new("campaign_id", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
            Field::new("f", DataType::Float64, true),
        ]));
        let config = SourceConfig {
            kind: kind.into(),
            location: "x".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        registry.create_lookup(&config, &schema).map(|(o, _)| o)
    }

    #[test]
    fn options_are_checked_when_the_table_is_declared() {
        let o = check("kv", &[(OPT_KEY, "ad_id")]).unwrap();
        assert_eq!(o.values, ["campaign_id", "n", "f"]);
        assert_eq!(o.cache_size, DEFAULT_CACHE_SIZE);
        assert_eq!(o.key_prefix, "");
        assert_eq!(o.missing, MissingPolicy::Join);
        let o = check(
            "KV",
            &[
                (OPT_KEY, "ad_id"),
                (OPT_CACHE_SIZE, "10"),
                (OPT_CACHE_TTL_MS, "0"),
                (OPT_MISSING, "dead-letter"),
                (OPT_KEY_PREFIX, "campaign:"),
                ("retry.timeout.ms", "5"),
            ],
        )
        .unwrap();
        assert_eq!(o.key_prefix, "campaign:");
        assert_eq!((o.cache_size, o.cache_ttl_ms), (10, 0));
        assert_eq!(o.missing, MissingPolicy::DeadLetter);
        let err = |opts: &[(&str, &str)]| check("KV", opts).unwrap_err().to_string();
        let e = err(&[(OPT_KEY, "ad")]);
        assert!(
            e.contains("no such column") && e.contains("ad_id, campaign_id"),
            "{e}"
        );
        let o = check("KV", &[(OPT_KEY, "n")]).unwrap();
        assert_eq!(o.values, ["ad_id", "campaign_id", "f"], "an integer key");
        let e = err(&[(OPT_KEY, "f")]);
        assert!(
            e.contains(
                "lookup.key = \"f\": the key column is Float64, which cannot be a lookup key"
            ),
            "{e}"
        );
        let e = err(&[(OPT_KEY, "ad_id"), (OPT_CACHE_SIZE, "many")]);
        assert!(e.contains("lookup.cache.size = \"many\""), "{e}");
        let e = err(&[(OPT_KEY, "ad_id"), (OPT_CACHE_TTL_MS, "-1")]);
        assert!(e.contains("lookup.cache.ttl.ms"), "{e}");
        let e = err(&[(OPT_KEY, "ad_id"), (OPT_MISSING, "drop")]);
        assert!(e.contains("'join' or 'dead-letter'"), "{e}");
        let e = err(&[(OPT_KEY, "ad_id"), ("lookup.prefix", "1")]);
        assert!(
            e.contains(
                "unknown option 'lookup.prefix' for a KV lookup table; it takes \
                 lookup.cache.size, lookup.cache.ttl.ms, lookup.key, lookup.key.prefix, \
                 lookup.missing, retry.timeout.ms"
            ),
            "{e}"
        );
        let e = check("KAFKA", &[(OPT_KEY, "ad_id")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("KAFKA tables cannot be lookup tables"), "{e}");
        for e in [e, err(&[(OPT_KEY, "ad")])] {
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}
