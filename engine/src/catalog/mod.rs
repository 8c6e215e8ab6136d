//! The table catalog: which table kinds a binary knows and what each can do.
//!
//! A kind (`STORED AS KAFKA`) may have a source factory (its tables can be
//! read), a sink factory (they can be written, `INSERT INTO`) and a lookup
//! factory (they can be joined by key, `lookup.key`); a connector crate
//! registers each with one line. Every factory declares the options it
//! takes. Besides those, a table takes the engine-wide options
//! ([`crate::table_options`]): the catalog checks their values and keeps them from the
//! factories, and hands each factory only its own options. An option no
//! one declares is a one-line error naming it and the ones allowed.
//!
//! `table.rs` turns a `CREATE EXTERNAL TABLE` into a DataFusion table
//! through the catalog.

pub mod browse;
mod capabilities;
pub mod parallelism;
pub mod table;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;

use crate::clock::Clock;
use crate::dead_letter::DeadLetterSink;
use crate::error::{EngineError, Result};
use crate::interval::duration_option;
use crate::lookup::exec::{LookupHandle, LookupSpec};
use crate::lookup::{LOOKUP_OPTIONS, Lookup, LookupFactory, LookupOptions, OPT_KEY};
use crate::sink::{Sink, SinkConfig, SinkFactory};
use crate::source::{Source, SourceConfig, SourceFactory};

pub use crate::table_options::TableOptions;
use crate::table_options::{
    EMIT_INTERVAL_OPTION, EMIT_OPTION, EMIT_VALUES, EPOCH_INTERVAL_OPTION, SINK_TABLE_OPTIONS,
    SOURCE_TABLE_OPTIONS, STATE_TTL_OPTION,
};

/// What one kind can be: read, written, joined by key.
#[derive(Clone, Default)]
struct Kind {
    source: Option<Arc<dyn SourceFactory>>,
    sink: Option<Arc<dyn SinkFactory>>,
    lookup: Option<Arc<dyn LookupFactory>>,
    /// What lists and samples the kind's streams (`skein ui`).
    browser: Option<Arc<dyn browse::SourceBrowser>>,
    /// Options a backend reads from the kind's tables (Lambda's `mode`).
    backend: Vec<&'static str>,
}

/// Who reads a table's options: the checks differ only in what they keep.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reader {
    Source,
    Sink,
}

impl Kind {
    fn own(&self, reader: Reader) -> Option<TableOptions> {
        match reader {
            Reader::Source => self.source.as_ref().map(|f| f.options()),
            Reader::Sink => self.sink.as_ref().map(|f| f.options()),
        }
    }

    /// The engine-wide options tables of this kind take, in order.
    fn engine_options(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = vec![];
        let sources = self.source.is_some().then_some(SOURCE_TABLE_OPTIONS);
        let sinks = self.sink.is_some().then_some(SINK_TABLE_OPTIONS);
        for n in sources.into_iter().chain(sinks).flatten() {
            if !names.contains(n) {
                names.push(n);
            }
        }
        names
    }
}

/// The table kinds a binary knows, by `STORED AS` name (upper case).
#[derive(Clone)]
pub struct Catalog {
    kinds: BTreeMap<String, Kind>,
    /// Where lookup caches read the time for their TTL.
    clock: Arc<dyn Clock>,
    /// What bounds a source table's default instances.
    source_budget: parallelism::SourceBudget,
    /// The instances a resumed checkpoint was written with.
    source_pins: parallelism::SourcePins,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            kinds: BTreeMap::new(),
            clock: crate::clock::system(),
            source_budget: parallelism::SourceBudget::default(),
            source_pins: parallelism::SourcePins::default(),
        }
    }
}

impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Catalog({:?})", self.kinds())
    }
}

impl Catalog {
    fn entry(&mut self, kind: &str) -> &mut Kind {
        self.kinds.entry(kind.to_ascii_uppercase()).or_default()
    }

    /// Lookup caches opened from here read the time from `clock` (the
    /// system clock unless a test sets one it can advance).
    pub fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.clock = clock;
    }

    /// Tables of `kind` can be read through `factory`.
    pub fn register_source(&mut self, kind: &str, factory: Arc<dyn SourceFactory>) {
        self.entry(kind).source = Some(factory);
    }

    /// Tables of `kind` can be written through `factory`.
    pub fn register_sink(&mut self, kind: &str, factory: Arc<dyn SinkFactory>) {
        self.entry(kind).sink = Some(factory);
    }

    /// Tables of `kind` can be lookup tables (see [`crate::lookup`]).
    pub fn register_lookup(&mut self, kind: &str, factory: Arc<dyn LookupFactory>) {
        self.entry(kind).lookup = Some(factory);
    }

    /// The streams of `kind`'s clusters can be listed and sampled through
    /// `browser`.
    pub fn register_browser(&mut self, kind: &str, browser: Arc<dyn browse::SourceBrowser>) {
        self.entry(kind).browser = Some(browser);
    }

    /// The browser of `kind`'s streams, if it has one.
    pub fn browser(&self, kind: &str) -> Option<Arc<dyn browse::SourceBrowser>> {
        self.get(kind).and_then(|k| k.browser.clone())
    }

    /// Tables of `kind` take `names` too, which a backend reads (Lambda's
    /// `'mode' 'push'`); no factory sees them.
    pub fn add_backend_options(&mut self, kind: &str, names: &[&'static str]) {
        let backend = &mut self.entry(kind).backend;
        for n in names {
            if !backend.contains(n) {
                backend.push(n);
            }
        }
    }

    /// Every kind, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.kinds.keys().cloned().collect()
    }

    /// Whether tables of the config's kind can be read.
    pub fn can_read(&self, kind: &str) -> bool {
        self.get(kind).is_some_and(|k| k.source.is_some())
    }

    /// Whether tables of the config's kind can be written.
    pub fn can_write(&self, kind: &str) -> bool {
        self.get(kind).is_some_and(|k| k.sink.is_some())
    }

    fn get(&self, kind: &str) -> Option<&Kind> {
        self.kinds.get(&kind.to_ascii_uppercase())
    }

    fn kind(&self, kind: &str, location: &str) -> Result<&Kind> {
        self.get(kind).ok_or_else(|| {
            EngineError::plan(format!(
                "table {location}: unknown kind {kind:?} (STORED AS); known: {}",
                self.kinds().join(", ")
            ))
        })
    }

    /// Refuse an option the table's kind does not take, naming it and
    /// listing those it does, and an engine-wide option with a bad value.
    pub fn check_options(&self, config: &SourceConfig) -> Result<()> {
        let kind = self.kind(&config.kind, &config.location)?;
        let own: Vec<TableOptions> = [Reader::Source, Reader::Sink]
            .into_iter()
            .filter_map(|r| kind.own(r))
            .collect();
        let engine = kind.engine_options();
        let dotted = own.iter().find_map(|o| o.dotted_passthrough);
        let known = |k: &str| {
            own.iter().any(|o| o.has(k))
                || engine.contains(&k)
                || kind.backend.contains(&k)
                || (dotted.is_some() && k.contains('.'))
        };
        if let Some(unknown) = config.options.keys().find(|k| !known(k)) {
            let mut allowed: Vec<&str> = own
                .iter()
                .flat_map(|o| o.names.iter())
                .chain(&kind.backend)
                .copied()
                .filter(|n| !engine.contains(n))
                .collect();
            allowed.sort_unstable();
            allowed.dedup();
            allowed.extend(&engine);
            let mut list = allowed.join(", ");
            if let Some(what) = dotted {
                list.push_str(&format!(", and any {what} (a name with a dot)"));
            }
            return Err(EngineError::plan(format!(
                "unknown option '{unknown}' for a {} table; it takes {list}",
                config.kind.to_ascii_uppercase()
            )));
        }
        check_engine_values(config)
    }

    /// The options `reader`'s factory sees: its own, and those with a dot
    /// no one else declares when it takes them.
    fn options_for<'a>(
        &self,
        kind: &Kind,
        reader: Reader,
        options: &'a BTreeMap<String, String>,
    ) -> Cow<'a, BTreeMap<String, String>> {
        let Some(own) = kind.own(reader) else {
            return Cow::Borrowed(options);
        };
        let other = match reader {
            Reader::Source => kind.own(Reader::Sink),
            Reader::Sink => kind.own(Reader::Source),
        };
        let engine = kind.engine_options();
        let keep = |k: &str| {
            own.has(k)
                || (own.dotted_passthrough.is_some()
                    && k.contains('.')
                    && !engine.contains(&k)
                    && !kind.backend.contains(&k)
                    && !other.as_ref().is_some_and(|o| o.has(k)))
        };
        if options.keys().all(|k| keep(k)) {
            return Cow::Borrowed(options);
        }
        Cow::Owned(
            options
                .iter()
                .filter(|(k, _)| keep(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    }

    /// The config as its kind's sink factory sees it.
    pub fn sink_view<'a>(&self, config: &'a SinkConfig) -> Result<Cow<'a, SinkConfig>> {
        let (kind, _) = self.sink_factory(config)?;
        Ok(self.sink_view_of(kind, config))
    }

    /// The config as its kind's source factory sees it.
    pub fn source_view<'a>(&self, config: &'a SourceConfig) -> Result<Cow<'a, SourceConfig>> {
        let (kind, _) = self.source_factory(config)?;
        Ok(self.source_view_of(kind, config))
    }

    fn source_view_of<'a>(&self, kind: &Kind, config: &'a SourceConfig) -> Cow<'a, SourceConfig> {
        match self.options_for(kind, Reader::Source, &config.options) {
            Cow::Borrowed(_) => Cow::Borrowed(config),
            Cow::Owned(options) => Cow::Owned(SourceConfig {
                options,
                ..config.clone()
            }),
        }
    }

    fn sink_view_of<'a>(&self, kind: &Kind, config: &'a SinkConfig) -> Cow<'a, SinkConfig> {
        match self.options_for(kind, Reader::Sink, &config.options) {
            Cow::Borrowed(_) => Cow::Borrowed(config),
            Cow::Owned(options) => Cow::Owned(SinkConfig {
                options,
                ..config.clone()
            }),
        }
    }

    fn source_factory(&self, config: &SourceConfig) -> Result<(&Kind, &Arc<dyn SourceFactory>)> {
        let kind = self.kind(&config.kind, &config.location)?;
        let factory = kind.source.as_ref().ok_or_else(|| {
            EngineError::plan(format!(
                "table {}: a {} table can be written (INSERT INTO), not read",
                config.location,
                config.kind.to_ascii_uppercase()
            ))
        })?;
        Ok((kind, factory))
    }

    /// The table's source; an option its kind does not take is an error.
    pub fn create_source(
        &self,
        config: &SourceConfig,
        schema: SchemaRef,
    ) -> Result<Arc<dyn Source>> {
        self.check_options(config)?;
        let (kind, factory) = self.source_factory(config)?;
        factory.create(&self.source_view_of(kind, config), schema)
    }

    /// The dead-letter destination a table declares, if any.
    pub fn dead_letters(&self, config: &SourceConfig) -> Result<Option<Arc<dyn DeadLetterSink>>> {
        let (kind, factory) = self.source_factory(config)?;
        factory.dead_letters(&self.source_view_of(kind, config))
    }

    fn sink_factory(&self, config: &SinkConfig) -> Result<(&Kind, &Arc<dyn SinkFactory>)> {
        let kind = self.get(&config.kind).ok_or_else(|| {
            EngineError::sink_failed(
                config.location.clone(),
                format!(
                    "unknown sink kind {:?}; known: {}",
                    config.kind,
                    self.kinds().join(", ")
                ),
            )
        })?;
        let factory = kind.sink.as_ref().ok_or_else(|| {
            EngineError::plan(format!(
                "table {}: a {} table can be read, not written",
                config.location,
                config.kind.to_ascii_uppercase()
            ))
        })?;
        Ok((kind, factory))
    }

    /// Check a sink table's options as its sink will read them, so a bad
    /// value fails the CREATE TABLE rather than the first write.
    pub fn check_sink(&self, config: &SinkConfig) -> Result<()> {
        let (kind, factory) = self.sink_factory(config)?;
        factory.check(&self.sink_view_of(kind, config))
    }

    /// A sink for `config`, from its kind's factory.
    pub fn create_sink(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        let (kind, factory) = self.sink_factory(config)?;
        factory.create(&self.sink_view_of(kind, config))
    }

    /// The kinds whose tables may be lookup tables.
    pub fn lookup_kinds(&self) -> Vec<String> {
        self.kinds
            .iter()
            .filter(|(_, k)| k.lookup.is_some())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The lookup a plan's join names, opened with its cache and where its
    /// rows without a match go.
    pub fn open_lookup(&self, spec: LookupSpec, table_schema: SchemaRef) -> Result<LookupHandle> {
        let (_, lookup) = self.create_lookup(&spec.config, &table_schema)?;
        LookupHandle::open(spec, table_schema, lookup, self.clock.clone(), |c| {
            self.dead_letters(c)
        })
    }

    /// The options and the lookup of a table declared as one; an unknown
    /// option, a bad value or a kind without lookups is an error.
    pub fn create_lookup(
        &self,
        config: &SourceConfig,
        schema: &SchemaRef,
    ) -> Result<(LookupOptions, Arc<dyn Lookup>)> {
        let kind = config.kind.to_ascii_uppercase();
        let Some(factory) = self.get(&kind).and_then(|k| k.lookup.as_ref()) else {
            let kinds: BTreeSet<String> = self.lookup_kinds().into_iter().collect();
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

/// The values of the engine-wide options that need no schema (event time
/// is checked against the table's columns where the table is made).
fn check_engine_values(config: &SourceConfig) -> Result<()> {
    for key in [
        EPOCH_INTERVAL_OPTION,
        STATE_TTL_OPTION,
        EMIT_INTERVAL_OPTION,
    ] {
        duration_option(config, key)?;
    }
    if let Some(emit) = config.option(EMIT_OPTION)
        && !EMIT_VALUES.contains(&emit)
    {
        return Err(EngineError::plan(format!(
            "option '{EMIT_OPTION}' = {emit:?}: give {}",
            EMIT_VALUES
                .iter()
                .map(|v| format!("'{v}'"))
                .collect::<Vec<_>>()
                .join(" or ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
