//! Exactly once through crashes, stops and restarts from a checkpoint:
//! * a windowed count and sum per key killed with SIGKILL and restarted,
//!   into each exactly-once sink (`durable_state.rs`);
//! * a standing query stopped by SIGTERM and SIGINT and restarted, then
//!   drained (`standing_query.rs`);
//! * checkpoints on an S3 Express One Zone directory bucket, resumed after
//!   a stop midway (`s3_express.rs`);
//! * a group rescaled by hand while a standing query runs, through a kill
//!   (`rescale.rs`).

#[path = "../common/mod.rs"]
mod common;

mod durable_state;
mod rescale;
mod s3_express;
mod standing_query;
