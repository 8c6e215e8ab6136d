//! Skein's connectors: the sources and lookup tables, one module per
//! external system.
//! * Kafka and Kinesis: sources that pull per epoch (Kinesis also takes the
//!   batches a Lambda event-source mapping pushes);
//! * Redis: lookup tables joined with a stream.
//!
//! Sinks are in skein-sinks. What both share is below them: the record
//! formats (decoders, encoders, the schema registry) in skein-formats;
//! client setup (Kafka properties, the Redis connection, the Kinesis
//! client, the one error) in skein-clients.

pub mod kafka;
pub mod kinesis;
mod options;
pub mod redis;

pub use skein_clients::error;

use std::sync::Arc;

use skein_engine::catalog::Catalog;

/// Register every kind of this crate in the catalog: a line per source and
/// lookup factory.
pub fn register(catalog: &mut Catalog) {
    catalog.register_source(kafka::KIND, Arc::new(kafka::KafkaSourceFactory));
    catalog.register_browser(kafka::KIND, Arc::new(kafka::browse::KafkaBrowser));
    catalog.register_source(kinesis::KIND, Arc::new(kinesis::KinesisSourceFactory));
    catalog.register_browser(kinesis::KIND, Arc::new(kinesis::browse::KinesisBrowser));
    catalog.register_lookup(redis::KIND, Arc::new(redis::lookup::RedisLookupFactory));
}
