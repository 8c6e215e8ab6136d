//! The arguments of `skein gen`: which benchmark's events, where to, how
//! many, how fast and in which record format.

use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::args::parse_duration;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Benchmark {
    Nexmark,
    Ysb,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NexmarkTable {
    Person,
    Auction,
    Bid,
    All,
}

#[derive(Args, Debug, Clone)]
pub struct GenArgs {
    /// Which benchmark's events.
    pub benchmark: Benchmark,
    /// Where to: kafka://host:port[,host:port]/topic or kinesis://stream.
    #[arg(long)]
    pub to: String,
    /// Events to publish (all tables together for NEXMark).
    #[arg(long)]
    pub events: Option<u64>,
    /// Events per second of wall-clock time; as fast as possible without it.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Events per second of event time, how far apart generated events'
    /// times are (NEXMark's first_event_rate) [default: --rate if given,
    /// else NEXMark 10000, YSB 100000].
    #[arg(long)]
    pub event_rate: Option<u64>,
    /// Stop after this long (30s, 2m, ...).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// NEXMark: publish one table only, to exactly the named topic or stream.
    #[arg(long, value_enum, default_value_t = NexmarkTable::All)]
    pub table: NexmarkTable,
    /// Generator seed (YSB: the same default as `skein ysb setup`, so the
    /// events' ads have campaigns in Redis).
    #[arg(long, default_value_t = skein_generators::ysb::DEFAULT_SEED)]
    pub seed: u64,
    /// Partitions (Kafka) or shards (Kinesis) of a topic or stream this
    /// command creates because it does not exist yet.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Writes in flight at once (each waits for its acknowledgements).
    #[arg(long, default_value_t = 4)]
    pub in_flight: usize,
    /// Record format: json (the benchmark's reference records), avro,
    /// avro-confluent, protobuf or protobuf-confluent (docs/formats.md).
    #[arg(long, default_value = "json")]
    pub format: String,
    /// An option of the format, e.g. schema.registry.url=http://host:8081.
    #[arg(long = "option", value_name = "KEY=VALUE")]
    pub options: Vec<String>,
    /// One JSON line at the end instead of text.
    #[arg(long)]
    pub json: bool,
}
