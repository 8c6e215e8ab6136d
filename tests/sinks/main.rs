//! Sinks on the real services:
//! * the Redis sink's layouts and replays (`redis.rs`);
//! * the exactly-once Kafka sink's offsets topic read back (`offsets_topic.rs`);
//! * a sink that cannot write: a bounded run ends, a standing run rides the
//!   outage out (`outage.rs`).

#[path = "../common/mod.rs"]
mod common;

mod offsets_topic;
mod outage;
mod redis;
