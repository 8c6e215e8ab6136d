//! The one error type of the connectors crate, sources and sinks alike.
//!
//! A connector's error knows its cause but not which table it serves; turn
//! it into an [`EngineError`] with [`ConnectorError::for_source`] or
//! [`ConnectorError::for_sink`], which name the source or sink and keep this
//! error as the [`std::error::Error::source`].

use std::error::Error as StdError;

use skein_engine::error::{Cause, EngineError};

/// What went wrong in a connector.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// A table option that is missing, unknown or malformed.
    #[error("bad option: {0}")]
    Config(String),
    /// Kafka (librdkafka) failed.
    #[error("kafka: {}", with_context(.doing, .cause))]
    Kafka {
        /// What the connector was doing (a call, a topic); may be empty.
        doing: String,
        /// librdkafka's error.
        #[source]
        cause: rdkafka::error::KafkaError,
    },
    /// A Kinesis API call failed.
    #[error("kinesis {call}: {detail}")]
    Kinesis {
        /// The API call, e.g. `GetRecords shardId-000000000001`.
        call: String,
        /// The SDK's error with its context, on one line.
        detail: String,
        /// The SDK's error.
        #[source]
        cause: Cause,
    },
    /// Redis failed (after the retries the connection allows).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The object store (S3, a local directory) failed.
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    /// A local file failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Arrow failed to build or encode a batch.
    #[error("arrow: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    /// A background task (a blocking client call) panicked or was cancelled.
    #[error("{0} task failed: {1}")]
    Task(&'static str, #[source] tokio::task::JoinError),
    /// Data that does not have the shape the table declares.
    #[error("{0}")]
    Decode(String),
    /// The external system answered, but not as the connector needs
    /// (a topic missing, a key of the wrong type, offsets gone).
    #[error("{0}")]
    Other(String),
    /// A batch the engine hands over is not what it says (a changelog
    /// without its op column).
    #[error("{0}")]
    Engine(#[from] skein_engine::EngineError),
}

/// The connectors' result type.
pub type Result<T> = std::result::Result<T, ConnectorError>;

impl From<rdkafka::error::KafkaError> for ConnectorError {
    fn from(cause: rdkafka::error::KafkaError) -> Self {
        ConnectorError::Kafka {
            doing: String::new(),
            cause,
        }
    }
}

fn with_context(doing: &str, cause: &dyn std::fmt::Display) -> String {
    if doing.is_empty() {
        cause.to_string()
    } else {
        format!("{doing}: {cause}")
    }
}

impl ConnectorError {
    /// Kafka failed while the connector was `doing` something.
    pub fn kafka(doing: impl Into<String>, cause: rdkafka::error::KafkaError) -> Self {
        ConnectorError::Kafka {
            doing: doing.into(),
            cause,
        }
    }

    /// A failed Kinesis `call`, keeping the SDK's error (and printing its
    /// context, which its own message leaves out).
    pub fn kinesis<E>(call: impl Into<String>, e: E) -> Self
    where
        E: StdError + Send + Sync + 'static,
    {
        ConnectorError::Kinesis {
            call: call.into(),
            detail: aws_sdk_kinesis::error::DisplayErrorContext(&e).to_string(),
            cause: Box::new(e),
        }
    }

    /// This error as the failure of the source `name` (a table, or a kind
    /// and location such as `kinesis stream bids`).
    pub fn for_source(self, name: impl Into<String>) -> EngineError {
        EngineError::source_failed(name, self)
    }

    /// This error as the failure of the sink `name`.
    pub fn for_sink(self, name: impl Into<String>) -> EngineError {
        EngineError::sink_failed(name, self)
    }
}
