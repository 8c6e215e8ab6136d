//! What a query wrote to a files table: the commit marker of each write,
//! reading back the objects a marker lists, and clearing them.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use skein_engine::Result;

use super::{FileFormat, bad, path_safe};
use crate::results::open;

/// The folder (under the location) of the commit markers; Hive-style
/// readers skip names starting with `_`.
pub(super) const COMMITS: &str = "_skein_commits";

fn under(prefix: &str, rest: String) -> Path {
    if prefix.is_empty() {
        Path::from(rest)
    } else {
        Path::from(format!("{prefix}/{rest}"))
    }
}

/// Where the commit markers of `query` live.
fn commits_dir(prefix: &str, query: &str) -> Path {
    under(prefix, format!("{COMMITS}/{}", path_safe(query)))
}

/// The commit marker of one write.
pub(super) fn commit_marker(prefix: &str, query: &str, run: &str, epoch: u64, member: u32) -> Path {
    under(
        prefix,
        format!(
            "{COMMITS}/{}/{}-e{epoch:08}-m{member:04}",
            path_safe(query),
            path_safe(run)
        ),
    )
}

/// The commit markers of `query` under `location`.
async fn markers(store: &dyn ObjectStore, prefix: &str, query: &str) -> Result<Vec<Path>> {
    Ok(store
        .list(Some(&commits_dir(prefix, query)))
        .map_ok(|m| m.location)
        .try_collect()
        .await?)
}

/// The objects committed writes of `query` put under `location`, in key
/// order: those some commit marker lists.
async fn committed(location: &str, query: &str) -> Result<(Arc<dyn ObjectStore>, Vec<Path>)> {
    let (store, prefix) = open(location)?;
    let mut keys = std::collections::BTreeSet::new();
    for marker in markers(store.as_ref(), &prefix, query).await? {
        let listed = store.get(&marker).await?.bytes().await?;
        let listed = String::from_utf8_lossy(&listed);
        keys.extend(listed.lines().filter(|l| !l.is_empty()).map(Path::from));
    }
    Ok((store, keys.into_iter().collect()))
}

/// The data objects `query` wrote under `location`, committed or not, in
/// key order; with the store and the key prefix.
async fn objects(location: &str, query: &str) -> Result<(Arc<dyn ObjectStore>, String, Vec<Path>)> {
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
    Ok((store, prefix, keys))
}

/// Every row of the committed writes of `query` under `location`, read back
/// with `schema`.
pub async fn read(
    location: &str,
    query: &str,
    format: FileFormat,
    schema: SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let (store, keys) = committed(location, query).await?;
    let mut out = vec![];
    for key in keys {
        let bytes = store.get(&key).await?.bytes().await?;
        let cursor = std::io::Cursor::new(bytes);
        let reading = |e: ArrowError| bad(location, e).doing(format_args!("reading {key}"));
        match format {
            FileFormat::Json => {
                let reader = datafusion::arrow::json::ReaderBuilder::new(schema.clone())
                    .build(cursor)
                    .map_err(reading)?;
                for b in reader {
                    out.push(b.map_err(reading)?);
                }
            }
            FileFormat::Csv => {
                let reader = datafusion::arrow::csv::ReaderBuilder::new(schema.clone())
                    .with_header(true)
                    .build(cursor)
                    .map_err(reading)?;
                for b in reader {
                    out.push(b.map_err(reading)?);
                }
            }
            FileFormat::Arrow => {
                let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(cursor, None)
                    .map_err(reading)?;
                for b in reader {
                    out.push(b.map_err(reading)?);
                }
            }
        }
    }
    Ok(out)
}

/// Removes what `query` wrote under `location`, commit markers included
/// (before a run writes it anew); returns how many data objects went.
pub async fn clear(location: &str, query: &str) -> Result<usize> {
    let (store, prefix, keys) = objects(location, query).await?;
    for k in keys
        .iter()
        .chain(&markers(store.as_ref(), &prefix, query).await?)
    {
        store.delete(k).await?;
    }
    Ok(keys.len())
}
