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
pub mod error;
pub mod files;
// Avro, Protobuf, the schema registry, Debezium.
pub mod formats;
pub mod kafka;
pub mod kinesis;
mod options;
pub mod redis;
// Query results as Arrow IPC objects (S3 or files), read back by `skein run --backend lambda`.
pub mod results;
pub mod sink_table;
pub mod store;

use std::sync::Arc;

use skein_engine::planner::EMIT_OPTION;
use skein_engine::sink::SinkRegistry;
use skein_engine::source::SourceRegistry;

use crate::encode::ENCODER_OPTIONS;
use crate::sink_table::SinkTableFactory;

/// Register every source kind of this crate.
pub fn register(registry: &mut SourceRegistry) {
    registry.register(kafka::KIND, Arc::new(kafka::KafkaSourceFactory));
    registry.register(kinesis::KIND, Arc::new(kinesis::KinesisSourceFactory));
}

/// Register every sink kind of this crate, and a write-only table kind for
/// each so that `CREATE EXTERNAL TABLE ... STORED AS <KIND>` declares one.
pub fn register_sinks(sinks: &mut SinkRegistry, tables: &mut SourceRegistry) {
    sinks.register(redis::KIND, Arc::new(redis::RedisSinkFactory));
    tables.register(
        redis::KIND,
        Arc::new(SinkTableFactory::new(redis::OPTIONS, redis::check_config)),
    );
    tables.register_lookup(redis::KIND, Arc::new(redis::lookup::RedisLookupFactory));
    sinks.register(files::KIND, Arc::new(files::FilesSinkFactory));
    tables.register(
        files::KIND,
        Arc::new(SinkTableFactory::new(files::OPTIONS, |c| {
            files::format_of(c).map(drop)
        })),
    );
    sinks.register(blackhole::KIND, Arc::new(blackhole::BlackholeSinkFactory));
    tables.register(blackhole::KIND, Arc::new(blackhole::BlackholeTableFactory));
    // `STORED AS KAFKA` and `STORED AS KINESIS` tables are declared by their
    // sources; INSERT INTO one writes through these sinks, so the tables take
    // the sinks' options too (a table may be read and written).
    sinks.register(kinesis::KIND, Arc::new(kinesis::KinesisSinkFactory));
    tables.allow_options(kinesis::KIND, ENCODER_OPTIONS);
    tables.allow_options(kinesis::KIND, kinesis::SINK_OPTIONS);
    sinks.register(kafka::KIND, Arc::new(kafka::KafkaSinkFactory));
    tables.allow_options(kafka::KIND, ENCODER_OPTIONS);
    tables.allow_options(kafka::KIND, kafka::SINK_OPTIONS);
    // The planner reads `emit` from whichever table a query writes.
    for kind in [redis::KIND, files::KIND, kinesis::KIND, kafka::KIND] {
        tables.allow_options(kind, &[EMIT_OPTION]);
    }
}
