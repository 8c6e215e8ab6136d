//! The generators as engine sources: `STORED AS NEXMARK` and `STORED AS YSB`
//! tables. Source instance `i` of `N` generates slice `i` of the stream, and
//! epoch `e` of `E` its e-th share, so a run over all epochs sees exactly the
//! events a single-process scan of the table sees.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use skein_engine::error::{EngineError, Result};
use skein_engine::payload::SourceOffset;
use skein_engine::source::{
    EpochSpec, MicroBatch, Source, SourceConfig, SourceFactory, SourceRegistry,
};

use crate::Slice;
use crate::nexmark::{EventKind, NexmarkBatchBuilder, NexmarkConfig, NexmarkGenerator, schema_for};

/// Events generated per batch inside one pull.
const CHUNK_EVENTS: u64 = 16_384;

/// Register the generator kinds.
pub fn register(registry: &mut SourceRegistry) {
    registry.register("NEXMARK", Arc::new(NexmarkSourceFactory));
}

/// `CREATE EXTERNAL TABLE` statements for the three NEXMark tables.
pub fn nexmark_ddl(events: u64, rate: u64, partitions: usize) -> String {
    ["person", "auction", "bid"]
        .iter()
        .map(|t| {
            format!(
                "CREATE EXTERNAL TABLE {t} STORED AS NEXMARK LOCATION '{t}' \
                 OPTIONS ('events' '{events}', 'rate' '{rate}', 'partitions' '{partitions}', 'event_time' 'date_time');"
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn bad(table: &str, reason: impl Into<String>) -> EngineError {
    EngineError::Source {
        source_name: table.to_string(),
        reason: reason.into(),
    }
}

fn parse_opt<T: std::str::FromStr>(config: &SourceConfig, key: &str) -> Result<Option<T>> {
    config
        .option(key)
        .map(|v| {
            v.parse::<T>().map_err(|_| {
                bad(
                    &config.location,
                    format!("option {key:?}: cannot parse {v:?}"),
                )
            })
        })
        .transpose()
}

struct NexmarkSourceFactory;

impl SourceFactory for NexmarkSourceFactory {
    fn create(&self, config: &SourceConfig, declared: SchemaRef) -> Result<Arc<dyn Source>> {
        let table = config.location.to_ascii_lowercase();
        let kind = match table.as_str() {
            "person" => EventKind::Person,
            "auction" => EventKind::Auction,
            "bid" => EventKind::Bid,
            other => return Err(bad(other, "LOCATION must be 'person', 'auction' or 'bid'")),
        };
        let schema = schema_for(kind);
        // A declared schema must be the generator's; none declared takes it.
        if !declared.fields().is_empty() {
            for (d, g) in declared.fields().iter().zip(schema.fields().iter()) {
                if d.name() != g.name() || d.data_type() != g.data_type() {
                    return Err(bad(
                        &table,
                        format!(
                            "declared column {} {} does not match the generator's {} {}",
                            d.name(),
                            d.data_type(),
                            g.name(),
                            g.data_type()
                        ),
                    ));
                }
            }
            if declared.fields().len() != schema.fields().len() {
                return Err(bad(
                    &table,
                    format!("declare all {} columns or none", schema.fields().len()),
                ));
            }
        }
        let mut gen_config = NexmarkConfig::default();
        if let Some(seed) = parse_opt(config, "seed")? {
            gen_config.seed = seed;
        }
        if let Some(rate) = parse_opt(config, "rate")? {
            gen_config.first_event_rate = rate;
        }
        gen_config.max_events = parse_opt(config, "events")?;
        let partitions: usize = parse_opt(config, "partitions")?.unwrap_or(1);
        if partitions == 0 {
            return Err(bad(&table, "partitions must be at least 1"));
        }
        let events_per_epoch: Option<u64> = parse_opt(config, "events_per_epoch")?;
        gen_config
            .validate()
            .map_err(|e| bad(&table, e.to_string()))?;
        Ok(Arc::new(NexmarkSource {
            table,
            kind,
            schema,
            config: gen_config,
            partitions,
            events_per_epoch,
        }))
    }
}

/// One NEXMark table fed by the generator.
#[derive(Debug)]
pub struct NexmarkSource {
    table: String,
    kind: EventKind,
    schema: SchemaRef,
    config: NexmarkConfig,
    partitions: usize,
    events_per_epoch: Option<u64>,
}

#[async_trait]
impl Source for NexmarkSource {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn parallelism(&self) -> usize {
        self.partitions
    }

    async fn pull(&self, spec: EpochSpec) -> Result<MicroBatch> {
        let slice = Slice::new(spec.instance as u32, spec.instances.max(1) as u32)
            .map_err(|e| bad(&self.table, e.to_string()))?;
        // This instance's events of this epoch: [start, end) of its slice.
        let (start, end) = match (self.config.max_events, spec.epochs) {
            (Some(total), Some(epochs)) => {
                let len = slice.len_of(total);
                let per = len.div_ceil(epochs.max(1));
                (
                    (per * spec.epoch).min(len),
                    (per * (spec.epoch + 1)).min(len),
                )
            }
            _ => {
                // Unbounded: one second of event time per epoch by default.
                let per = self.events_per_epoch.unwrap_or_else(|| {
                    self.config
                        .first_event_rate
                        .div_ceil(spec.instances.max(1) as u64)
                });
                let (s, e) = (per * spec.epoch, per * (spec.epoch + 1));
                match self.config.max_events {
                    Some(total) => (s.min(slice.len_of(total)), e.min(slice.len_of(total))),
                    None => (s, e),
                }
            }
        };
        let mut generator = NexmarkGenerator::with_slice(self.config.clone(), slice)
            .map_err(|e| bad(&self.table, e.to_string()))?;
        generator.seek(start);
        let mut batches = vec![];
        let mut builder =
            NexmarkBatchBuilder::for_events(CHUNK_EVENTS.min(end - start) as usize, &self.config);
        let mut produced = start;
        while produced < end {
            let chunk_end = (produced + CHUNK_EVENTS).min(end);
            while produced < chunk_end {
                match generator.next_event() {
                    Some(ev) => builder.append(&ev),
                    None => break,
                }
                produced += 1;
            }
            let out = builder
                .finish()
                .map_err(|e| bad(&self.table, e.to_string()))?;
            let b = out.get(self.kind).clone();
            if b.num_rows() > 0 {
                batches.push(b);
            }
            if generator.next_event_number().is_none() {
                break;
            }
        }
        Ok(MicroBatch {
            batches,
            offsets: vec![SourceOffset {
                source: format!("nexmark/{}", self.table),
                partition: spec.instance as i32,
                offset: end as i64,
            }],
        })
    }
}
