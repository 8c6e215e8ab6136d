//! The Kinesis source on ministack:
//! * a watermark per shard (`event_time.rs`);
//! * a small pull budget takes a share of every shard (`pull_shares.rs`);
//! * a stream resharded while a windowed count runs (`reshard.rs`).

#[path = "../common/mod.rs"]
mod common;

mod event_time;
mod pull_shares;
mod reshard;
