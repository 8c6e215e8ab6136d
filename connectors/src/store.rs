//! Opening S3 from the environment, shared by every piece that writes to
//! an object store (the results sink, the Lambda deployer, the function).

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

/// S3 from the `AWS_*` variables. Empty values are skipped: emulators set
/// e.g. `AWS_SESSION_TOKEN=""`, which is no token.
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
    builder
}
