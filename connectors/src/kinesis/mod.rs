//! Kinesis: the source reads shards per epoch, or takes the batches a
//! Lambda event-source mapping pushes (`source.rs` the table, `config.rs`
//! its options, `stream.rs` the client, decoder and dead letters both ways
//! share, `reader.rs` the shard reader, `shards.rs` listing and resharding).
//! The sink is in skein-sinks.

pub mod browse;
mod config;
mod reader;
mod shards;
mod source;
mod stream;

pub use config::{KinesisSourceConfig, KinesisStartup, SOURCE_OPTIONS};
pub use source::*;

pub use skein_clients::kinesis::KIND;
