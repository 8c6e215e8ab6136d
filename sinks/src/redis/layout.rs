//! How a write's rows become Redis commands. [`RedisLayout`] is the
//! extension point: the sink wraps whatever a layout adds in its MULTI/EXEC
//! with the epoch marker and the offsets, so a layout of another crate (YSB's
//! campaign windows, `skein-ysb`) is exactly once without code of its own.
//! [`KeyedLayout`] is `STORED AS REDIS`'s: `string`, `hash` and `list`.

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use skein_engine::sink::{SinkConfig, SinkRows, SinkWrite};

use crate::error::{ConnectorError, Result};

/// Adds the commands of one write to the sink's atomic pipeline.
pub trait RedisLayout: Send + Sync {
    /// `ttl_seconds` is the table's `ttl.seconds`, for the keys the layout
    /// writes. Commands go in with `.ignore()`: EXEC's answer is not read.
    fn add_commands(
        &self,
        write: &SinkWrite<'_>,
        ttl_seconds: Option<i64>,
        pipe: &mut redis::Pipeline,
    ) -> Result<()>;
}

/// The layouts of `STORED AS REDIS` (option `layout`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    String { value: String },
    Hash,
    List { value: String },
}

/// Known values of the `layout` option.
pub const LAYOUTS: &str = "string, hash, list";

/// A layout of `STORED AS REDIS` and the key template its rows are written at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedLayout {
    pub layout: Layout,
    /// Such as `user:{user_id}`: `{column}` parts take the row's values.
    pub key_template: String,
}

impl KeyedLayout {
    /// Reads `layout`, `key` and `value`; refuses a layout that `'emit'
    /// 'updates'` would make overwrite one epoch's part of a window with the
    /// next.
    pub fn from_sink_config(config: &SinkConfig) -> Result<Self> {
        let opt = |k: &str| config.options.get(k).cloned();
        let need = |k: &str| {
            opt(k).ok_or_else(|| ConnectorError::Config(format!("option {k:?} is required")))
        };
        let name = opt("layout").unwrap_or_else(|| "string".into());
        let layout = match name.as_str() {
            "string" => Layout::String {
                value: need("value")?,
            },
            "hash" => Layout::Hash,
            "list" => Layout::List {
                value: need("value")?,
            },
            // YSB's campaign windows were a layout here before they became
            // a sink kind of their own.
            "ysb" => {
                return Err(ConnectorError::Config(format!(
                    "layout \"ysb\"; known: {LAYOUTS} (YSB's layout is its own sink kind: STORED AS YSB_REDIS)"
                )));
            }
            other => {
                return Err(ConnectorError::Config(format!(
                    "layout {other:?}; known: {LAYOUTS}"
                )));
            }
        };
        if config
            .options
            .get(skein_engine::planner::EMIT_OPTION)
            .map(String::as_str)
            == Some(skein_engine::planner::EMIT_UPDATES)
            && let Layout::String { .. } | Layout::Hash = layout
        {
            return Err(ConnectorError::Config(format!(
                "layout {name:?} with 'emit' 'updates' would overwrite each epoch's partial result \
                 with the next: use layout 'list', or drop 'emit' 'updates' to write whole windows"
            )));
        }
        Ok(KeyedLayout {
            layout,
            key_template: need("key")?,
        })
    }
}

impl KeyedLayout {
    /// Whether this layout takes a changelog: `string` and `hash` upsert
    /// by key and delete a retracted row's key; `list` only appends.
    pub fn takes_updates(&self) -> std::result::Result<(), String> {
        match self.layout {
            Layout::String { .. } | Layout::Hash => Ok(()),
            Layout::List { .. } => Err(
                "layout 'list' only appends; layouts 'hash' and 'string' upsert by key and \
                 delete on retraction"
                    .into(),
            ),
        }
    }
}

impl RedisLayout for KeyedLayout {
    fn add_commands(
        &self,
        write: &SinkWrite<'_>,
        ttl_seconds: Option<i64>,
        pipe: &mut redis::Pipeline,
    ) -> Result<()> {
        match &write.rows {
            SinkRows::Append(rows) => self.add_rows(&write.schema, rows, ttl_seconds, pipe),
            SinkRows::Changes { retract, insert } => {
                self.add_changes(&write.schema, retract, insert, ttl_seconds, pipe)
            }
        }
    }
}

impl KeyedLayout {
    /// A changelog: every retracted row's key is deleted, then every new
    /// row is written, so an update (a retraction and its new row) leaves
    /// the new row and a deletion leaves nothing.
    fn add_changes(
        &self,
        schema: &SchemaRef,
        retract: &[RecordBatch],
        insert: &[RecordBatch],
        ttl_seconds: Option<i64>,
        pipe: &mut redis::Pipeline,
    ) -> Result<()> {
        if matches!(self.layout, Layout::List { .. }) {
            return Err(ConnectorError::Config(
                "layout 'list' only appends; an updating result needs 'hash' or 'string'".into(),
            ));
        }
        let template = KeyTemplate::parse(&self.key_template, schema)?;
        let options = FormatOptions::default();
        for batch in retract {
            let formatters: Vec<ArrayFormatter<'_>> = batch
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<std::result::Result<_, _>>()?;
            for row in 0..batch.num_rows() {
                pipe.del(template.render(&formatters, row)).ignore();
            }
        }
        self.add_rows(schema, insert, ttl_seconds, pipe)
    }

    fn add_rows(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        ttl_seconds: Option<i64>,
        pipe: &mut redis::Pipeline,
    ) -> Result<()> {
        let template = KeyTemplate::parse(&self.key_template, schema)?;
        let column = |name: &str| -> Result<usize> {
            schema.index_of(name).map_err(|_| {
                ConnectorError::Config(format!("no column {name:?} in the query's output"))
            })
        };
        let value = match &self.layout {
            Layout::String { value } | Layout::List { value } => Some(column(value)?),
            Layout::Hash => None,
        };
        let options = FormatOptions::default();
        for batch in batches {
            let formatters: Vec<ArrayFormatter<'_>> = batch
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<std::result::Result<_, _>>()?;
            for row in 0..batch.num_rows() {
                let key = template.render(&formatters, row);
                match (&self.layout, value) {
                    (Layout::String { .. }, Some(v)) => {
                        pipe.set(&key, formatters[v].value(row).to_string())
                            .ignore();
                    }
                    (Layout::List { .. }, Some(v)) => {
                        pipe.rpush(&key, formatters[v].value(row).to_string())
                            .ignore();
                    }
                    _ => {
                        for (i, f) in schema.fields().iter().enumerate() {
                            if !template.columns.contains(&i) {
                                pipe.hset(&key, f.name(), formatters[i].value(row).to_string())
                                    .ignore();
                            }
                        }
                    }
                }
                if let Some(ttl) = ttl_seconds {
                    pipe.expire(&key, ttl).ignore();
                }
            }
        }
        Ok(())
    }
}

/// `prefix:{col}:{other}` with the columns resolved against a schema.
struct KeyTemplate {
    parts: Vec<KeyPart>,
    columns: Vec<usize>,
}

enum KeyPart {
    Text(String),
    Column(usize),
}

impl KeyTemplate {
    fn parse(template: &str, schema: &SchemaRef) -> Result<Self> {
        let mut parts = vec![];
        let mut columns = vec![];
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let close = rest[open..].find('}').map(|c| open + c).ok_or_else(|| {
                ConnectorError::Config(format!("key {template:?}: unclosed '{{'"))
            })?;
            if open > 0 {
                parts.push(KeyPart::Text(rest[..open].to_string()));
            }
            let name = &rest[open + 1..close];
            let i = schema.index_of(name).map_err(|_| {
                ConnectorError::Config(format!("key {template:?}: no column {name:?}"))
            })?;
            parts.push(KeyPart::Column(i));
            columns.push(i);
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(KeyPart::Text(rest.to_string()));
        }
        Ok(KeyTemplate { parts, columns })
    }

    fn render(&self, formatters: &[ArrayFormatter<'_>], row: usize) -> String {
        let mut key = String::new();
        for p in &self.parts {
            match p {
                KeyPart::Text(t) => key.push_str(t),
                KeyPart::Column(i) => key.push_str(&formatters[*i].value(row).to_string()),
            }
        }
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(options: &[(&str, &str)]) -> SinkConfig {
        SinkConfig {
            kind: "REDIS".into(),
            location: "redis://127.0.0.1:1".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn the_ysb_layout_points_to_its_sink_kind() {
        let err = KeyedLayout::from_sink_config(&config(&[("layout", "ysb")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("string, hash, list") && err.contains("YSB_REDIS") && !err.contains('\n'),
            "{err}"
        );
        let err = KeyedLayout::from_sink_config(&config(&[("layout", "set"), ("key", "k")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("layout \"set\"; known: string, hash, list"),
            "{err}"
        );
    }

    #[test]
    fn list_takes_updates_string_refuses_them() {
        let list = config(&[
            ("layout", "list"),
            ("key", "k"),
            ("value", "v"),
            ("emit", "updates"),
        ]);
        assert!(KeyedLayout::from_sink_config(&list).is_ok());
        let string = config(&[("key", "k"), ("value", "v"), ("emit", "updates")]);
        let err = KeyedLayout::from_sink_config(&string)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"string\"") && err.contains("'list'"),
            "{err}"
        );
    }
}
