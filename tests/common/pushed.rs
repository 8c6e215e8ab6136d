//! What the pushed-Kinesis tests share: deploying a query file on the
//! AWS stand-in and reading objects back from S3.

/// `skein deploy FILE --backend lambda --json` with `store`: the JSON line
/// it prints; fails the test if the deploy fails.
pub async fn deploy(store: &str, sql: &str) -> serde_json::Value {
    let (ok, stdout, stderr) = tokio::task::spawn_blocking({
        let (store, sql) = (store.to_string(), sql.to_string());
        move || {
            super::skein_on_aws(
                Some(&store),
                &["deploy", &sql, "--backend", "lambda", "--json"],
            )
        }
    })
    .await
    .unwrap();
    assert!(ok, "deploy failed:\n{stdout}\n{stderr}");
    serde_json::from_str(
        stdout
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .expect("a JSON line"),
    )
    .unwrap()
}

/// The bytes of `key` in `bucket`.
pub async fn object(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Vec<u8> {
    s3.get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GetObject {key}: {}", super::error_chain(&e)))
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes()
        .to_vec()
}
