//! The `RESULTS` sink: a query's result rows as Arrow IPC streams in an
//! object store, one object per (query, epoch, member). The key is
//! deterministic, so a replayed write replaces what it wrote before; a write
//! is that one object, put whole or not at all, so unlike the files sink it
//! needs no commit marker.
//!
//! This is how a query without `INSERT INTO` returns rows when its functions
//! run elsewhere (on Lambda): the last stage writes here and `skein run`
//! reads the objects back. Location: `s3://bucket/prefix` (S3 as the `AWS_*`
//! variables configure it, `AWS_ENDPOINT_URL` included) or `file:///dir`.

use std::sync::Arc;

use crate::store::s3_builder_from_env;
use async_trait::async_trait;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use skein_engine::catalog::TableOptions;
use skein_engine::error::Cause;
use skein_engine::sink::{Sink, SinkConfig, SinkFactory, SinkWrite};
use skein_engine::{EngineError, Result};

/// The sink kind, as registered.
pub const KIND: &str = "RESULTS";

/// Where the results of `query` go, under `location`.
pub fn config(location: &str) -> SinkConfig {
    SinkConfig {
        kind: KIND.into(),
        location: location.into(),
        options: Default::default(),
    }
}

pub struct ResultsSinkFactory;

impl SinkFactory for ResultsSinkFactory {
    fn options(&self) -> TableOptions {
        TableOptions::only(&[])
    }

    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        let (store, prefix) = open(&config.location)?;
        Ok(Arc::new(ResultsSink { store, prefix }))
    }

    /// Results are read back whole; a changelog is consolidated then.
    fn takes_updates(&self, _config: &SinkConfig) -> std::result::Result<(), String> {
        Ok(())
    }
}

struct ResultsSink {
    store: Arc<dyn ObjectStore>,
    prefix: String,
}

fn bad(location: &str, cause: impl Into<Cause>) -> EngineError {
    EngineError::sink_failed(location, cause)
}

/// The store and the key prefix a location names.
pub fn open(location: &str) -> Result<(Arc<dyn ObjectStore>, String)> {
    if let Some(rest) = location.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad(location, "expected s3://bucket/prefix"));
        }
        // A request gives up after seconds rather than object_store's
        // minutes: the engine tries a failed write again, and counts each
        // failure for `skein status` as it goes.
        let retry = object_store::RetryConfig {
            retry_timeout: std::time::Duration::from_secs(5),
            ..Default::default()
        };
        let store = s3_builder_from_env(bucket)
            .with_retry(retry)
            .build()
            .map_err(|e| bad(location, e))?;
        return Ok((Arc::new(store), prefix.trim_matches('/').to_string()));
    }
    if let Some(dir) = location
        .strip_prefix("file://")
        .filter(|d| d.starts_with('/'))
    {
        std::fs::create_dir_all(dir).map_err(|e| bad(location, e))?;
        let store = LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(location, e))?;
        return Ok((Arc::new(store), String::new()));
    }
    Err(bad(
        location,
        "expected s3://bucket/prefix or file:///absolute/dir",
    ))
}

fn query_dir(prefix: &str, query: &str) -> Path {
    if prefix.is_empty() {
        Path::from(query)
    } else {
        Path::from(format!("{prefix}/{query}"))
    }
}

#[async_trait]
impl Sink for ResultsSink {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()> {
        let mut bytes = vec![];
        {
            // A changelog is kept as one, tagged: reading back adds it up.
            let schema = match write.rows.updates() {
                true => skein_engine::changelog::with_op(&write.schema),
                false => write.schema.clone(),
            };
            let mut w = StreamWriter::try_new(&mut bytes, &schema)?;
            for b in write.rows.tagged()?.iter().filter(|b| b.num_rows() > 0) {
                w.write(b)?;
            }
            w.finish()?;
        }
        let key = query_dir(&self.prefix, write.query).join(format!(
            "epoch-{:08}-member-{:04}.arrow",
            write.epoch, write.member
        ));
        self.store.put(&key, bytes.into()).await?;
        Ok(())
    }
}

/// Every result row of `query` written under `location`, in key order.
pub async fn read(location: &str, query: &str) -> Result<Vec<RecordBatch>> {
    let (store, prefix) = open(location)?;
    let mut keys: Vec<Path> = store
        .list(Some(&query_dir(&prefix, query)))
        .map_ok(|m| m.location)
        .try_collect()
        .await?;
    keys.sort();
    let mut out = vec![];
    for key in keys {
        let bytes = store.get(&key).await?.bytes().await?;
        let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)
            .map_err(|e| bad(location, e).doing(format_args!("reading {key}")))?;
        for b in reader {
            out.push(b?);
        }
    }
    // An updating query's results are its changelog: the table it adds up to.
    match out.first() {
        Some(b) if skein_engine::changelog::is_changelog(&b.schema()) => {
            Ok(vec![skein_engine::changelog::consolidate(
                &b.schema(),
                &out,
            )?])
        }
        _ => Ok(out),
    }
}

/// Remove the results of `query` (before a new run writes them again).
pub async fn clear(location: &str, query: &str) -> Result<usize> {
    let (store, prefix) = open(location)?;
    let keys: Vec<Path> = store
        .list(Some(&query_dir(&prefix, query)))
        .map_ok(|m| m.location)
        .try_collect()
        .await?;
    for k in &keys {
        store.delete(k).await?;
    }
    Ok(keys.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use skein_engine::sink::SinkRows;

    #[tokio::test]
    async fn writes_read_back_and_replays_replace() {
        let dir = std::env::temp_dir().join(format!("skein-results-{}", std::process::id()));
        let location = format!("file://{}", dir.display());
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let sink = ResultsSinkFactory.create(&config(&location)).unwrap();
        for _ in 0..2 {
            for member in 0..2 {
                let w = SinkWrite {
                    query: "q1",
                    run: "",
                    epoch: 0,
                    member,
                    schema: schema.clone(),
                    rows: SinkRows::Append(vec![batch.clone()]),
                    offsets: vec![],
                    last: true,
                };
                sink.write(w).await.unwrap();
            }
        }
        let rows: usize = read(&location, "q1")
            .await
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum();
        assert_eq!(rows, 6);
        assert_eq!(clear(&location, "q1").await.unwrap(), 2);
        assert!(read(&location, "q1").await.unwrap().is_empty());
        let _ = std::fs::remove_dir_all(dir);
        assert!(open("redis://x").is_err());
    }
}
