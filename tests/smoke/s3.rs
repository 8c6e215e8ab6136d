//! S3 smoke test: object_store (the crate the S3 sink and checkpoints use)
//! puts, gets and lists objects on ministack's S3.

use crate::common;

use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

#[tokio::test]
async fn object_store_put_get_list_on_s3() {
    let endpoint = common::require_aws();
    let bucket = common::unique_name("skein-smoke");
    common::ensure_bucket(&common::s3_client().await, &bucket).await;

    let (key_id, secret) = common::aws_credentials();
    let store = AmazonS3Builder::new()
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_region(common::aws_region())
        .with_bucket_name(&bucket)
        .with_access_key_id(key_id)
        .with_secret_access_key(secret)
        .build()
        .expect("S3 store");

    let objects = [
        ("results/epoch=1/part-0.json", "{\"count\":1}"),
        ("results/epoch=1/part-1.json", "{\"count\":2}"),
        ("checkpoints/q1.json", "{\"offsets\":[0,0]}"),
    ];
    for (key, body) in objects {
        common::within(
            30,
            "putting an object",
            store.put(&Path::from(key), PutPayload::from(body)),
        )
        .await
        .unwrap_or_else(|e| panic!("PUT s3://{bucket}/{key}: {e}"));
    }

    for (key, body) in objects {
        let bytes = store
            .get(&Path::from(key))
            .await
            .unwrap_or_else(|e| panic!("GET s3://{bucket}/{key}: {e}"))
            .bytes()
            .await
            .expect("reading the body");
        assert_eq!(bytes.as_ref(), body.as_bytes(), "s3://{bucket}/{key}");
    }

    let mut listed: Vec<String> = store
        .list(Some(&Path::from("results")))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .expect("LIST");
    listed.sort();
    assert_eq!(
        listed,
        ["results/epoch=1/part-0.json", "results/epoch=1/part-1.json"]
    );

    // Conditional create: the sinks rely on it for idempotent writes.
    let again = store
        .put_opts(
            &Path::from("checkpoints/q1.json"),
            PutPayload::from("{}"),
            object_store::PutMode::Create.into(),
        )
        .await;
    assert!(
        matches!(again, Err(object_store::Error::AlreadyExists { .. })),
        "a create-only put over an existing key must fail with AlreadyExists, got {again:?}"
    );
}
