//! The Lambda backend on ministack, with the real `skein-function` binary
//! as every function's bootstrap:
//! * `skein deploy / run / status / destroy --backend lambda` (`backend.rs`);
//! * checkpoints on S3 through killed bootstraps (`checkpoints.rs`);
//! * `skein cost --backend lambda` (`cost.rs`);
//! * the embedded-metric-format lines in the functions' logs (`emf.rs`);
//! * Kinesis pushed by an event-source mapping (`push.rs`), into a tumbling
//!   aggregate (`push_windows.rs`);
//! * a standing query with no local process (`standing.rs`).

#[path = "../common/mod.rs"]
mod common;

mod backend;
mod checkpoints;
mod cost;
mod emf;
mod push;
mod push_windows;
mod standing;
