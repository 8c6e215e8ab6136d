//! The Sink trait: where the last stage writes its results. Sinks live in
//! the connectors crate; the engine only knows the trait, an in-memory collector
//! and the registry that maps a config's `kind` to a factory.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::payload::SourceOffset;

/// A sink as a table declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkConfig {
    /// The sink kind (`STORED AS`).
    pub kind: String,
    /// Its location (`LOCATION`).
    pub location: String,
    /// Its options.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

impl SinkConfig {
    /// The in-memory collector named `name` (results of a plain SELECT).
    pub fn collect(name: &str) -> Self {
        SinkConfig {
            kind: "COLLECT".into(),
            location: name.into(),
            options: BTreeMap::new(),
        }
    }
}

/// One write: everything a member emits for one epoch. `(query, epoch,
/// member)` identifies it, so a sink can make a replay idempotent.
#[derive(Debug)]
pub struct SinkWrite<'a> {
    /// The query code.
    pub query: &'a str,
    /// The run's lineage (see `CloudContext::run`): a sink keys what it
    /// remembers of written epochs by (run, member), never by query alone.
    pub run: &'a str,
    /// The epoch.
    pub epoch: u64,
    /// The stage member writing.
    pub member: u32,
    /// The schema of the batches.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
    /// Source offsets read up to, for sinks that store them with the rows.
    pub offsets: Vec<SourceOffset>,
    /// The run's last epoch.
    pub last: bool,
}

/// Where a query's results go; connectors implement it.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Write one member's output of one epoch; in an exactly-once sink a
    /// replay of the same write changes nothing.
    async fn write(&self, write: SinkWrite<'_>) -> Result<()>;
}

/// Builds sinks of one kind from their config.
pub trait SinkFactory: Send + Sync {
    /// A sink for `config`.
    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>>;

    /// Whether a sink so configured takes a changelog (an updating query's
    /// result, see [`crate::changelog`]): its batches then end with the op
    /// column, and a retraction must take back the row it names. `Err`
    /// says in one line why not, and what would.
    fn takes_updates(&self, config: &SinkConfig) -> std::result::Result<(), String> {
        let _ = config;
        Err("it only appends rows".into())
    }
}

/// The sink kinds a binary knows, by kind name.
#[derive(Clone, Default)]
pub struct SinkRegistry {
    factories: HashMap<String, Arc<dyn SinkFactory>>,
}

impl SinkRegistry {
    /// Register `factory` for `kind`.
    pub fn register(&mut self, kind: &str, factory: Arc<dyn SinkFactory>) {
        self.factories.insert(kind.to_ascii_uppercase(), factory);
    }

    /// A sink for `config`, from its kind's factory.
    pub fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        let factory = self
            .factories
            .get(&config.kind.to_ascii_uppercase())
            .ok_or_else(|| {
                let mut known: Vec<&String> = self.factories.keys().collect();
                known.sort();
                EngineError::sink_failed(
                    config.location.clone(),
                    format!("unknown sink kind {:?}; known: {known:?}", config.kind),
                )
            })?;
        factory.create(config)
    }

    /// Whether the sink `config` declares takes a changelog (see
    /// [`SinkFactory::takes_updates`]); an unknown kind takes nothing.
    pub fn takes_updates(&self, config: &SinkConfig) -> std::result::Result<(), String> {
        match self.factories.get(&config.kind.to_ascii_uppercase()) {
            Some(f) => f.takes_updates(config),
            None => Err(format!("no sink kind {:?} is known", config.kind)),
        }
    }
}

/// Collects results in memory, by name: the in-process run reads them back.
#[derive(Default, Clone)]
pub struct CollectSinkFactory {
    results: Arc<Mutex<HashMap<String, Arc<CollectSink>>>>,
}

impl CollectSinkFactory {
    /// The collector named `name`, made on first use.
    pub fn sink(&self, name: &str) -> Arc<CollectSink> {
        self.results
            .lock()
            .expect("collect sinks")
            .entry(name.to_string())
            .or_default()
            .clone()
    }
}

impl SinkFactory for CollectSinkFactory {
    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        Ok(self.sink(&config.location))
    }

    /// The collected result is consolidated into the table it adds up to.
    fn takes_updates(&self, _config: &SinkConfig) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Collects results in memory.
#[derive(Default, Debug)]
pub struct CollectSink {
    /// Writes seen, keyed by (epoch, member) so a replay replaces, not adds.
    writes: Mutex<BTreeMap<(u64, u32), Vec<RecordBatch>>>,
}

impl CollectSink {
    /// The result collected so far: the rows written, or, for a query
    /// whose result updates, the table its changelog adds up to.
    pub fn batches(&self) -> Vec<RecordBatch> {
        let written = self.changes();
        match written.first() {
            Some(b) if crate::changelog::is_changelog(&b.schema()) => {
                match crate::updating::consolidate(&b.schema(), &written) {
                    Ok(table) => vec![table],
                    Err(e) => {
                        tracing::error!(error = %e, "consolidating the collected changelog");
                        written
                    }
                }
            }
            _ => written,
        }
    }

    /// Every batch written, in epoch and member order (a changelog as it
    /// came, for a query whose result updates).
    pub fn changes(&self) -> Vec<RecordBatch> {
        self.writes
            .lock()
            .expect("collect sink")
            .values()
            .flatten()
            .cloned()
            .collect()
    }

    /// The epochs in which something was written.
    pub fn epochs(&self) -> Vec<u64> {
        let mut e: Vec<u64> = self
            .writes
            .lock()
            .expect("collect sink")
            .keys()
            .map(|k| k.0)
            .collect();
        e.dedup();
        e
    }

    /// Rows collected so far.
    pub fn rows(&self) -> usize {
        self.batches().iter().map(|b| b.num_rows()).sum()
    }

    /// Forget what was collected.
    pub fn clear(&self) {
        self.writes.lock().expect("collect sink").clear();
    }
}

#[async_trait]
impl Sink for CollectSink {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()> {
        let batches: Vec<RecordBatch> = write
            .batches
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .collect();
        let mut w = self.writes.lock().expect("collect sink");
        if batches.is_empty() {
            w.remove(&(write.epoch, write.member));
        } else {
            w.insert((write.epoch, write.member), batches);
        }
        Ok(())
    }
}
