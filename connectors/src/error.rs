//! Errors of the connectors crate.

use skein_engine::error::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    #[error("bad connector option: {0}")]
    Config(String),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("arrow: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, ConnectorError>;

impl From<ConnectorError> for EngineError {
    fn from(e: ConnectorError) -> Self {
        EngineError::Source {
            source_name: "kafka".into(),
            reason: e.to_string(),
        }
    }
}
