//! The object store of a deployment, named by a URL: `s3://bucket` (S3 as
//! configured by the `AWS_*` variables, `AWS_ENDPOINT_URL` included) or
//! `file:///absolute/dir`. Spilled contexts and query results live there.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use skein_sinks::store::s3_from_env;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store URL {0:?}: expected s3://bucket or file:///absolute/dir")]
    BadUrl(String),
    #[error("store {url}: {source}")]
    Open {
        url: String,
        source: object_store::Error,
    },
    #[error("creating bucket {bucket}: {reason}")]
    Bucket { bucket: String, reason: String },
}

/// The bucket of an `s3://bucket[/...]` URL.
pub fn s3_bucket(url: &str) -> Option<&str> {
    url.strip_prefix("s3://")
        .map(|r| r.split('/').next().unwrap_or_default())
        .filter(|b| !b.is_empty())
}

/// Open the store at `url`; paths inside it are relative to its root.
pub fn open(url: &str) -> Result<Arc<dyn ObjectStore>, StoreError> {
    let open_err = |source| StoreError::Open {
        url: url.to_string(),
        source,
    };
    if let Some(bucket) = s3_bucket(url) {
        return Ok(Arc::new(s3_from_env(bucket).map_err(open_err)?));
    }
    if let Some(dir) = url.strip_prefix("file://").filter(|d| d.starts_with('/')) {
        std::fs::create_dir_all(dir).map_err(|e| {
            open_err(object_store::Error::Generic {
                store: "file",
                source: e.into(),
            })
        })?;
        return Ok(Arc::new(
            LocalFileSystem::new_with_prefix(dir).map_err(open_err)?,
        ));
    }
    Err(StoreError::BadUrl(url.to_string()))
}

/// Create the bucket of an `s3://` URL unless it exists (object_store cannot).
pub async fn ensure_bucket(config: &aws_config::SdkConfig, url: &str) -> Result<(), StoreError> {
    let Some(bucket) = s3_bucket(url) else {
        return Ok(());
    };
    let stand_in = std::env::var("AWS_ENDPOINT_URL_S3")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .is_ok_and(|e| !e.is_empty());
    // A local stand-in serves a directory bucket's name as any bucket,
    // without S3 Express sessions.
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(config)
            .force_path_style(true)
            .disable_s3_express_session_auth(stand_in)
            .build(),
    );
    if s3.head_bucket().bucket(bucket).send().await.is_ok() {
        return Ok(());
    }
    let mut create = s3.create_bucket().bucket(bucket);
    // A directory bucket (S3 Express One Zone) lives in one zone, named in
    // the bucket's name.
    if let Some(zone) = skein_sinks::store::directory_bucket_zone(bucket)
        && !stand_in
    {
        use aws_sdk_s3::types::{
            BucketInfo, BucketType, CreateBucketConfiguration, DataRedundancy, LocationInfo,
            LocationType,
        };
        create = create.create_bucket_configuration(
            CreateBucketConfiguration::builder()
                .location(
                    LocationInfo::builder()
                        .r#type(LocationType::AvailabilityZone)
                        .name(zone)
                        .build(),
                )
                .bucket(
                    BucketInfo::builder()
                        .data_redundancy(DataRedundancy::SingleAvailabilityZone)
                        .r#type(BucketType::Directory)
                        .build(),
                )
                .build(),
        );
    }
    create.send().await.map_err(|e| StoreError::Bucket {
        bucket: bucket.to_string(),
        reason: crate::error_chain(&e),
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(s3_bucket("s3://b"), Some("b"));
        assert_eq!(s3_bucket("s3://b/x"), Some("b"));
        assert_eq!(s3_bucket("s3://"), None);
        assert!(open("http://x").is_err());
        assert!(open("file://relative").is_err());
    }
}
