//! The files sink: `INSERT INTO` a `STORED AS FILES` table writes rows as
//! objects in a local directory (`file:///dir`) or S3 (`s3://bucket/prefix`),
//! the way NEXMark q10 logs bids to a file system.
//!
//! Options:
//! - `'format'`: `json` (newline-delimited, the default), `csv` (with a
//!   header) or `arrow` (an Arrow IPC stream).
//! - `'partition.by' 'a,b'`: rows go under Hive-style directories
//!   `a=<value>/b=<value>/` by those columns' values (kept in the rows too).
//!
//! Each write puts one object per partition, named by (query, epoch,
//! member): `part-<query>-e<epoch>-m<member>.<ext>`. A replayed epoch writes
//! the same names again and replaces what it wrote, so a retried or
//! re-delivered write never duplicates rows: exactly once on an object store
//! without transactions.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, concat_batches, take_record_batch};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use skein_engine::sink::{Sink, SinkConfig, SinkFactory, SinkWrite};
use skein_engine::{EngineError, Result};

use crate::results::open;

/// The sink kind, as registered.
pub const KIND: &str = "FILES";

/// How rows are laid out in an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    Json,
    Csv,
    Arrow,
}

impl FileFormat {
    fn parse(location: &str, text: &str) -> Result<Self> {
        match text {
            "json" => Ok(FileFormat::Json),
            "csv" => Ok(FileFormat::Csv),
            "arrow" => Ok(FileFormat::Arrow),
            other => Err(bad(
                location,
                format!("format {other:?}: the files sink writes 'json', 'csv' or 'arrow'"),
            )),
        }
    }

    fn extension(self) -> &'static str {
        match self {
            FileFormat::Json => "json",
            FileFormat::Csv => "csv",
            FileFormat::Arrow => "arrow",
        }
    }
}

fn bad(location: &str, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Sink {
        sink: location.to_string(),
        reason: reason.to_string(),
    }
}

/// The options of a `STORED AS FILES` table: read by [`format_of`] and
/// `partition_columns`.
pub const OPTIONS: &[&str] = &["format", "partition.by"];

pub struct FilesSinkFactory;

impl SinkFactory for FilesSinkFactory {
    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        let (store, prefix) = open(&config.location)?;
        let format = format_of(config)?;
        let partition_by = partition_columns(&config.options);
        Ok(Arc::new(FilesSink {
            location: config.location.clone(),
            store,
            prefix,
            format,
            partition_by,
        }))
    }
}

fn partition_columns(options: &BTreeMap<String, String>) -> Vec<String> {
    options
        .get("partition.by")
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

struct FilesSink {
    location: String,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    format: FileFormat,
    partition_by: Vec<String>,
}

impl FilesSink {
    /// The rows of `batch` grouped by their partition directory.
    fn partitions(&self, batch: &RecordBatch) -> Result<BTreeMap<String, RecordBatch>> {
        if self.partition_by.is_empty() {
            return Ok([(String::new(), batch.clone())].into_iter().collect());
        }
        let mut texts = Vec::with_capacity(self.partition_by.len());
        for name in &self.partition_by {
            let col = batch.column_by_name(name).ok_or_else(|| {
                bad(
                    &self.location,
                    format!("partition column {name:?} is not among the written columns"),
                )
            })?;
            texts.push(cast(col, &DataType::Utf8)?);
        }
        let mut rows: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for i in 0..batch.num_rows() {
            let dir = self
                .partition_by
                .iter()
                .zip(&texts)
                .map(|(name, t)| {
                    let t = t.as_string::<i32>();
                    let v = if t.is_null(i) {
                        "__null__".to_string()
                    } else {
                        path_safe(t.value(i))
                    };
                    format!("{name}={v}")
                })
                .collect::<Vec<_>>()
                .join("/");
            rows.entry(dir).or_default().push(i as u32);
        }
        rows.into_iter()
            .map(|(dir, idx)| {
                let part = take_record_batch(batch, &UInt32Array::from(idx))?;
                Ok((dir, part))
            })
            .collect()
    }

    fn encode(&self, batch: &RecordBatch) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        match self.format {
            FileFormat::Json => {
                let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut out);
                w.write(batch)?;
                w.finish()?;
            }
            FileFormat::Csv => {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut out);
                w.write(batch)?;
            }
            FileFormat::Arrow => {
                let mut w = datafusion::arrow::ipc::writer::StreamWriter::try_new(
                    &mut out,
                    batch.schema_ref(),
                )?;
                w.write(batch)?;
                w.finish()?;
            }
        }
        Ok(out)
    }
}

/// Keeps a partition value usable as one path segment.
fn path_safe(v: &str) -> String {
    v.chars()
        .map(|c| match c {
            '/' | '\\' | '\0' => '_',
            c => c,
        })
        .collect()
}

#[async_trait]
impl Sink for FilesSink {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()> {
        let batches: Vec<&RecordBatch> =
            write.batches.iter().filter(|b| b.num_rows() > 0).collect();
        if batches.is_empty() {
            return Ok(());
        }
        let all = concat_batches(&write.schema, batches)?;
        for (dir, part) in self.partitions(&all)? {
            let name = format!(
                "part-{}-e{:08}-m{:04}.{}",
                write.query,
                write.epoch,
                write.member,
                self.format.extension()
            );
            let key = [self.prefix.as_str(), dir.as_str(), name.as_str()]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join("/");
            let bytes = self.encode(&part)?;
            self.store
                .put(&Path::from(key.as_str()), bytes.into())
                .await
                .map_err(|e| bad(&self.location, format!("writing {key}: {e}")))?;
        }
        Ok(())
    }
}

/// The objects `query` wrote under `location`, in key order.
async fn objects(location: &str, query: &str) -> Result<(Arc<dyn ObjectStore>, Vec<Path>)> {
    let (store, prefix) = open(location)?;
    let list_prefix = (!prefix.is_empty()).then(|| Path::from(prefix.as_str()));
    let marker = format!("part-{query}-");
    let mut keys: Vec<Path> = store
        .list(list_prefix.as_ref())
        .map_ok(|m| m.location)
        .try_collect()
        .await?;
    keys.retain(|k| k.filename().is_some_and(|f| f.starts_with(&marker)));
    keys.sort();
    Ok((store, keys))
}

/// Every row `query` wrote under `location`, read back with `schema`.
pub async fn read(
    location: &str,
    query: &str,
    format: FileFormat,
    schema: SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let (store, keys) = objects(location, query).await?;
    let mut out = vec![];
    for key in keys {
        let bytes = store.get(&key).await?.bytes().await?;
        let cursor = std::io::Cursor::new(bytes);
        let reading = |e: &dyn std::fmt::Display| bad(location, format!("reading {key}: {e}"));
        match format {
            FileFormat::Json => {
                let reader = datafusion::arrow::json::ReaderBuilder::new(schema.clone())
                    .build(cursor)
                    .map_err(|e| reading(&e))?;
                for b in reader {
                    out.push(b.map_err(|e| reading(&e))?);
                }
            }
            FileFormat::Csv => {
                let reader = datafusion::arrow::csv::ReaderBuilder::new(schema.clone())
                    .with_header(true)
                    .build(cursor)
                    .map_err(|e| reading(&e))?;
                for b in reader {
                    out.push(b.map_err(|e| reading(&e))?);
                }
            }
            FileFormat::Arrow => {
                let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(cursor, None)
                    .map_err(|e| reading(&e))?;
                for b in reader {
                    out.push(b.map_err(|e| reading(&e))?);
                }
            }
        }
    }
    Ok(out)
}

/// The format a sink config writes.
pub fn format_of(config: &SinkConfig) -> Result<FileFormat> {
    FileFormat::parse(
        &config.location,
        config
            .options
            .get("format")
            .map(String::as_str)
            .unwrap_or("json"),
    )
}

/// Removes what `query` wrote under `location` (before a run writes it anew).
pub async fn clear(location: &str, query: &str) -> Result<usize> {
    let (store, keys) = objects(location, query).await?;
    for k in &keys {
        store.delete(k).await?;
    }
    Ok(keys.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::{Field, Schema, TimeUnit};

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("dt", DataType::Utf8, false),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            ),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![
                    "2026-01-01",
                    "2026-01/02",
                    "2026-01-01",
                ])),
                Arc::new(TimestampMillisecondArray::from(vec![1000, 2000, 3000])),
            ],
        )
        .unwrap()
    }

    async fn roundtrip(format: &str) {
        let dir = std::env::temp_dir().join(format!("skein-files-{format}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let location = format!("file://{}", dir.display());
        let config = SinkConfig {
            kind: KIND.into(),
            location: location.clone(),
            options: [("format", format), ("partition.by", "dt")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let sink = FilesSinkFactory.create(&config).unwrap();
        let b = batch();
        // The same write twice (a replay) and a second member.
        for member in [0, 0, 1] {
            sink.write(SinkWrite {
                query: "qx",
                run: "",
                epoch: 3,
                member,
                schema: b.schema(),
                batches: vec![b.clone()],
                offsets: vec![],
                last: true,
            })
            .await
            .unwrap();
        }
        assert!(dir.join("dt=2026-01-01").is_dir());
        assert!(
            dir.join("dt=2026-01_02").is_dir(),
            "a '/' in a value is not a directory"
        );
        let back = read(&location, "qx", format_of(&config).unwrap(), b.schema())
            .await
            .unwrap();
        let rows: usize = back.iter().map(|b| b.num_rows()).sum();
        assert_eq!(
            rows, 6,
            "{format}: two members of three rows; the replay replaced"
        );
        let mut ns: Vec<i64> = back
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        ns.sort();
        assert_eq!(ns, vec![1, 1, 2, 2, 3, 3]);
        assert_eq!(clear(&location, "qx").await.unwrap(), 4);
        assert!(
            read(&location, "qx", FileFormat::Json, b.schema())
                .await
                .unwrap()
                .is_empty()
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn json_csv_and_arrow_files_read_back_and_replays_replace() {
        for f in ["json", "csv", "arrow"] {
            roundtrip(f).await;
        }
    }

    #[test]
    fn bad_options_are_named() {
        let config = SinkConfig {
            kind: KIND.into(),
            location: "file:///tmp/skein-files-bad".into(),
            options: [("format".to_string(), "parquet".to_string())]
                .into_iter()
                .collect(),
        };
        let err = FilesSinkFactory.create(&config).err().unwrap().to_string();
        assert!(err.contains("parquet"), "{err}");
        let config = SinkConfig {
            location: "ftp://x".into(),
            ..config
        };
        assert!(FilesSinkFactory.create(&config).is_err());
    }
}
