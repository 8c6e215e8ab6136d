//! Dead letters: records and rows a query could not use (undecodable
//! records, late rows), on their way to their table's dead-letter
//! destination with the reason, and rows written as JSON for them.

use async_trait::async_trait;
use datafusion::arrow::array::Array;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::payload::SourceOffset;

/// A record a query could not use, on its way to its table's dead-letter
/// destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The table (and so the source) the record came from.
    pub table: String,
    /// Why it was set aside, e.g. `late`.
    pub reason: String,
    /// For a late row: the window it belongs to, `[start, end)` in ms.
    pub window: Option<(i64, i64)>,
    /// The row as a JSON object.
    pub row: String,
    /// Names the letter; a replay produces the same key, so a compacted
    /// destination keeps one copy.
    pub key: String,
    /// Where the sending source member's partitions stood after the epoch
    /// that set the row aside, if it knows (a reader can tell from them
    /// whether that epoch is committed).
    #[serde(default)]
    pub offsets: Vec<SourceOffset>,
}

/// Where a source's dead letters go (a topic, a stream).
#[async_trait]
pub trait DeadLetterSink: Send + Sync + std::fmt::Debug {
    /// Deliver the letters; returns once the destination has them.
    async fn send(&self, letters: &[DeadLetter]) -> Result<()>;
}

/// Rows as JSON objects of their displayed values, for dead letters.
pub fn rows_as_json(batch: &RecordBatch) -> Result<Vec<String>> {
    let opts = FormatOptions::default();
    let schema = batch.schema();
    let formatters = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((0..batch.num_rows())
        .map(|r| {
            let obj: serde_json::Map<String, serde_json::Value> = schema
                .fields()
                .iter()
                .zip(&formatters)
                .enumerate()
                .map(|(i, (f, fmt))| {
                    let v = if batch.column(i).is_null(r) {
                        serde_json::Value::Null
                    } else {
                        serde_json::Value::String(fmt.value(r).to_string())
                    };
                    (f.name().clone(), v)
                })
                .collect();
            serde_json::Value::Object(obj).to_string()
        })
        .collect())
}
