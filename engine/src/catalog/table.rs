//! `CREATE EXTERNAL TABLE t (...) STORED AS <KIND> LOCATION '...' OPTIONS (...)`
//! through the catalog: a table its kind can read becomes a
//! [`SourceTable`], one declared with `lookup.key` a lookup table, and one
//! its kind can only write a [`SinkTable`]. Every check that can fail on
//! the declaration (options, their values, event time, dead letters) fails
//! here, so a typo fails the CREATE TABLE rather than a function later.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::datasource::TableType;
use datafusion::logical_expr::{CreateExternalTable, Expr};
use datafusion::physical_plan::ExecutionPlan;

use super::Catalog;
use crate::exec::SourceTable;
use crate::lookup::LookupOptions;
use crate::lookup::exec::LookupTable;
use crate::sink::SinkConfig;
use crate::source::SourceConfig;
use crate::watermark::{EventTimeOptions, LatePolicy};

/// Makes the tables of every kind in the catalog.
#[derive(Clone)]
pub struct CatalogTableFactory {
    /// The kinds tables can be declared with.
    pub catalog: Catalog,
}

impl fmt::Debug for CatalogTableFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CatalogTableFactory({:?})", self.catalog.kinds())
    }
}

#[async_trait]
impl TableProviderFactory for CatalogTableFactory {
    async fn create(
        &self,
        _state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> DfResult<Arc<dyn TableProvider>> {
        let options: BTreeMap<String, String> = cmd
            .options
            .iter()
            // DataFusion prefixes options it does not know with "format.".
            .map(|(k, v)| {
                (
                    k.strip_prefix("format.").unwrap_or(k).to_string(),
                    v.clone(),
                )
            })
            .collect();
        let config = SourceConfig {
            kind: cmd.file_type.to_ascii_uppercase(),
            location: cmd.locations.first().cloned().unwrap_or_default(),
            options,
        };
        let schema: SchemaRef = Arc::new(cmd.schema.as_arrow().clone());
        self.declare(&cmd.name.to_string(), config, schema)
            .map_err(|e| DataFusionError::Plan(format!("table {}: {e}", cmd.name)))
    }
}

impl CatalogTableFactory {
    /// The table `name` declared as `config` with the columns of `schema`
    /// (none: the source's own, for a kind that knows them).
    pub fn declare(
        &self,
        name: &str,
        config: SourceConfig,
        schema: SchemaRef,
    ) -> crate::Result<Arc<dyn TableProvider>> {
        let catalog = &self.catalog;
        if LookupOptions::declared(&config) {
            // Opened here only to check it: the join opens its own.
            catalog.create_lookup(&config, &schema)?;
            return Ok(Arc::new(LookupTable {
                name: name.to_string(),
                config,
                schema,
            }));
        }
        catalog.check_options(&config)?;
        if catalog.can_write(&config.kind) {
            catalog.check_sink(&sink_config(&config))?;
        }
        if !catalog.can_read(&config.kind) {
            return Ok(Arc::new(SinkTable {
                name: name.to_string(),
                config,
                schema,
            }));
        }
        let source = catalog.create_source(&config, schema.clone())?;
        let event_time = EventTimeOptions::from_config(&config, &source.schema())?;
        if event_time.late == LatePolicy::DeadLetter && catalog.dead_letters(&config)?.is_none() {
            return Err(crate::EngineError::plan(format!(
                "'late' 'dead-letter' needs a dead-letter destination \
                 (for Kafka, 'dead.letter.topic'); {} tables declare none here",
                config.kind
            )));
        }
        Ok(Arc::new(SourceTable::declared(
            name, config, source, schema,
        )))
    }
}

/// A table's declaration as the config of a sink that writes it.
pub fn sink_config(config: &SourceConfig) -> SinkConfig {
    SinkConfig {
        kind: config.kind.clone(),
        location: config.location.clone(),
        options: config.options.clone(),
    }
}

/// The declaration of a table the catalog made, if `provider` is one that
/// can be written.
pub fn declaration(provider: &dyn TableProvider) -> Option<&SourceConfig> {
    let any: &dyn Any = provider;
    any.downcast_ref::<SourceTable>()
        .map(|t| &t.config)
        .or_else(|| any.downcast_ref::<SinkTable>().map(|t| &t.config))
}

/// A table that is only written: `CREATE EXTERNAL TABLE ... STORED AS
/// REDIS|FILES|BLACKHOLE` declares the schema and options of a sink, which
/// `INSERT INTO` then writes. Reading it is refused when the query is planned.
#[derive(Debug)]
pub struct SinkTable {
    /// The table's name.
    pub name: String,
    /// Its declaration.
    pub config: SourceConfig,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for SinkTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Err(DataFusionError::Plan(format!(
            "table {}: a {} table can be written (INSERT INTO), not read",
            self.name, self.config.kind
        )))
    }
}
