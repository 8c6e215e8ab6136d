//! Opening S3 from the environment, shared by every piece that writes to
//! an object store (the results sink, the Lambda deployer, the function).

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

/// Whether `bucket` names an S3 Express One Zone directory bucket
/// (`<name>--<zone-id>--x-s3`): its zone, if so.
pub fn directory_bucket_zone(bucket: &str) -> Option<&str> {
    let rest = bucket.strip_suffix("--x-s3")?;
    let (_, zone) = rest.rsplit_once("--")?;
    (!zone.is_empty()).then_some(zone)
}

/// S3 from the `AWS_*` variables. Empty values are skipped: emulators set
/// e.g. `AWS_SESSION_TOKEN=""`, which is no token. A directory bucket
/// (S3 Express One Zone) is reached at its zonal endpoint with session
/// credentials, unless an endpoint is given: a local stand-in serves it
/// as any bucket.
pub fn s3_from_env(bucket: &str) -> object_store::Result<object_store::aws::AmazonS3> {
    s3_builder_from_env(bucket).build()
}

/// [`s3_from_env`] before it is built, for a caller that sets more.
pub fn s3_builder_from_env(bucket: &str) -> AmazonS3Builder {
    let mut builder = AmazonS3Builder::new().with_bucket_name(bucket);
    for (key, value) in std::env::vars() {
        if value.is_empty() || !key.starts_with("AWS_") {
            continue;
        }
        if let Ok(config_key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
            builder = builder.with_config(config_key, value);
        }
    }
    if std::env::var("AWS_REGION")
        .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
        .is_err()
    {
        builder = builder.with_region("us-east-1");
    }
    // A local stand-in (AWS_ENDPOINT_URL=http://...) speaks plain HTTP.
    let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .unwrap_or_default();
    if endpoint.starts_with("http://") {
        builder = builder.with_allow_http(true);
    }
    if endpoint.is_empty() && directory_bucket_zone(bucket).is_some() {
        builder = builder.with_s3_express(true);
    }
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_buckets_are_told_by_name() {
        assert_eq!(
            directory_bucket_zone("cp--use1-az4--x-s3"),
            Some("use1-az4")
        );
        assert_eq!(
            directory_bucket_zone("my--cp--usw2-az1--x-s3"),
            Some("usw2-az1")
        );
        assert_eq!(directory_bucket_zone("cp-x-s3"), None);
        assert_eq!(directory_bucket_zone("checkpoints"), None);
    }
}
