//! The generators as engine sources: `STORED AS NEXMARK` and `STORED AS YSB`
//! tables. Source instance `i` of `N` generates slice `i` of the stream, and
//! epoch `e` of `E` its e-th share, so a run over all epochs sees exactly the
//! events a single-process scan of the table sees.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use skein_engine::catalog::Catalog;
use skein_engine::error::{EngineError, Result};
use skein_engine::payload::SourceOffset;
use skein_engine::source::{
    EpochSpec, MicroBatch, ReplayMode, Source, SourceCapabilities, SourceConfig, SourceFactory,
    TableOptions,
};

use crate::Slice;
use crate::nexmark::{EventKind, NexmarkBatchBuilder, NexmarkConfig, NexmarkGenerator, schema_for};
use crate::ysb::{YsbBatchBuilder, YsbConfig, YsbGenerator, ysb_schema};

/// A generator's pull is a function of the epoch, and it ends.
const GENERATED: SourceCapabilities = SourceCapabilities {
    replay: ReplayMode::ByEpoch,
    live: false,
};

/// Events generated per batch inside one pull.
const CHUNK_EVENTS: u64 = 16_384;

/// Register the generator kinds in the catalog.
pub fn register(catalog: &mut Catalog) {
    catalog.register_source("NEXMARK", Arc::new(NexmarkSourceFactory));
    catalog.register_source("YSB", Arc::new(YsbSourceFactory));
}

/// A declared schema must be the generator's; none declared takes it.
fn check_declared(table: &str, declared: &SchemaRef, schema: &SchemaRef) -> Result<()> {
    if declared.fields().is_empty() {
        return Ok(());
    }
    for (d, g) in declared.fields().iter().zip(schema.fields().iter()) {
        if d.name() != g.name() || d.data_type() != g.data_type() {
            return Err(bad(
                table,
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
            table,
            format!("declare all {} columns or none", schema.fields().len()),
        ));
    }
    Ok(())
}

/// This instance's events of this epoch: `[start, end)` of its slice. A
/// bounded run over a known number of epochs splits the slice evenly; else
/// each epoch takes `per_epoch` events (one second of event time by default).
fn epoch_range(
    max_events: Option<u64>,
    slice: Slice,
    spec: &EpochSpec,
    per_epoch: u64,
) -> (u64, u64) {
    match (max_events, spec.epochs) {
        (Some(total), Some(epochs)) => {
            let len = slice.len_of(total);
            let per = len.div_ceil(epochs.max(1));
            // Saturating: near u64::MAX events the last epoch's end would wrap.
            (
                per.saturating_mul(spec.epoch).min(len),
                per.saturating_mul(spec.epoch.saturating_add(1)).min(len),
            )
        }
        _ => {
            let (s, e) = (
                per_epoch.saturating_mul(spec.epoch),
                per_epoch.saturating_mul(spec.epoch.saturating_add(1)),
            );
            match max_events {
                Some(total) => (s.min(slice.len_of(total)), e.min(slice.len_of(total))),
                None => (s, e),
            }
        }
    }
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
    EngineError::source_failed(table.to_string(), reason.into())
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

/// The options of a `STORED AS NEXMARK` table, read by [`Split::parse`].
pub const NEXMARK_OPTIONS: &[&str] = &["events", "rate", "seed", "partitions", "events_per_epoch"];
/// A `STORED AS YSB` table takes these and `base_time_ms`.
pub const YSB_OPTIONS: &[&str] = &[
    "events",
    "rate",
    "seed",
    "partitions",
    "events_per_epoch",
    "base_time_ms",
];

/// The options every generator table takes, and how they split the stream
/// over instances and epochs.
#[derive(Debug, Clone)]
struct Split {
    table: String,
    seed: Option<u64>,
    /// Events per second of event time (the generator's rate).
    rate: Option<u64>,
    max_events: Option<u64>,
    partitions: usize,
    events_per_epoch: Option<u64>,
}

impl Split {
    fn parse(table: &str, config: &SourceConfig) -> Result<Self> {
        let partitions: usize = parse_opt(config, "partitions")?.unwrap_or(1);
        if partitions == 0 {
            return Err(bad(table, "partitions must be at least 1"));
        }
        let max_events: Option<u64> = parse_opt(config, "events")?;
        // Positions travel as i64 offsets.
        if max_events.is_some_and(|n| n > i64::MAX as u64) {
            return Err(bad(
                table,
                format!("option \"events\" must be at most {}", i64::MAX),
            ));
        }
        Ok(Split {
            table: table.to_string(),
            seed: parse_opt(config, "seed")?,
            rate: parse_opt(config, "rate")?,
            max_events,
            partitions,
            events_per_epoch: parse_opt(config, "events_per_epoch")?,
        })
    }

    /// One instance's pull: its one partition, at `offset`, finished when
    /// the slice read up to `end` has no events left (only a table with a
    /// number of `events` ever ends).
    fn micro_batch(
        &self,
        generator: &str,
        batches: Vec<RecordBatch>,
        spec: &EpochSpec,
        slice: Slice,
        end: u64,
        offset: u64,
    ) -> MicroBatch {
        let offsets = vec![SourceOffset {
            source: format!("{generator}/{}", self.table),
            partition: spec.instance as i32,
            offset: offset as i64,
            position: None,
        }];
        let finished = self
            .max_events
            .is_some_and(|total| end >= slice.len_of(total));
        MicroBatch::single_partition(batches, offsets, spec.instance.to_string(), finished)
    }

    /// This instance's slice and its `[start, end)` events of this epoch;
    /// `rate` is the generator's events per second of event time.
    fn range(&self, spec: &EpochSpec, rate: u64) -> Result<(Slice, u64, u64)> {
        let slice = Slice::new(spec.instance as u32, spec.instances.max(1) as u32)
            .map_err(|e| bad(&self.table, e.to_string()))?;
        let per_epoch = self
            .events_per_epoch
            .unwrap_or_else(|| rate.div_ceil(spec.instances.max(1) as u64));
        let (start, end) = epoch_range(self.max_events, slice, spec, per_epoch);
        Ok((slice, start, end))
    }
}

struct NexmarkSourceFactory;

impl SourceFactory for NexmarkSourceFactory {
    fn options(&self) -> TableOptions {
        TableOptions::only(NEXMARK_OPTIONS)
    }

    fn capabilities(&self) -> SourceCapabilities {
        GENERATED
    }

    fn create(&self, config: &SourceConfig, declared: SchemaRef) -> Result<Arc<dyn Source>> {
        let table = config.location.to_ascii_lowercase();
        let kind = match table.as_str() {
            "person" => EventKind::Person,
            "auction" => EventKind::Auction,
            "bid" => EventKind::Bid,
            other => return Err(bad(other, "LOCATION must be 'person', 'auction' or 'bid'")),
        };
        let schema = schema_for(kind);
        check_declared(&table, &declared, &schema)?;
        let split = Split::parse(&table, config)?;
        let defaults = NexmarkConfig::default();
        let gen_config = NexmarkConfig {
            seed: split.seed.unwrap_or(defaults.seed),
            first_event_rate: split.rate.unwrap_or(defaults.first_event_rate),
            max_events: split.max_events,
            ..defaults
        };
        gen_config
            .validate()
            .map_err(|e| bad(&table, e.to_string()))?;
        Ok(Arc::new(NexmarkSource {
            kind,
            schema,
            config: gen_config,
            split,
        }))
    }
}

/// One NEXMark table fed by the generator.
#[derive(Debug)]
pub struct NexmarkSource {
    kind: EventKind,
    schema: SchemaRef,
    config: NexmarkConfig,
    split: Split,
}

#[async_trait]
impl Source for NexmarkSource {
    fn replay_mode(&self) -> ReplayMode {
        ReplayMode::ByEpoch
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn parallelism(&self) -> usize {
        self.split.partitions
    }

    async fn pull(&self, spec: EpochSpec) -> Result<MicroBatch> {
        let (slice, start, end) = self.split.range(&spec, self.config.first_event_rate)?;
        let table = &self.split.table;
        let mut generator = NexmarkGenerator::with_slice(self.config.clone(), slice)
            .map_err(|e| bad(table, e.to_string()))?;
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
            let out = builder.finish().map_err(|e| bad(table, e.to_string()))?;
            let b = out.get(self.kind).clone();
            if b.num_rows() > 0 {
                batches.push(b);
            }
            if generator.next_event_number().is_none() {
                break;
            }
        }
        Ok(self
            .split
            .micro_batch("nexmark", batches, &spec, slice, end, end))
    }
}

struct YsbSourceFactory;

impl SourceFactory for YsbSourceFactory {
    fn options(&self) -> TableOptions {
        TableOptions::only(YSB_OPTIONS)
    }

    fn capabilities(&self) -> SourceCapabilities {
        GENERATED
    }

    fn create(&self, config: &SourceConfig, declared: SchemaRef) -> Result<Arc<dyn Source>> {
        let table = config.location.clone();
        let schema = ysb_schema();
        check_declared(&table, &declared, &schema)?;
        let split = Split::parse(&table, config)?;
        let defaults = YsbConfig::default();
        let gen_config = YsbConfig {
            seed: split.seed.unwrap_or(defaults.seed),
            events_per_second: split.rate.unwrap_or(defaults.events_per_second),
            base_time_ms: parse_opt(config, "base_time_ms")?.unwrap_or(defaults.base_time_ms),
            max_events: split.max_events,
            ..defaults
        };
        gen_config
            .validate()
            .map_err(|e| bad(&table, e.to_string()))?;
        Ok(Arc::new(YsbSource {
            schema,
            config: gen_config,
            split,
        }))
    }
}

/// YSB's `ad_events` fed by the generator (`STORED AS YSB`), with the same
/// options as a NEXMark table: `events`, `rate`, `seed`, `partitions`,
/// `events_per_epoch`, and `base_time_ms` (event time of event 0).
#[derive(Debug)]
pub struct YsbSource {
    schema: SchemaRef,
    config: YsbConfig,
    split: Split,
}

#[async_trait]
impl Source for YsbSource {
    fn replay_mode(&self) -> ReplayMode {
        ReplayMode::ByEpoch
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn parallelism(&self) -> usize {
        self.split.partitions
    }

    async fn pull(&self, spec: EpochSpec) -> Result<MicroBatch> {
        let (slice, start, end) = self.split.range(&spec, self.config.events_per_second)?;
        let table = &self.split.table;
        let mut generator = YsbGenerator::with_slice(self.config.clone(), slice)
            .map_err(|e| bad(table, e.to_string()))?;
        generator.seek(start);
        let mut batches = vec![];
        let mut builder = YsbBatchBuilder::with_capacity(CHUNK_EVENTS.min(end - start) as usize);
        let mut produced = start;
        while produced < end {
            match generator.next_event() {
                Some(ev) => builder.append(&ev),
                None => break,
            }
            produced += 1;
            if builder.len() as u64 == CHUNK_EVENTS {
                batches.push(builder.finish().map_err(|e| bad(table, e.to_string()))?);
            }
        }
        if !builder.is_empty() {
            batches.push(builder.finish().map_err(|e| bad(table, e.to_string()))?);
        }
        Ok(self
            .split
            .micro_batch("ysb", batches, &spec, slice, end, produced))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray, RecordBatch};
    use datafusion::arrow::datatypes::Schema;
    use std::collections::BTreeMap;

    fn ysb_table(options: &[(&str, &str)]) -> Arc<dyn Source> {
        let config = SourceConfig {
            kind: "YSB".into(),
            location: "ad_events".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        };
        YsbSourceFactory
            .create(&config, Arc::new(Schema::empty()))
            .unwrap()
    }

    #[test]
    fn huge_event_counts_neither_wrap_nor_panic() {
        let slice = Slice::new(0, 1).unwrap();
        let spec = |epoch, epochs| EpochSpec {
            instance: 0,
            instances: 1,
            epoch,
            epochs,
        };
        let total = i64::MAX as u64;
        assert_eq!(
            epoch_range(Some(total), slice, &spec(1, Some(2)), 1),
            (total.div_ceil(2), total)
        );
        assert_eq!(
            epoch_range(Some(u64::MAX), slice, &spec(1, Some(2)), 1).1,
            u64::MAX
        );
        assert_eq!(
            epoch_range(Some(10), slice, &spec(3, None), u64::MAX),
            (10, 10)
        );
        assert_eq!(
            epoch_range(None, slice, &spec(u64::MAX, None), 2),
            (u64::MAX, u64::MAX)
        );
        let config = SourceConfig {
            kind: "YSB".into(),
            location: "ad_events".into(),
            options: [("events".to_string(), u64::MAX.to_string())].into(),
        };
        let err = YsbSourceFactory
            .create(&config, Arc::new(Schema::empty()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"events\" must be at most"), "{err}");
    }

    #[tokio::test]
    async fn a_huge_epoch_length_pulls_what_is_left() {
        let t = ysb_table(&[
            ("events", "10"),
            ("events_per_epoch", &u64::MAX.to_string()),
        ]);
        for epoch in 0..3 {
            let spec = EpochSpec {
                instance: 0,
                instances: 1,
                epoch,
                epochs: None,
            };
            let rows: usize = t
                .pull(spec)
                .await
                .unwrap()
                .batches
                .iter()
                .map(|b| b.num_rows())
                .sum();
            assert_eq!(rows, if epoch == 0 { 10 } else { 0 });
        }
    }

    fn ad_ids(batches: &[RecordBatch]) -> Vec<String> {
        batches
            .iter()
            .flat_map(|b| {
                let a = b.column(2).as_string::<i32>();
                (0..a.len())
                    .map(|i| a.value(i).to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[tokio::test]
    async fn ysb_table_epochs_and_instances_cover_the_stream_once() {
        let events = 10_000u64;
        let table = ysb_table(&[("events", "10000"), ("partitions", "3")]);
        let mut rows = 0usize;
        let mut per_instance = vec![];
        for instance in 0..3 {
            let mut got = vec![];
            for epoch in 0..4 {
                let mb = table
                    .pull(EpochSpec {
                        instance,
                        instances: 3,
                        epoch,
                        epochs: Some(4),
                    })
                    .await
                    .unwrap();
                rows += mb.batches.iter().map(|b| b.num_rows()).sum::<usize>();
                got.extend(ad_ids(&mb.batches));
            }
            per_instance.push(got);
        }
        assert_eq!(rows as u64, events);
        // Slice i holds events i, i+3, ...: compare with one generator.
        let mut single = YsbGenerator::new(YsbConfig {
            max_events: Some(events),
            ..YsbConfig::default()
        })
        .unwrap();
        let mut n = 0usize;
        while let Some(ev) = single.next_event() {
            assert_eq!(per_instance[n % 3][n / 3], ev.ad_id, "event {n}");
            n += 1;
        }
        assert_eq!(n as u64, events);
    }

    #[test]
    fn ysb_table_rejects_a_wrong_declared_schema() {
        let config = SourceConfig {
            kind: "YSB".into(),
            location: "ad_events".into(),
            options: BTreeMap::new(),
        };
        let declared = Arc::new(Schema::new(vec![datafusion::arrow::datatypes::Field::new(
            "ad",
            datafusion::arrow::datatypes::DataType::Utf8,
            false,
        )]));
        let err = YsbSourceFactory
            .create(&config, declared)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not match"), "{err}");
    }
}
