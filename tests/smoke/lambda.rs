//! Lambda smoke test: the real `skein-function` binary, zipped as the single
//! entry `bootstrap`, deployed with CreateFunction (provided.al2023) on
//! ministack, which runs it as a local process. Invoked synchronously
//! (RequestResponse) and asynchronously (Event); both must see the function's
//! environment, and a bad payload must come back as an error, not a crash.

use crate::common;

use std::io::{Cursor, Write};
use std::time::Duration;

use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::{Environment, FunctionCode, InvocationType, Runtime, State};
use serde_json::{Value, json};
use zip::write::SimpleFileOptions;

/// The bootstrap cargo built for this test run.
const FUNCTION_BINARY: &str = env!("CARGO_BIN_EXE_skein-function");

/// ministack does not check the role; real Lambda needs one that exists.
const ROLE: &str = "arn:aws:iam::000000000000:role/skein-smoke";

/// A Lambda zip package: one entry `bootstrap`, executable.
fn package(binary: &[u8]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    // Stored, not deflated: deflating a debug binary with unoptimised
    // dependencies takes longer than the rest of the test.
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .unix_permissions(0o755)
        .large_file(binary.len() >= u32::MAX as usize);
    zip.start_file("bootstrap", options).expect("zip entry");
    zip.write_all(binary).expect("zip write");
    zip.finish().expect("zip finish").into_inner()
}

#[tokio::test]
async fn skein_function_on_ministack_lambda() {
    let config = common::aws_sdk_config().await;
    let lambda = aws_sdk_lambda::Client::new(&config);
    let s3 = common::s3_client().await;

    let name = common::unique_name("skein-smoke");
    let token = common::unique_name("token");
    let bucket = "skein-smoke-probes";
    common::ensure_bucket(&s3, bucket).await;

    // Packaged as `skein deploy` does: a debug build is past Lambda's
    // unzipped limit until stripped.
    let binary = skein_lambda::package::stripped(std::path::Path::new(FUNCTION_BINARY))
        .unwrap_or_else(|e| panic!("reading {FUNCTION_BINARY}: {e:#}"));
    let zip = package(&binary);

    lambda
        .create_function()
        .function_name(&name)
        .runtime(Runtime::Providedal2023)
        .handler("bootstrap")
        .role(ROLE)
        .timeout(30)
        .memory_size(256)
        .code(FunctionCode::builder().zip_file(Blob::new(zip)).build())
        .environment(
            Environment::builder()
                .variables("SKEIN_PROBE_TOKEN", &token)
                .variables("SKEIN_STAGE", "smoke-00-00")
                // A bench function may record probe reports, under this prefix only.
                .variables(
                    "SKEIN_BENCH",
                    json!({"run": "smoke", "record_prefix": format!("s3://{bucket}/{name}/")})
                        .to_string(),
                )
                .variables("RUST_LOG", "info")
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("CreateFunction {name}: {}", common::error_chain(&e)));

    common::within(30, "waiting for the function to become Active", async {
        loop {
            let conf = lambda
                .get_function_configuration()
                .function_name(&name)
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!("GetFunctionConfiguration: {}", common::error_chain(&e))
                });
            match conf.state() {
                Some(State::Active) | None => break,
                Some(State::Failed) => panic!("function {name} failed: {:?}", conf.state_reason()),
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await;

    // 1. Synchronous probe: the report comes back in the response.
    let (error, report) = invoke(
        &lambda,
        &name,
        InvocationType::RequestResponse,
        json!({"probe": {}}),
    )
    .await;
    assert_eq!(error, None, "probe failed: {report}");
    assert_eq!(report["function_name"], json!(name), "{report}");
    assert_eq!(report["env"]["SKEIN_PROBE_TOKEN"], json!(token), "{report}");
    assert_eq!(
        report["env"]["SKEIN_STAGE"],
        json!("smoke-00-00"),
        "{report}"
    );

    // 2. A payload it does not understand: an error that says why, no crash.
    let (error, body) = invoke(
        &lambda,
        &name,
        InvocationType::RequestResponse,
        json!({"nonsense": 1}),
    )
    .await;
    assert!(
        error.is_some(),
        "a bad payload must be a function error: {body}"
    );
    assert_eq!(body["errorType"], json!("Skein.InvalidPayload"), "{body}");
    assert!(
        body["errorMessage"]
            .as_str()
            .unwrap_or_default()
            .contains("nonsense"),
        "the error should name what was wrong: {body}"
    );

    // 3. Asynchronous probe: nobody reads the response, so the function
    //    writes its report to S3 through the same endpoint.
    let key = format!("{name}/event.json");
    let probe = json!({"probe": {"record_to": format!("s3://{bucket}/{key}")}});
    let accepted = lambda
        .invoke()
        .function_name(&name)
        .invocation_type(InvocationType::Event)
        .payload(Blob::new(probe.to_string()))
        .send()
        .await
        .unwrap_or_else(|e| panic!("Invoke (Event): {}", common::error_chain(&e)));
    assert_eq!(accepted.status_code(), 202);

    let recorded = common::within(60, "waiting for the async probe's report in S3", async {
        loop {
            if let Ok(object) = s3.get_object().bucket(bucket).key(&key).send().await {
                let bytes = object
                    .body
                    .collect()
                    .await
                    .expect("reading the report")
                    .into_bytes();
                break serde_json::from_slice::<Value>(&bytes).expect("report is JSON");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    assert_eq!(recorded["function_name"], json!(name), "{recorded}");
    assert_eq!(
        recorded["env"]["SKEIN_PROBE_TOKEN"],
        json!(token),
        "{recorded}"
    );

    // Still serving after all that.
    let (error, _) = invoke(
        &lambda,
        &name,
        InvocationType::RequestResponse,
        json!({"probe": true}),
    )
    .await;
    assert_eq!(error, None);

    if let Err(e) = lambda.delete_function().function_name(&name).send().await {
        eprintln!(
            "note: could not delete function {name}: {}",
            common::error_chain(&e)
        );
    }
}

/// Invokes `name` and returns (FunctionError, response payload as JSON).
async fn invoke(
    lambda: &aws_sdk_lambda::Client,
    name: &str,
    kind: InvocationType,
    payload: Value,
) -> (Option<String>, Value) {
    let response = common::within(
        60,
        "invoking the function",
        lambda
            .invoke()
            .function_name(name)
            .invocation_type(kind)
            .payload(Blob::new(payload.to_string()))
            .send(),
    )
    .await
    .unwrap_or_else(|e| panic!("Invoke {name}: {}", common::error_chain(&e)));
    let body = response
        .payload()
        .map(|b| {
            serde_json::from_slice(b.as_ref())
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b.as_ref()).into_owned()))
        })
        .unwrap_or(Value::Null);
    (response.function_error().map(str::to_owned), body)
}
