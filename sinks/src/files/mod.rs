//! The files sink: `INSERT INTO` a `STORED AS FILES` table writes rows as
//! objects in a local directory (`file:///dir`) or S3 (`s3://bucket/prefix`),
//! the way NEXMark q10 logs bids to a file system.
//!
//! Options:
//! - `'format'`: `json` (newline-delimited, the default), `csv` (with a
//!   header) or `arrow` (an Arrow IPC stream).
//! - `'partition.by' 'a,b'`: rows go under Hive-style directories
//!   `a=<value>/b=<value>/` by those columns' values (kept in the rows too).
//! - `'op.column' '<name>'`: each row gets one more column, so named, with
//!   its kind, `insert` or `delete`: the table is a changelog, and takes
//!   an updating query's result (replaying the rows in epoch order gives
//!   the table). Without it the sink only appends.
//!
//! Each write puts one object per partition, named by (query, epoch,
//! member): `part-<query>-e<epoch>-m<member>.<ext>`, then a commit marker
//! `_skein_commits/<query>/<run>-e<epoch>-m<member>` listing those objects.
//! A replayed epoch writes the same names again and replaces what it wrote,
//! so a retried or re-delivered write never duplicates rows; [`read`] takes
//! only the objects a marker lists, so a write cut short by a crash counts
//! for nothing until its replay completes. Exactly once on an object store
//! without transactions, at any group size.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{cast, concat_batches, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use skein_engine::catalog::TableOptions;
use skein_engine::error::Cause;
use skein_engine::sink::{Sink, SinkCapabilities, SinkConfig, SinkFactory, SinkRows, SinkWrite};
use skein_engine::{EngineError, Result};

mod changelog;
mod commits;

use changelog::with_op_text;
pub use changelog::{OP_COLUMN_OPTION, OP_DELETE, OP_INSERT, consolidate_op_text, op_column};
use commits::commit_marker;
pub use commits::{clear, read};

use crate::epoch_markers::Runs;
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

fn bad(location: &str, cause: impl Into<Cause>) -> EngineError {
    EngineError::sink_failed(location, cause)
}

/// The options of a `STORED AS FILES` table: read by [`format_of`] and
/// `partition_columns`; `retry.timeout.ms` by the engine, which retries a
/// failed write (see `skein_engine::sink_health`).
pub const OPTIONS: &[&str] = &[
    "format",
    "partition.by",
    OP_COLUMN_OPTION,
    skein_engine::sink_health::RETRY_OPTION,
];

pub struct FilesSinkFactory;

#[async_trait]
impl SinkFactory for FilesSinkFactory {
    fn options(&self) -> TableOptions {
        TableOptions::only(OPTIONS)
    }

    /// Deterministic names and a commit marker per write.
    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            exactly_once: true,
            keeps_offsets: false,
            discards_rows: false,
        }
    }

    async fn forget_written(&self, config: &SinkConfig, query: &str) -> Result<()> {
        clear(&config.location, query).await.map(drop)
    }

    /// The files `query` wrote, read back; a changelog table's rows added
    /// up to the table they make.
    async fn read_back(
        &self,
        config: &SinkConfig,
        query: &str,
        schema: &SchemaRef,
    ) -> Result<Option<Vec<RecordBatch>>> {
        let op = op_column(config);
        let stored = match &op {
            Some(name) => {
                let mut fields: Vec<_> = schema.fields().iter().cloned().collect();
                fields.push(Arc::new(Field::new(name, DataType::Utf8, false)));
                Arc::new(Schema::new(fields))
            }
            None => schema.clone(),
        };
        let rows = read(&config.location, query, format_of(config)?, stored).await?;
        Ok(Some(match op {
            Some(name) => vec![consolidate_op_text(&rows, &name, schema)?],
            None => rows,
        }))
    }

    fn check(&self, config: &SinkConfig) -> Result<()> {
        format_of(config).map(drop)
    }

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
            op_column: op_column(config),
            runs: Runs::new(),
        }))
    }

    fn takes_updates(&self, config: &SinkConfig) -> std::result::Result<(), String> {
        match op_column(config) {
            Some(_) => Ok(()),
            None => Err(format!(
                "a FILES table only appends unless '{OP_COLUMN_OPTION}' names a column for \
                 each row's kind ({OP_INSERT} or {OP_DELETE})"
            )),
        }
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
    op_column: Option<String>,
    runs: Runs,
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
        if write.rows.is_empty() {
            return Ok(());
        }
        let all = match (&self.op_column, &write.rows) {
            (Some(name), rows) => with_op_text(&write.schema, rows, name)?,
            (None, SinkRows::Append(rows)) => concat_batches(&write.schema, rows)?,
            (None, SinkRows::Changes { .. }) => {
                return Err(bad(
                    &self.location,
                    format!("an updating result needs '{OP_COLUMN_OPTION}' on a FILES table"),
                ));
            }
        };
        let mut written = vec![];
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
                .map_err(|e| bad(&self.location, e).doing(format_args!("writing {key}")))?;
            written.push(key);
        }
        // Last, so that it names only objects already in place.
        let marker = commit_marker(
            &self.prefix,
            write.query,
            self.runs.of(&write),
            write.epoch,
            write.member,
        );
        self.store
            .put(&marker, written.join("\n").into_bytes().into())
            .await
            .map_err(|e| bad(&self.location, e).doing(format_args!("writing {marker}")))?;
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::commits::COMMITS;
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
                run: "r1",
                epoch: 3,
                member,
                schema: b.schema(),
                rows: SinkRows::Append(vec![b.clone()]),
                offsets: vec![],
                last: true,
            })
            .await
            .unwrap();
        }
        // Each write's marker lists its objects, and names its run.
        let marker = dir.join(COMMITS).join("qx").join("r1-e00000003-m0001");
        let listed = std::fs::read_to_string(&marker).unwrap();
        assert_eq!(listed.lines().count(), 2, "{listed}");
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
    async fn a_write_cut_short_counts_only_once_its_replay_completes() {
        let dir = std::env::temp_dir().join(format!("skein-files-cut-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let location = format!("file://{}", dir.display());
        let config = SinkConfig {
            kind: KIND.into(),
            location: location.clone(),
            options: BTreeMap::new(),
        };
        let b = batch();
        let write = |epoch| SinkWrite {
            query: "qc",
            run: "r",
            epoch,
            member: 2,
            schema: b.schema(),
            rows: SinkRows::Append(vec![b.clone()]),
            offsets: vec![],
            last: false,
        };
        let rows = || async {
            read(&location, "qc", FileFormat::Json, b.schema())
                .await
                .unwrap()
                .iter()
                .map(|b| b.num_rows())
                .sum::<usize>()
        };
        let sink = FilesSinkFactory.create(&config).unwrap();
        sink.write(write(0)).await.unwrap();
        assert_eq!(rows().await, 3);
        // The crash: epoch 1's object is in place, its marker is not.
        std::fs::copy(
            dir.join("part-qc-e00000000-m0002.json"),
            dir.join("part-qc-e00000001-m0002.json"),
        )
        .unwrap();
        assert_eq!(rows().await, 3, "an uncommitted write is not counted");
        // The replay after a restart replaces the object and commits it.
        let restarted = FilesSinkFactory.create(&config).unwrap();
        restarted.write(write(1)).await.unwrap();
        assert_eq!(rows().await, 6);
        assert_eq!(clear(&location, "qc").await.unwrap(), 2);
        assert!(
            !dir.join(COMMITS)
                .join("qc")
                .join("r-e00000000-m0002")
                .exists()
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
