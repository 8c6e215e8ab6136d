//! NEXMark:
//! * q0–q13 through the stage DAG, against single-process DataFusion and
//!   results computed here (`queries.rs`);
//! * q0–q9 and q11–q22 from live Kafka topics through SIGKILLs and
//!   restarts, against references computed without the engine
//!   (`updating.rs`).

#[path = "../common/mod.rs"]
mod common;

mod queries;
mod updating;
