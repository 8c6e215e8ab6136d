//! Reading the options every source table shares.

use skein_engine::source::SourceConfig;

use crate::error::{ConnectorError, Result};

/// An option whose value is not what it should be.
pub(crate) fn bad(key: &str, value: &str) -> ConnectorError {
    ConnectorError::Config(format!("option {key} = {value:?}"))
}

/// A count option, or `default` when absent.
pub(crate) fn number(config: &SourceConfig, key: &str, default: usize) -> Result<usize> {
    config
        .option(key)
        .map(|v| v.parse::<usize>().map_err(|_| bad(key, v)))
        .unwrap_or(Ok(default))
}

/// `parallelism`: source instances, at least one (default one).
pub(crate) fn parallelism(config: &SourceConfig) -> Result<usize> {
    match number(config, "parallelism", 1)? {
        0 => Err(bad("parallelism", "0")),
        n => Ok(n),
    }
}

/// LOCATION must name the topic or stream (`what`).
pub(crate) fn require_location(config: &SourceConfig, what: &str) -> Result<()> {
    if config.location.is_empty() {
        return Err(ConnectorError::Config(format!(
            "LOCATION must name the {what}"
        )));
    }
    Ok(())
}
