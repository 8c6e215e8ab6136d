//! What a table's kind can do, asked of the catalog: how a checkpoint reads
//! a source again, whether it is live, whether a sink is exactly once,
//! keeps offsets or takes updates. Whoever decides by kind asks here, so no
//! module lists kinds by name.

use std::collections::BTreeMap;

use datafusion::arrow::datatypes::SchemaRef;

use super::Catalog;
use crate::error::{EngineError, Result};
use crate::sink::{Discarded, SinkCapabilities, SinkConfig};
use crate::source::{ReplayMode, SourceCapabilities, SourceConfig};

impl Catalog {
    /// What the table's kind can do as a source; the defaults (cannot be
    /// read again, bounded) for a kind that cannot be read.
    pub fn source_capabilities(&self, kind: &str) -> SourceCapabilities {
        self.get(kind)
            .and_then(|k| k.source.as_ref())
            .map(|f| f.capabilities())
            .unwrap_or_default()
    }

    /// What the table's kind can do as a sink; nothing for a kind that
    /// cannot be written.
    pub fn sink_capabilities(&self, kind: &str) -> SinkCapabilities {
        self.get(kind)
            .and_then(|k| k.sink.as_ref())
            .map(|f| f.capabilities())
            .unwrap_or_default()
    }

    /// How a checkpoint reads the table's epochs again.
    pub fn replay_mode(&self, config: &SourceConfig) -> ReplayMode {
        self.source_capabilities(&config.kind).replay
    }

    /// Whether the table is read from a live source (no end of its own).
    pub fn is_live(&self, config: &SourceConfig) -> bool {
        self.source_capabilities(&config.kind).live
    }

    /// Whether tables of `kind` take the option `name` (their factory's own).
    pub fn takes_option(&self, kind: &str, name: &str) -> bool {
        self.get(kind).is_some_and(|k| {
            let source = k.source.as_ref().map(|f| f.options());
            let sink = k.sink.as_ref().map(|f| f.options());
            source
                .into_iter()
                .chain(sink)
                .any(|o| o.names.contains(&name))
        })
    }

    /// Whether writes into the sink are exactly once across restarts.
    pub fn sink_exactly_once(&self, config: &SinkConfig) -> bool {
        self.sink_capabilities(&config.kind).exactly_once
    }

    /// Forget what an earlier run of `query` wrote to the table (see
    /// [`crate::sink::SinkFactory::forget_written`]).
    pub async fn forget_written(&self, config: &SinkConfig, query: &str) -> Result<()> {
        let (kind, factory) = self.sink_factory(config)?;
        factory
            .forget_written(&self.sink_view_of(kind, config), query)
            .await
    }

    /// The rows `query` wrote to the table, read back where the sink can
    /// (see [`crate::sink::SinkFactory::read_back`]).
    pub async fn read_back(
        &self,
        config: &SinkConfig,
        query: &str,
        schema: &SchemaRef,
    ) -> Result<Option<Vec<datafusion::arrow::record_batch::RecordBatch>>> {
        let (kind, factory) = self.sink_factory(config)?;
        factory
            .read_back(&self.sink_view_of(kind, config), query, schema)
            .await
    }

    /// What the table's sinks dropped of `query`'s rows in this process,
    /// where they keep a count rather than the rows.
    pub fn take_sink_summary(&self, config: &SinkConfig, query: &str) -> Option<Discarded> {
        let (_, factory) = self.sink_factory(config).ok()?;
        factory.take_summary(query)
    }

    /// Whether the sink takes an updating result (a changelog); `Err`
    /// holds why not, in a few words.
    pub fn sink_takes_updates(&self, config: &SinkConfig) -> std::result::Result<(), String> {
        let (kind, factory) = self.sink_factory(config).map_err(|e| e.to_string())?;
        factory.takes_updates(&self.sink_view_of(kind, config))
    }

    /// Whether rows the table's source produces are a changelog (a
    /// change-data-capture topic): asked of the source the table makes.
    pub fn source_changelog(&self, config: &SourceConfig, schema: SchemaRef) -> Result<bool> {
        Ok(self.create_source(config, schema)?.changelog())
    }

    /// The kinds whose sinks can hand back the offsets they committed.
    pub fn kinds_keeping_offsets(&self) -> Vec<String> {
        self.kinds()
            .into_iter()
            .filter(|k| self.sink_capabilities(k).keeps_offsets)
            .collect()
    }

    /// Whether the table asks to start where the query's sink last
    /// committed (`'startup' 'checkpoint'`).
    pub fn resumes_from_sink(&self, config: &SourceConfig) -> bool {
        self.source_factory(config)
            .is_ok_and(|(kind, f)| f.resumes_from_sink(&self.source_view_of(kind, config)))
    }

    /// The table `config` of a query writing `sink`, starting where `sink`
    /// committed: the offsets of the table's source the sink stored,
    /// turned into a declaration by the source's kind. An error names what
    /// is missing when the sink keeps no offsets.
    pub async fn resume_from_sink(
        &self,
        table: &str,
        config: &SourceConfig,
        sink: &SinkConfig,
    ) -> Result<(SourceConfig, BTreeMap<i32, i64>)> {
        let (kind, factory) = self.sink_factory(sink)?;
        let committed = factory
            .committed_offsets(&self.sink_view_of(kind, sink), &config.location)
            .await?;
        let Some(offsets) = committed else {
            return Err(EngineError::plan(format!(
                "table {table}: 'startup' 'checkpoint' needs a sink that keeps the offsets it \
                 wrote ({}, with a 'checkpoint' option); this query's sink ({} {}) keeps none",
                self.kinds_keeping_offsets().join(" or "),
                sink.kind,
                sink.location
            )));
        };
        let (_, source) = self.source_factory(config)?;
        Ok((source.starting_at(config, &offsets), offsets))
    }
}
