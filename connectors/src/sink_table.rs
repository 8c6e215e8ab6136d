//! Tables that are only written: `CREATE EXTERNAL TABLE ... STORED AS
//! REDIS|FILES|BLACKHOLE` declares the schema and options of a sink, which
//! `INSERT INTO` then writes.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use skein_engine::error::{EngineError, Result as EngineResult};
use skein_engine::sink::SinkConfig;
use skein_engine::source::{
    EpochSpec, MicroBatch, Source, SourceConfig, SourceFactory, TableOptions,
};

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
        Err(EngineError::source_failed(
            self.name.clone(),
            "a sink table can be written (INSERT INTO), not read",
        ))
    }
}
