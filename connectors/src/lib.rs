//! Sources of Skein: Kafka and Kinesis (pull, partitions or shards assigned
//! per source instance) and record decoders (JSON, CSV, raw) straight into
//! Arrow.

pub mod decode;
pub mod error;
pub mod kafka;
pub mod kinesis;
mod options;

use std::sync::Arc;

use skein_engine::source::SourceRegistry;

/// Register every source kind of this crate.
pub fn register(registry: &mut SourceRegistry) {
    registry.register(kafka::KIND, Arc::new(kafka::KafkaSourceFactory));
    registry.register(kinesis::KIND, Arc::new(kinesis::KinesisSourceFactory));
}
