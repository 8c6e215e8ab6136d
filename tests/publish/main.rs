//! Publishing on the real services:
//! * `skein gen` to Kafka and Kinesis (`generate.rs`);
//! * the message sinks, `INSERT INTO` Kafka and Kinesis tables (`sinks.rs`).

#[path = "../common/mod.rs"]
mod common;

mod generate;
mod sinks;
