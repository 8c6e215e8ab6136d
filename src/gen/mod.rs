//! `skein gen nexmark|ysb --to kafka://host:port/topic | kinesis://stream`:
//! publishes generated events through the Kafka or Kinesis sink.
//!
//! Each event is rendered as the JSON record its benchmark defines (YSB's
//! reference fields with `event_time` as a string of ms; NEXMark's flat
//! records with times as ms) and written as a `raw` value, so what lands in
//! the topic is byte for byte what a reference consumer expects. NEXMark
//! goes to one topic or stream per table, `<name>-person`, `<name>-auction`
//! and `<name>-bid`, or just `<name>` with `--table`.
//!
//! `--format` publishes the same events as Avro or Protobuf instead
//! (`format.rs`); the flags are in `args.rs`.
//!
//! With `--rate` the publisher paces itself against the wall clock; the
//! progress bar shows how far it lags behind that target. Event time starts
//! now and advances at `--event-rate` events per second (default `--rate`,
//! else the benchmark generator's own rate), whatever the wall clock does.
//!
//! Within a Kafka partition records are in event-time order: writes to one
//! topic are enqueued in generation order and only their acknowledgements
//! are awaited concurrently (`--in-flight`); the idempotent producer keeps a
//! partition in queue order through retries. Kinesis writes to one stream
//! run one after another, so shards are in order too unless PutRecords
//! throttles some entries: those are retried after the entries that got in.

mod args;
mod format;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use datafusion::arrow::array::{BinaryBuilder, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use indicatif::{ProgressBar, ProgressStyle};
use skein_engine::sink::{Sink, SinkRows, SinkWrite};
use skein_generators::nexmark::{EventKind, JsonLayout, NexmarkConfig, NexmarkGenerator};
use skein_generators::ysb::{YsbConfig, YsbGenerator};
use skein_sinks::kafka::Acks;
use skein_sinks::kafka::KafkaSink;
use skein_sinks::kinesis::{KinesisSink, ensure_stream};
use tokio::task::JoinSet;

use format::{RecordFormat, table_schemas, transcode};

pub use args::{Benchmark, GenArgs, NexmarkTable};

/// Where events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    Kafka { brokers: String, topic: String },
    Kinesis { stream: String },
}

impl Destination {
    pub fn parse(url: &str) -> Result<Self> {
        if let Some(rest) = url.strip_prefix("kafka://") {
            let (brokers, topic) = rest
                .split_once('/')
                .filter(|(b, t)| !b.is_empty() && !t.is_empty() && !t.contains('/'))
                .with_context(|| format!("{url:?}: expected kafka://host:port/topic"))?;
            return Ok(Destination::Kafka {
                brokers: brokers.to_string(),
                topic: topic.to_string(),
            });
        }
        if let Some(stream) = url.strip_prefix("kinesis://") {
            if stream.is_empty() || stream.contains('/') {
                bail!("{url:?}: expected kinesis://stream");
            }
            return Ok(Destination::Kinesis {
                stream: stream.to_string(),
            });
        }
        bail!("{url:?}: --to takes kafka://host:port/topic or kinesis://stream")
    }

    fn name(&self) -> &str {
        match self {
            Destination::Kafka { topic, .. } => topic,
            Destination::Kinesis { stream } => stream,
        }
    }

    fn with_name(&self, name: String) -> Self {
        match self {
            Destination::Kafka { brokers, .. } => Destination::Kafka {
                brokers: brokers.clone(),
                topic: name,
            },
            Destination::Kinesis { .. } => Destination::Kinesis { stream: name },
        }
    }

    /// Creates the topic or stream if missing, and opens a sink on it: of
    /// raw values, or of rows in the record format `format`.
    async fn open(
        &self,
        partitions: i32,
        format: Option<BTreeMap<String, String>>,
    ) -> Result<Publisher> {
        let mut options: BTreeMap<String, String> = match self {
            Destination::Kafka { brokers, .. } => vec![
                ("bootstrap.servers", brokers.as_str()),
                ("format", "raw"),
                ("value", "value"),
                // Publishing enqueues rows in order; it keeps no epochs.
                ("delivery", "at-least-once"),
            ],
            Destination::Kinesis { .. } => vec![
                ("format", "raw"),
                ("value", "value"),
                ("max.attempts", "50"),
            ],
        }
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(format) = format {
            options.remove("value");
            options.extend(format);
        }
        Ok(match self {
            Destination::Kafka { brokers, topic } => {
                skein_sinks::kafka::ensure_topic(brokers, topic, partitions, &[]).await?;
                Publisher::Kafka(KafkaSink::new(topic, &options)?)
            }
            Destination::Kinesis { stream } => {
                ensure_stream(stream, partitions).await?;
                Publisher::Kinesis(KinesisSink::new(stream, &options)?)
            }
        })
    }
}

/// Writes one destination's batches in the order they are started.
enum Publisher {
    Kafka(KafkaSink),
    Kinesis(KinesisSink),
}

/// A started write: what is left to wait for.
enum InFlight {
    Kafka(Acks),
    Done,
}

impl InFlight {
    async fn wait(self) -> skein_engine::Result<()> {
        match self {
            InFlight::Kafka(acks) => acks.wait().await,
            InFlight::Done => Ok(()),
        }
    }
}

impl Publisher {
    /// Starts writing `batch` after everything started before it. Kafka
    /// returns once the rows are enqueued; Kinesis once they are in, since
    /// concurrent PutRecords calls would interleave a shard.
    async fn start(&self, schema: SchemaRef, batch: RecordBatch) -> skein_engine::Result<InFlight> {
        match self {
            Publisher::Kafka(sink) => Ok(InFlight::Kafka(sink.enqueue(&[batch]).await?)),
            Publisher::Kinesis(sink) => {
                sink.write(SinkWrite {
                    query: "gen",
                    run: "",
                    epoch: 0,
                    member: 0,
                    schema,
                    rows: SinkRows::Append(vec![batch]),
                    offsets: vec![],
                    last: false,
                })
                .await?;
                Ok(InFlight::Done)
            }
        }
    }
}

/// Renders events as JSON records, per output.
trait EventSource {
    /// Appends up to `max` events to the builders (one per output); returns
    /// how many it appended, 0 when the stream is exhausted.
    fn fill(&mut self, max: u64, out: &mut [BinaryBuilder], buf: &mut Vec<u8>) -> u64;
}

struct Ysb(YsbGenerator);

impl EventSource for Ysb {
    fn fill(&mut self, max: u64, out: &mut [BinaryBuilder], buf: &mut Vec<u8>) -> u64 {
        let mut n = 0;
        while n < max {
            let Some(ev) = self.0.next_event() else { break };
            buf.clear();
            ev.write_json(buf);
            out[0].append_value(&buf);
            n += 1;
        }
        n
    }
}

struct Nexmark {
    generator: NexmarkGenerator,
    /// Output index per kind (person, auction, bid); `None` drops the kind.
    route: [Option<usize>; 3],
}

impl EventSource for Nexmark {
    fn fill(&mut self, max: u64, out: &mut [BinaryBuilder], buf: &mut Vec<u8>) -> u64 {
        let mut n = 0;
        while n < max {
            buf.clear();
            let Some(kind) = self.generator.next_json(JsonLayout::Flat, buf) else {
                break;
            };
            let slot = match kind {
                EventKind::Person => self.route[0],
                EventKind::Auction => self.route[1],
                EventKind::Bid => self.route[2],
            };
            if let Some(i) = slot {
                out[i].append_value(&buf);
                n += 1;
            }
        }
        n
    }
}

fn value_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "value",
        DataType::Binary,
        false,
    )]))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What a publishing run did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GenReport {
    pub benchmark: String,
    pub destinations: Vec<String>,
    pub events: u64,
    pub elapsed_s: f64,
    pub events_per_s: f64,
    pub target_rate: Option<u64>,
    /// Events per second of event time the generator used.
    pub event_rate: u64,
    /// Events behind the target rate when the run ended (0 without --rate).
    pub lag_events: u64,
}

pub async fn gen_command(a: GenArgs) -> Result<()> {
    let report = publish(&a).await?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "published {} {} events to {} in {:.2} s ({:.0} events/s, event time at {}/s{})",
            report.events,
            report.benchmark,
            report.destinations.join(", "),
            report.elapsed_s,
            report.events_per_s,
            report.event_rate,
            match report.target_rate {
                Some(r) => format!(", target {r}/s, {} behind at the end", report.lag_events),
                None => String::new(),
            }
        );
    }
    Ok(())
}

/// Events due after `elapsed_s` at `rate`, counted in whole chunks: a chunk
/// is sent once its last event is due, so the one being filled is not late.
fn whole_chunks_due(elapsed_s: f64, rate: u64, chunk: u64) -> u64 {
    let due = (elapsed_s * rate as f64) as u64;
    due - due % chunk.max(1)
}

/// The topics or streams `a` publishes to: one, or NEXMark's three.
fn destination_names(a: &GenArgs, destination: &Destination) -> Vec<String> {
    let base = destination.name();
    match (a.benchmark, a.table) {
        (Benchmark::Nexmark, NexmarkTable::All) => vec![
            format!("{base}-person"),
            format!("{base}-auction"),
            format!("{base}-bid"),
        ],
        _ => vec![base.to_string()],
    }
}

/// The generator of `a`'s benchmark, its event time starting at
/// `base_time_ms`.
fn event_source(
    a: &GenArgs,
    event_rate: u64,
    base_time_ms: i64,
) -> Result<Box<dyn EventSource + Send>> {
    Ok(match a.benchmark {
        Benchmark::Ysb => {
            let mut config = YsbConfig {
                seed: a.seed,
                base_time_ms,
                ..YsbConfig::default()
            };
            config.events_per_second = event_rate;
            Box::new(Ysb(YsbGenerator::new(config)?))
        }
        Benchmark::Nexmark => {
            let mut config = NexmarkConfig {
                seed: a.seed,
                base_time_ms,
                ..NexmarkConfig::default()
            };
            config.first_event_rate = event_rate;
            // Which of the destinations each of person, auction, bid goes to.
            let route = match a.table {
                NexmarkTable::All => [Some(0), Some(1), Some(2)],
                NexmarkTable::Person => [Some(0), None, None],
                NexmarkTable::Auction => [None, Some(0), None],
                NexmarkTable::Bid => [None, None, Some(0)],
            };
            Box::new(Nexmark {
                generator: NexmarkGenerator::new(config)?,
                route,
            })
        }
    })
}

pub async fn publish(a: &GenArgs) -> Result<GenReport> {
    if a.events.is_none() && a.duration.is_none() {
        bail!("say how much to publish: --events N and/or --duration D");
    }
    if a.rate == Some(0) {
        bail!("--rate must be at least 1 event/s");
    }
    let event_rate = event_rate(a)?;
    let destination = Destination::parse(&a.to)?;
    let names = destination_names(a, &destination);
    let format = RecordFormat::of(a)?;
    let tables = table_schemas(a);
    let mut sinks = Vec::with_capacity(names.len());
    for (n, table) in names.iter().zip(&tables) {
        let d = destination.with_name(n.clone());
        let options = format.as_ref().map(|f| f.sink_options(table)).transpose()?;
        let rows = match format {
            Some(_) => Some(RecordFormat::rows_of(table)?),
            None => None,
        };
        let sink = d
            .open(a.partitions, options)
            .await
            .with_context(|| format!("opening {d:?}"))?;
        sinks.push((sink, rows, table.clone()));
    }
    let destinations: Vec<String> = names
        .iter()
        .map(|n| match &destination {
            Destination::Kafka { brokers, .. } => format!("kafka://{brokers}/{n}"),
            Destination::Kinesis { .. } => format!("kinesis://{n}"),
        })
        .collect();

    let bar = if a.json {
        ProgressBar::hidden()
    } else {
        match a.events {
            Some(n) => ProgressBar::new(n),
            None => ProgressBar::no_length(),
        }
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {human_pos}/{human_len} sent {wide_bar} {per_sec} {msg} [{elapsed}]",
        )
        .expect("progress template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));

    // Chunks small enough to pace a rate smoothly (about 20 per second).
    let chunk = a.rate.map_or(20_000, |r| (r / 20).clamp(1, 20_000));
    // Event time starts when sending does, not before the destinations
    // were opened: otherwise every event would be sent that much after its
    // own time, and a latency measured from event time would include it.
    let base_time_ms = now_ms();
    let started = Instant::now();
    let mut source = event_source(a, event_rate, base_time_ms)?;
    let mut sent = 0u64;
    let mut acks: JoinSet<skein_engine::Result<()>> = JoinSet::new();
    let mut buf = Vec::with_capacity(1024);
    let schema = value_schema();
    loop {
        let want = match a.events {
            Some(total) => chunk.min(total - sent),
            None => chunk,
        };
        if want == 0 || a.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if let Some(rate) = a.rate {
            // Wait until the chunk's last event is due, so that no event is
            // sent before its own event time (a real producer cannot).
            let due = Duration::from_secs_f64((sent + want) as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        let mut builders: Vec<BinaryBuilder> = (0..sinks.len())
            .map(|_| BinaryBuilder::with_capacity(want as usize / sinks.len() + 1, 0))
            .collect();
        let n = source.fill(want, &mut builders, &mut buf);
        if n == 0 {
            break;
        }
        for (i, mut b) in builders.into_iter().enumerate() {
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(b.finish())])?;
            if batch.num_rows() == 0 {
                continue;
            }
            while acks.len() >= a.in_flight.max(1) {
                if let Some(done) = acks.join_next().await {
                    done.context("a write task failed")??;
                }
            }
            // Started here, in generation order; only the waiting is concurrent.
            let (sink, rows, table) = &sinks[i];
            let write = match rows {
                Some(rows) => sink.start(table.clone(), transcode(rows, &batch)?).await?,
                None => sink.start(schema.clone(), batch).await?,
            };
            acks.spawn(write.wait());
        }
        sent += n;
        bar.set_position(sent);
        if let Some(rate) = a.rate {
            let lag = whole_chunks_due(started.elapsed().as_secs_f64(), rate, chunk);
            bar.set_message(format!("lag {}", lag.saturating_sub(sent)));
        }
    }
    while let Some(done) = acks.join_next().await {
        done.context("a write task failed")??;
    }
    bar.finish_and_clear();
    let elapsed_s = started.elapsed().as_secs_f64();
    let lag_events = a.rate.map_or(0, |rate| {
        whole_chunks_due(elapsed_s, rate, chunk)
            .saturating_sub(sent)
            .min(a.events.map_or(u64::MAX, |t| t - sent))
    });
    Ok(GenReport {
        benchmark: match a.benchmark {
            Benchmark::Nexmark => "nexmark".into(),
            Benchmark::Ysb => "ysb".into(),
        },
        destinations,
        events: sent,
        elapsed_s,
        events_per_s: sent as f64 / elapsed_s.max(1e-9),
        target_rate: a.rate,
        event_rate,
        lag_events,
    })
}

/// The most events per second of event time: one per nanosecond, the YSB
/// generator's resolution.
const MAX_EVENT_RATE: u64 = 1_000_000_000;

/// Events per second of event time: `--event-rate`, else `--rate`, else the
/// benchmark generator's default.
fn event_rate(a: &GenArgs) -> Result<u64> {
    if a.event_rate == Some(0) {
        bail!("--event-rate must be at least 1 event/s");
    }
    let rate = a.event_rate.or(a.rate).unwrap_or(match a.benchmark {
        Benchmark::Nexmark => NexmarkConfig::default().first_event_rate,
        Benchmark::Ysb => YsbConfig::default().events_per_second,
    });
    if rate > MAX_EVENT_RATE {
        bail!("event rate {rate}/s (--event-rate, default --rate) is above {MAX_EVENT_RATE}/s");
    }
    Ok(rate)
}

#[cfg(test)]
mod tests;
