//! The text of a table's `offsets` option: `partition:offset,...`.

use std::collections::BTreeMap;

use crate::error::{ConnectorError, Result};

/// `"0:120,1:98"` -> {0: 120, 1: 98}.
pub fn parse_offsets(s: &str) -> Result<BTreeMap<i32, i64>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (part, off) = p.split_once(':').ok_or_else(|| {
                ConnectorError::Config(format!("offsets: {p:?} is not partition:offset"))
            })?;
            let part = part
                .trim()
                .parse()
                .map_err(|_| ConnectorError::Config(format!("offsets: bad partition in {p:?}")))?;
            let off = off
                .trim()
                .parse()
                .map_err(|_| ConnectorError::Config(format!("offsets: bad offset in {p:?}")))?;
            Ok((part, off))
        })
        .collect()
}

/// `{0: 120, 1: 98}` -> `"0:120,1:98"`, the form of the `offsets` option.
pub fn format_offsets(offsets: &BTreeMap<i32, i64>) -> String {
    offsets
        .iter()
        .map(|(p, o)| format!("{p}:{o}"))
        .collect::<Vec<_>>()
        .join(",")
}
