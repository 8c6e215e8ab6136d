//! Skein's connectors, one module per external system, each owning both
//! directions it supports:
//! * Kafka and Kinesis: sources (pull per epoch; Kinesis also takes pushed
//!   batches) and sinks (a message per row);
//! * Redis: a sink (string, hash and list layouts, and an extension point
//!   for others, [`redis::RedisLayout`]) and lookup tables joined
//!   with a stream;
//! * files on a local disk or S3, and a blackhole that only counts: sinks;
//! * record decoders (JSON, CSV, raw) straight into Arrow, and the row
//!   encoders of the message sinks.
//!
//! Redis, Kafka and files are exactly once at any group size: each write is
//! keyed by (run, epoch, member) and a replay changes nothing (see
//! [`epochs`]).

// Drops rows and counts them: a benchmark's sink.
pub mod blackhole;
pub mod decode;
pub mod encode;
pub mod epochs;
pub mod files;
pub mod kafka;
pub mod kinesis;
mod options;
pub mod redis;
// Query results as Arrow IPC objects (S3 or files), read back by `skein run --backend lambda`.
pub mod results;

pub use skein_clients::{error, store};

use std::sync::Arc;

use skein_engine::catalog::Catalog;

/// Register every kind of this crate in the catalog: a line per source,
/// sink and lookup factory.
pub fn register(catalog: &mut Catalog) {
    catalog.register_source(kafka::KIND, Arc::new(kafka::KafkaSourceFactory));
    catalog.register_sink(kafka::KIND, Arc::new(kafka::KafkaSinkFactory));
    catalog.register_source(kinesis::KIND, Arc::new(kinesis::KinesisSourceFactory));
    catalog.register_sink(kinesis::KIND, Arc::new(kinesis::KinesisSinkFactory));
    catalog.register_sink(redis::KIND, Arc::new(redis::RedisSinkFactory));
    catalog.register_lookup(redis::KIND, Arc::new(redis::lookup::RedisLookupFactory));
    catalog.register_sink(files::KIND, Arc::new(files::FilesSinkFactory));
    catalog.register_sink(blackhole::KIND, Arc::new(blackhole::BlackholeSinkFactory));
}
