//! Errors of the sinks crate.

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("bad sink option: {0}")]
    Config(String),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("arrow: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, SinkError>;
