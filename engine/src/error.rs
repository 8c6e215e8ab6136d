//! The engine's error type. Every error that concerns a payload names its
//! uuid and the stage that saw it, so a failed invocation can be traced.

use datafusion::error::DataFusionError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("payload {uuid} at stage {stage}: {reason}")]
    BadPayload {
        uuid: String,
        stage: String,
        reason: String,
    },
    #[error("payload envelope is not valid JSON: {0}")]
    BadEnvelope(String),
    #[error("cloud context: {0}")]
    Context(String),
    #[error("planning: {0}")]
    Plan(String),
    #[error("function {0} is not deployed")]
    UnknownFunction(String),
    #[error("function {name} is throttled (concurrency {limit})")]
    Throttled { name: String, limit: usize },
    #[error("invocation of {name} failed: {reason}")]
    Invocation { name: String, reason: String },
    #[error("source {source_name}: {reason}")]
    Source { source_name: String, reason: String },
    #[error("sink {sink}: {reason}")]
    Sink { sink: String, reason: String },
    #[error("incomplete input: {0}")]
    Incomplete(String),
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
    #[error(transparent)]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl EngineError {
    pub fn plan(msg: impl Into<String>) -> Self {
        EngineError::Plan(msg.into())
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
