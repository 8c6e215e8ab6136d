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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkConfig {
    pub kind: String,
    pub location: String,
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

impl SinkConfig {
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
    pub query: &'a str,
    /// The run's lineage (see `CloudContext::run`): a sink keys what it
    /// remembers of written epochs by (run, member), never by query alone.
    pub run: &'a str,
    pub epoch: u64,
    pub member: u32,
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    pub offsets: Vec<SourceOffset>,
    pub last: bool,
}

#[async_trait]
pub trait Sink: Send + Sync {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()>;
}

pub trait SinkFactory: Send + Sync {
    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>>;
}

#[derive(Clone, Default)]
pub struct SinkRegistry {
    factories: HashMap<String, Arc<dyn SinkFactory>>,
}

impl SinkRegistry {
    pub fn register(&mut self, kind: &str, factory: Arc<dyn SinkFactory>) {
        self.factories.insert(kind.to_ascii_uppercase(), factory);
    }

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
}

/// Collects results in memory, by name: the in-process run reads them back.
#[derive(Default, Clone)]
pub struct CollectSinkFactory {
    results: Arc<Mutex<HashMap<String, Arc<CollectSink>>>>,
}

impl CollectSinkFactory {
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
}

#[derive(Default, Debug)]
pub struct CollectSink {
    /// Writes seen, keyed by (epoch, member) so a replay replaces, not adds.
    writes: Mutex<BTreeMap<(u64, u32), Vec<RecordBatch>>>,
}

impl CollectSink {
    pub fn batches(&self) -> Vec<RecordBatch> {
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

    pub fn rows(&self) -> usize {
        self.batches().iter().map(|b| b.num_rows()).sum()
    }

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
