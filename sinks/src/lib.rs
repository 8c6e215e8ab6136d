//! Sinks of Skein: Redis (generic layouts and YSB's), Kafka and Kinesis (a
//! message per row), files on a local disk or S3, and a blackhole that only
//! counts. Redis, Kafka and files are exactly once at any group size: each
//! write is keyed by (run, epoch, member) and a replay changes nothing (see
//! [`epochs`]).

// Drops rows and counts them: a benchmark's sink.
pub mod blackhole;
pub mod encode;
pub mod epochs;
pub mod error;
pub mod files;
pub mod kafka;
pub mod kinesis;
pub mod redis;
// One Redis connection that waits out outages, for the sink and lookups.
pub mod redis_conn;
// Redis as a lookup table joined with a stream.
pub mod redis_lookup;
// Query results as Arrow IPC objects (S3 or files), read back by `skein run --backend lambda`.
pub mod results;
pub mod store;

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use skein_engine::error::{EngineError, Result as EngineResult};
use skein_engine::planner::EMIT_OPTION;
use skein_engine::sink::{SinkConfig, SinkRegistry};
use skein_engine::source::{
    EpochSpec, MicroBatch, Source, SourceConfig, SourceFactory, SourceRegistry, TableOptions,
};

use crate::encode::ENCODER_OPTIONS;

/// Register every sink kind of this crate, and a write-only table kind for
/// each so that `CREATE EXTERNAL TABLE ... STORED AS <KIND>` declares one.
pub fn register(sinks: &mut SinkRegistry, tables: &mut SourceRegistry) {
    sinks.register(redis::KIND, Arc::new(redis::RedisSinkFactory));
    tables.register(
        redis::KIND,
        Arc::new(SinkTableFactory::new(redis::OPTIONS, redis::check_config)),
    );
    tables.register_lookup(redis::KIND, Arc::new(redis_lookup::RedisLookupFactory));
    sinks.register(files::KIND, Arc::new(files::FilesSinkFactory));
    tables.register(
        files::KIND,
        Arc::new(SinkTableFactory::new(files::OPTIONS, |c| {
            files::format_of(c).map(drop)
        })),
    );
    sinks.register(blackhole::KIND, Arc::new(blackhole::BlackholeSinkFactory));
    tables.register(blackhole::KIND, Arc::new(blackhole::BlackholeTableFactory));
    // `STORED AS KAFKA` and `STORED AS KINESIS` tables are declared by their
    // sources (connectors); INSERT INTO one writes through these sinks, so
    // the tables take the sinks' options too (a table may be read and written).
    sinks.register(kinesis::KIND, Arc::new(kinesis::KinesisSinkFactory));
    tables.allow_options(kinesis::KIND, ENCODER_OPTIONS);
    tables.allow_options(kinesis::KIND, kinesis::OPTIONS);
    sinks.register(kafka::KIND, Arc::new(kafka::KafkaSinkFactory));
    tables.allow_options(kafka::KIND, ENCODER_OPTIONS);
    tables.allow_options(kafka::KIND, kafka::OPTIONS);
    // The planner reads `emit` from whichever table a query writes.
    for kind in [redis::KIND, files::KIND, kinesis::KIND, kafka::KIND] {
        tables.allow_options(kind, &[EMIT_OPTION]);
    }
}

/// Declares sink tables: they have a schema and these options, but cannot
/// be read. `check` reads the options as the sink will, so a bad value
/// fails the CREATE TABLE rather than the first write.
pub struct SinkTableFactory {
    options: &'static [&'static str],
    check: fn(&SinkConfig) -> EngineResult<()>,
}

impl SinkTableFactory {
    pub fn new(
        options: &'static [&'static str],
        check: fn(&SinkConfig) -> EngineResult<()>,
    ) -> Self {
        SinkTableFactory { options, check }
    }
}

impl SourceFactory for SinkTableFactory {
    fn options(&self) -> TableOptions {
        TableOptions::only(self.options)
    }

    fn create(&self, config: &SourceConfig, schema: SchemaRef) -> EngineResult<Arc<dyn Source>> {
        (self.check)(&SinkConfig {
            kind: config.kind.clone(),
            location: config.location.clone(),
            options: config.options.clone(),
        })?;
        Ok(Arc::new(SinkTable {
            name: format!("{} {}", config.kind, config.location),
            schema,
        }))
    }
}

#[derive(Debug)]
struct SinkTable {
    name: String,
    schema: SchemaRef,
}

#[async_trait]
impl Source for SinkTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn parallelism(&self) -> usize {
        1
    }

    async fn pull(&self, _spec: EpochSpec) -> EngineResult<MicroBatch> {
        Err(EngineError::Source {
            source_name: self.name.clone(),
            reason: "a sink table can be written (INSERT INTO), not read".into(),
        })
    }
}
