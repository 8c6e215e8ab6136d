//! skein-engine: a SQL query as a DAG of functions that hand Arrow data to
//! each other inside their invocation payloads.
//!
//! * [`planner`] cuts a DataFusion physical plan into stages;
//! * [`context`] is what each function carries in its environment;
//! * [`payload`] is the envelope data travels in; [`arena`] collects it;
//! * [`function`] is the one generic handler; [`local`] runs it in-process;
//! * [`invoke`] holds the traits the Lambda backend implements too;
//! * [`source`] and [`sink`] are the traits connectors implement; the
//!   [`catalog`] knows every table kind, its options and what it can do;
//! * [`watermark`] is event time at the sources; [`window_state`] holds the
//!   open windows of a stage.

#![warn(missing_docs)]

pub mod admit;
pub mod arena;
pub mod autoscale;
pub mod backoff;
pub mod catalog;
pub mod changelog;
pub mod checkpoint;
pub mod clock;
pub mod codec;
pub mod compaction;
pub mod context;
pub mod crash_point;
pub mod dead_letter;
pub mod driver;
pub mod epochs;
pub mod error;
pub mod exec;
pub mod function;
pub mod interval;
pub mod invoke;
pub mod ipc_decode;
pub mod ipc_schema;
pub mod key_groups;
pub mod local;
pub mod lookup;
pub mod metrics;
pub mod payload;
pub mod planner;
#[cfg(feature = "sql")]
pub mod preview;
pub mod query;
pub mod request;
pub mod ring;
pub mod running;
pub mod session;
pub mod sink;
pub mod sink_health;
pub mod source;
pub mod status;
pub mod table_options;
pub mod udf;
pub mod updating;
pub mod usage;
pub mod verify;
pub mod watermark;
pub mod window;
pub mod window_state;

pub use error::{EngineError, Result};
