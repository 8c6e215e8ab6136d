//! Where a query on Lambda keeps its durable state: a
//! [`CheckpointStore`] on S3 under one prefix per query (by default
//! `skein/checkpoints/<query-code>` in the deployment's store), with the
//! layout of a local checkpoint directory. The driver opens it (and owns
//! the manifest); every function attaches to the same location, named in
//! its environment, with the run lineage its context carries.

use std::sync::Arc;

use object_store::path::Path;
use skein_engine::checkpoint::CheckpointStore;
use skein_engine::context::CloudContext;

use crate::store::{StoreError, s3_bucket};

/// Environment variable naming a checkpointing query's location
/// (`s3://bucket/prefix` or `file:///dir`).
pub const CHECKPOINTS_ENV: &str = "SKEIN_CHECKPOINTS";

/// Under the deployment's store: one prefix per query.
const DEFAULT_PREFIX: &str = "skein/checkpoints";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "checkpoint location {0:?}: expected s3://bucket/prefix or file:///absolute/dir \
         (the functions cannot read this machine's disk)"
    )]
    BadUrl(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("checkpoint location {url}: {source}")]
    Open {
        url: String,
        source: skein_engine::EngineError,
    },
    #[error(
        "{function}: the context asks for checkpoints but {CHECKPOINTS_ENV} is not set \
         (deploy with skein run --backend lambda)"
    )]
    NotSet { function: String },
}

/// The default location of `query_code`'s checkpoints in the store at
/// `store_url`.
pub fn default_url(store_url: &str, query_code: &str) -> String {
    format!(
        "{}/{DEFAULT_PREFIX}/{query_code}",
        store_url.trim_end_matches('/')
    )
}

/// The store and the root inside it of a checkpoint location.
pub fn locate(url: &str) -> Result<(Arc<dyn object_store::ObjectStore>, Path), CheckpointError> {
    let url = url.trim_end_matches('/');
    if let Some(bucket) = s3_bucket(url) {
        let prefix = url["s3://".len() + bucket.len()..].trim_start_matches('/');
        let root = Path::parse(prefix).map_err(|_| CheckpointError::BadUrl(url.to_string()))?;
        return Ok((crate::store::open(&format!("s3://{bucket}"))?, root));
    }
    if url.starts_with("file:///") {
        return Ok((crate::store::open(url)?, Path::from("")));
    }
    Err(CheckpointError::BadUrl(url.to_string()))
}

/// Whether `url` names a location [`open`] takes (checked before deploying).
pub fn check_url(url: &str) -> Result<(), CheckpointError> {
    let url = url.trim_end_matches('/');
    match s3_bucket(url) {
        Some(bucket) if Path::parse(&url["s3://".len() + bucket.len()..]).is_ok() => Ok(()),
        None if url.starts_with("file:///") => Ok(()),
        _ => Err(CheckpointError::BadUrl(url.to_string())),
    }
}

/// The driver's handle: a new location gets a manifest with a fresh run
/// lineage; one written for another query text is refused.
pub async fn open(url: &str, query_code: &str) -> Result<CheckpointStore, CheckpointError> {
    let (store, root) = locate(url)?;
    CheckpointStore::open(store, root, query_code)
        .await
        .map_err(|source| CheckpointError::Open {
            url: url.to_string(),
            source,
        })
}

/// A function's handle, when its context asks for checkpoints: the
/// location from [`CHECKPOINTS_ENV`], the lineage from the context.
pub fn attach_from_env(ctx: &CloudContext) -> Result<Option<CheckpointStore>, CheckpointError> {
    if ctx.checkpoint.is_none() {
        return Ok(None);
    }
    let url = std::env::var(CHECKPOINTS_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| CheckpointError::NotSet {
            function: ctx.function_name(),
        })?;
    let (store, root) = locate(&url)?;
    Ok(Some(CheckpointStore::attach(
        store,
        root,
        &ctx.query_code,
        &ctx.run,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        assert_eq!(default_url("s3://b/", "q1"), "s3://b/skein/checkpoints/q1");
        assert!(check_url("s3://b/some/prefix").is_ok());
        assert!(check_url("s3://b").is_ok());
        assert!(check_url("file:///tmp/x").is_ok());
        assert!(check_url(".skein/checkpoints/q").is_err());
        assert!(check_url("s3://").is_err());
        let (_, root) = locate("s3://b/some/prefix/").unwrap();
        assert_eq!(root.as_ref(), "some/prefix");
    }

    #[tokio::test]
    async fn the_driver_opens_and_a_function_attaches_to_the_same_place() {
        let dir = std::env::temp_dir().join(format!("skein-cp-{}", std::process::id()));
        let url = format!("file://{}", dir.display());
        let driver = open(&url, "q1").await.unwrap();
        driver
            .commit(
                skein_engine::checkpoint::Commit {
                    epoch: 4,
                    last: false,
                },
                None,
                vec![],
                &Default::default(),
            )
            .await
            .unwrap();
        let (store, root) = locate(&url).unwrap();
        let function = CheckpointStore::attach(store, root, "q1", &driver.manifest().run);
        assert_eq!(function.committed().await.unwrap().unwrap().epoch, 4);
        assert!(open(&url, "another").await.is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
