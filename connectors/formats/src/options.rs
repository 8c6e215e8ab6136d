//! The options a format reads besides `'format'` itself, and reading
//! them: the schema registry a table names, its subject, and a schema given
//! inline or as a file.

use std::collections::BTreeMap;
use std::sync::Arc;

use skein_clients::error::{ConnectorError, Result};

use crate::registry::{self, REGISTRY_OPTIONS, Registry, RegistryConfig};

/// The table options of the formats (besides `'format'` itself).
pub const FORMAT_OPTIONS: &[&str] = &["avro.schema", "protobuf.message", "protobuf.descriptor"];

/// Whether `key` is an option of a format or of the schema registry.
pub fn is_format_option(key: &str) -> bool {
    FORMAT_OPTIONS.contains(&key) || REGISTRY_OPTIONS.contains(&key)
}

/// Every option a format may read, for a table kind's list of options.
pub fn all_options() -> Vec<&'static str> {
    FORMAT_OPTIONS
        .iter()
        .chain(REGISTRY_OPTIONS)
        .copied()
        .collect()
}

/// The schema registry a table's options name, shared with every other
/// table of this process that names the same one (and so its cache).
pub(crate) fn registry_of(options: &BTreeMap<String, String>) -> Result<Option<Arc<Registry>>> {
    RegistryConfig::from_options(options)?
        .map(registry::shared)
        .transpose()
}

/// The registry subject of a table's values: `'schema.registry.subject'`,
/// else `<topic>-value` (the TopicNameStrategy).
pub(crate) fn value_subject(options: &BTreeMap<String, String>, location: &str) -> String {
    options
        .get("schema.registry.subject")
        .filter(|s| !s.is_empty())
        .cloned()
        .unwrap_or_else(|| format!("{location}-value"))
}

/// An option's text, inline or, when it does not look like `inline`
/// (`looks_inline`), read from the file it names.
pub(crate) fn inline_or_file(
    key: &str,
    value: &str,
    looks_inline: impl Fn(&str) -> bool,
) -> Result<String> {
    let v = value.trim();
    if looks_inline(v) {
        return Ok(v.to_string());
    }
    std::fs::read_to_string(v).map_err(|e| {
        ConnectorError::Config(format!(
            "option {key}: {v:?} is neither an inline schema nor a readable file: {e}"
        ))
    })
}
