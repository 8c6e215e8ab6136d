//! The one error type of this crate.

use datafusion::arrow::error::ArrowError;

/// Everything that can go wrong while configuring a generator or writing its output.
#[derive(Debug, thiserror::Error)]
pub enum GeneratorError {
    /// A configuration value is out of its valid range.
    #[error("invalid generator configuration: {0}")]
    InvalidConfig(String),

    /// Building an Arrow record batch failed.
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),

    /// Reading or writing a side file (mapping, ground truth) failed.
    #[error("i/o on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A side file or JSON record did not have the expected shape.
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
}

/// Result alias used across the crate.
pub type Result<T, E = GeneratorError> = std::result::Result<T, E>;
