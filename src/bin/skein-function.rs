//! `skein-function`: the Lambda bootstrap binary (runtime `provided.al2023`).
//!
//! One binary serves every function of every query; what an invocation asks for
//! is told apart by the shape of its JSON payload. For now it answers probes,
//! which the test harness uses to check that a deployed function runs and sees
//! the environment it was created with:
//!
//! ```json
//! {"probe": {}}                                    -> report in the response
//! {"probe": {"record_to": "s3://bucket/key.json"}} -> report also written there
//! ```
//!
//! `record_to` exists for asynchronous (`Event`) invokes, whose response nobody
//! reads; it takes `s3://bucket/key` (S3 configured from the usual `AWS_*`
//! variables) or `file:///absolute/path`.
//!
//! Bad input never panics the function: it becomes a Lambda error whose type
//! and message say what was wrong.

use std::collections::BTreeMap;
use std::sync::Arc;

use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Variables a Lambda runtime must provide; `lambda_runtime` panics without them.
const RUNTIME_VARS: [&str; 4] = [
    "AWS_LAMBDA_RUNTIME_API",
    "AWS_LAMBDA_FUNCTION_NAME",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
    "AWS_LAMBDA_FUNCTION_VERSION",
];

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_logging();

    // Started by hand rather than by a Lambda runtime: say so instead of panicking.
    let missing: Vec<&str> = RUNTIME_VARS
        .into_iter()
        .filter(|v| std::env::var_os(v).is_none())
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "skein-function is a Lambda bootstrap and runs under a Lambda runtime \
             (AWS Lambda, or ministack via scripts/services.sh); missing: {}",
            missing.join(", ")
        );
        std::process::exit(2);
    }

    lambda_runtime::run(service_fn(handle)).await
}

/// Plain lines on stdout, which the Lambda runtime forwards to the function's
/// log: no colours (a log file is not a terminal) and no time (every line is
/// stamped there). Level from `AWS_LAMBDA_LOG_LEVEL`, else `RUST_LOG`, else info.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .ok()
        .and_then(|level| EnvFilter::try_new(level.to_lowercase()).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .without_time()
        .init();
}

/// What an invocation asks for.
#[derive(Debug)]
enum Request {
    Probe(Probe),
}

impl Request {
    /// Tells the kind of payload by its top-level keys.
    fn parse(payload: Value) -> Result<Self, Diagnostic> {
        let Value::Object(mut fields) = payload else {
            return Err(invalid(format!(
                "expected a JSON object, got {}",
                json_kind(&payload)
            )));
        };
        if let Some(probe) = fields.remove("probe") {
            return Probe::parse(probe).map(Request::Probe);
        }
        let keys: Vec<&String> = fields.keys().collect();
        Err(invalid(format!(
            "unrecognised payload with keys {keys:?}; expected {{\"probe\": {{...}}}}"
        )))
    }
}

async fn handle(event: LambdaEvent<Value>) -> Result<Value, Diagnostic> {
    let (payload, context) = event.into_parts();
    match Request::parse(payload)? {
        Request::Probe(probe) => {
            let report = ProbeReport::new(&context);
            tracing::info!(recorded = probe.record_to.is_some(), "probe answered");
            if let Some(target) = &probe.record_to {
                record(target, &report).await?;
            }
            serde_json::to_value(&report).map_err(|e| internal(format!("encoding report: {e}")))
        }
    }
}

/// A probe: reports what the function sees.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Probe {
    /// Where to also write the report: `s3://bucket/key` or `file:///path`.
    record_to: Option<String>,
}

impl Probe {
    fn parse(value: Value) -> Result<Self, Diagnostic> {
        match value {
            Value::Bool(true) => Ok(Probe::default()),
            Value::Object(_) => {
                serde_json::from_value(value).map_err(|e| invalid(format!("bad probe: {e}")))
            }
            other => Err(invalid(format!(
                "bad probe: expected an object or true, got {}",
                json_kind(&other)
            ))),
        }
    }
}

#[derive(Debug, Serialize)]
struct ProbeReport {
    function_name: String,
    request_id: String,
    /// Every `SKEIN_*` variable of the process, sorted by name.
    env: BTreeMap<String, String>,
}

impl ProbeReport {
    fn new(context: &lambda_runtime::Context) -> Self {
        let env = std::env::vars()
            .filter(|(k, _)| k.starts_with("SKEIN_"))
            .collect();
        Self {
            function_name: context.env_config.function_name.clone(),
            request_id: context.request_id.clone(),
            env,
        }
    }
}

/// Writes the report to `target` (`s3://bucket/key` or `file:///path`).
async fn record(target: &str, report: &ProbeReport) -> Result<(), Diagnostic> {
    let (store, path) = open_target(target)?;
    let body =
        serde_json::to_vec_pretty(report).map_err(|e| internal(format!("encoding report: {e}")))?;
    store
        .put(&path, PutPayload::from(body))
        .await
        .map_err(|e| Diagnostic {
            error_type: "Skein.RecordFailed".into(),
            error_message: format!("writing the probe report to {target}: {e}"),
        })?;
    Ok(())
}

fn open_target(target: &str) -> Result<(Arc<dyn ObjectStore>, Path), Diagnostic> {
    if let Some(rest) = target.strip_prefix("s3://") {
        let (bucket, key) = rest
            .split_once('/')
            .filter(|(b, k)| !b.is_empty() && !k.is_empty())
            .ok_or_else(|| invalid(format!("record_to {target:?}: expected s3://bucket/key")))?;
        let store = s3_from_env(bucket)
            .map_err(|e| invalid(format!("record_to {target:?}: S3 configuration: {e}")))?;
        let path = Path::parse(key).map_err(|e| invalid(format!("record_to {target:?}: {e}")))?;
        Ok((Arc::new(store), path))
    } else if let Some(file) = target.strip_prefix("file://") {
        let path = Path::from_absolute_path(file)
            .map_err(|e| invalid(format!("record_to {target:?}: {e}")))?;
        Ok((Arc::new(LocalFileSystem::new()), path))
    } else {
        Err(invalid(format!(
            "record_to {target:?}: expected s3://bucket/key or file:///path"
        )))
    }
}

/// S3 from the `AWS_*` variables a Lambda runtime sets. Empty values are
/// skipped: emulators set e.g. `AWS_SESSION_TOKEN=""`, which is no token.
fn s3_from_env(bucket: &str) -> object_store::Result<object_store::aws::AmazonS3> {
    let mut builder = AmazonS3Builder::new().with_bucket_name(bucket);
    for (key, value) in std::env::vars() {
        if value.is_empty() || !key.starts_with("AWS_") {
            continue;
        }
        if let Ok(config_key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
            builder = builder.with_config(config_key, value);
        }
    }
    // A local stand-in (AWS_ENDPOINT_URL=http://...) speaks plain HTTP.
    let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .unwrap_or_default();
    if endpoint.starts_with("http://") {
        builder = builder.with_allow_http(true);
    }
    builder.build()
}

fn invalid(message: String) -> Diagnostic {
    Diagnostic {
        error_type: "Skein.InvalidPayload".into(),
        error_message: message,
    }
}

fn internal(message: String) -> Diagnostic {
    Diagnostic {
        error_type: "Skein.Internal".into(),
        error_message: message,
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_probe_forms() {
        assert!(matches!(
            Request::parse(json!({"probe": true})),
            Ok(Request::Probe(_))
        ));
        let Ok(Request::Probe(p)) = Request::parse(json!({"probe": {"record_to": "s3://b/k"}}))
        else {
            panic!("probe with record_to not parsed");
        };
        assert_eq!(p.record_to.as_deref(), Some("s3://b/k"));
    }

    #[test]
    fn rejects_bad_payloads_with_a_reason() {
        for (payload, needle) in [
            (json!([1, 2]), "expected a JSON object"),
            (json!({"nonsense": 1}), "unrecognised payload"),
            (json!({"probe": 7}), "bad probe"),
            (json!({"probe": {"record_too": "x"}}), "unknown field"),
        ] {
            let err = Request::parse(payload).unwrap_err();
            assert_eq!(err.error_type, "Skein.InvalidPayload");
            assert!(err.error_message.contains(needle), "{}", err.error_message);
        }
    }

    #[test]
    fn rejects_bad_record_targets() {
        for target in [
            "s3://bucket-only",
            "s3:///key",
            "http://x/y",
            "file://relative",
        ] {
            assert!(open_target(target).is_err(), "{target} accepted");
        }
    }
}
