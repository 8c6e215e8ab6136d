//! Kafka: the source reads partitions per epoch with offsets it logs
//! (`source.rs` the table, `config.rs` its options, `reader.rs` the pull
//! engine, `consumer.rs` the batch consumer, `offsets.rs` the offsets
//! text, `dead_letters.rs` the dead-letter topic, `log_note.rs` the offsets
//! log between checkpoints, kept in a consumer group). The sink is in skein-sinks;
//! the client setup both sides share in skein-clients.

pub mod browse;
mod config;
mod consumer;
mod dead_letters;
mod log_note;
mod offsets;
mod reader;
mod source;

pub use config::{KafkaSourceConfig, SOURCE_OPTIONS, Startup};
pub use consumer::{BatchConsumer, Fetched};
pub use dead_letters::{DeadLetter, KafkaDeadLetters};
pub use log_note::note_group;
pub use offsets::{format_offsets, parse_offsets};
pub use skein_clients::kafka::{FETCH_DEFAULTS, KIND, KafkaRole, client_config, client_properties};
pub use source::*;
