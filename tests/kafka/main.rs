//! The Kafka source and sink on the real broker:
//! * a record too large for its dead letter still gets one (`dead_letters.rs`);
//! * the offsets log kept in Kafka between checkpoints (`offsets_note.rs`);
//! * a small pull budget takes a share of every partition, and instances
//!   per partition up to the cores (`pull_shares.rs`);
//! * the sink's exactly-once delivery through replays (`sink.rs`).

#[path = "../common/mod.rs"]
mod common;

mod dead_letters;
mod offsets_note;
mod pull_shares;
mod sink;
