//! Errors of the YSB library: what failed, with the step that was being
//! taken ([`Context`]), on one line.

use skein_engine::error::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum YsbError {
    #[error("redis: {0}")]
    Redis(redis::RedisError),
    #[error("reading an answer of Redis: {0}")]
    RedisValue(redis::ParsingError),
    #[error("kafka: {0}")]
    Kafka(rdkafka::error::KafkaError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Connector(#[from] skein_sinks::error::ConnectorError),
    #[error(transparent)]
    Generator(#[from] skein_generators::GeneratorError),
    #[error(transparent)]
    Plot(#[from] skein_plot::PlotError),
    /// A result that is not what YSB expects (a bad truth file, a topic
    /// that is not there, a read that never finished).
    #[error("{0}")]
    Failed(String),
    #[error("{what}: {inner}")]
    Context { what: String, inner: Box<YsbError> },
}

impl From<redis::RedisError> for YsbError {
    fn from(e: redis::RedisError) -> Self {
        YsbError::Redis(e)
    }
}

impl From<redis::ParsingError> for YsbError {
    fn from(e: redis::ParsingError) -> Self {
        YsbError::RedisValue(e)
    }
}

impl From<rdkafka::error::KafkaError> for YsbError {
    fn from(e: rdkafka::error::KafkaError) -> Self {
        YsbError::Kafka(e)
    }
}

pub type Result<T, E = YsbError> = std::result::Result<T, E>;

/// Says which step failed, as anyhow's `context` does at the edges.
pub trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<YsbError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| YsbError::Context {
            what: what.into(),
            inner: Box::new(e.into()),
        })
    }

    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| YsbError::Context {
            what: what(),
            inner: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.ok_or_else(|| YsbError::Failed(what.into()))
    }

    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.ok_or_else(|| YsbError::Failed(what()))
    }
}

/// Returns early with [`YsbError::Failed`].
macro_rules! fail {
    ($($arg:tt)*) => {
        return Err($crate::error::YsbError::Failed(format!($($arg)*)))
    };
}
pub(crate) use fail;
