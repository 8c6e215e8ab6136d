//! `skein-function`: the Lambda bootstrap binary (runtime `provided.al2023`).
//!
//! One binary serves every function of every query; what an invocation asks for
//! is told apart by the shape of its JSON payload. A probe (below) reports what
//! the function sees; anything else is a stage request (a trigger or a data
//! payload) for the generic stage handler, built once per warm instance from
//! the cloud context in `SKEIN_CONTEXT` (read from the object store named by
//! `SKEIN_STORE` when it was spilled there). Probes, which the test harness
//! uses to check that a deployed function runs and sees its environment:
//!
//! ```json
//! {"probe": {}}                                    -> report in the response
//! {"probe": {"record_to": "s3://bucket/key.json"}} -> report also written there
//! ```
//!
//! The report also lists what the instance's stage still waits for
//! (`pending`): before committing an epoch, `skein run --backend lambda`
//! asks every function that takes payloads.
//!
//! `record_to` exists for asynchronous (`Event`) invokes, whose response nobody
//! reads; it takes `s3://bucket/key` (S3 configured from the usual `AWS_*`
//! variables) or `file:///absolute/path`.
//!
//! `{"exchange": {...}}` requests are the two sides of `skein bench lambda
//! --exchange` (payloads vs S3 between two functions; `skein_lambda::exchange`).
//!
//! Exchange requests and `record_to` act with the function's role, so only a
//! bench function serves them, within the scope its `SKEIN_BENCH` names
//! (`skein_lambda::bench_scope`); a query's functions refuse them. The
//! request is parsed once, into `skein_engine::request::Request`.
//!
//! Bad input never panics the function: it becomes a Lambda error whose type
//! and message say what was wrong.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::time::Duration;

use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Serialize;
use serde_json::Value;
use skein_connectors::kinesis::parse_kinesis_event;
use skein_connectors::store::s3_from_env;
use skein_engine::EngineError;
use skein_engine::context::{CONTEXT_ENV, CloudContext};
use skein_engine::function::{FunctionEnv, StageFunction};
use skein_engine::planner::{PlanOptions, plan_query, session};
use skein_engine::request::Request;
use skein_engine::usage::Usage;
use skein_lambda::bench_scope::{BenchScope, ScopeError};
use skein_lambda::exchange::{self, ExchangeEnv, ExchangeRequest};
use skein_lambda::standing::{self, DRIVER_ENV, TickReport};
use skein_lambda::{LambdaInvoker, STORE_ENV};
use tokio::sync::OnceCell;

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

    // The stage handler of this instance: built on the first stage request
    // (a cold start), then kept with its arena while the instance is warm.
    let stage: Arc<OnceCell<StageFunction>> = Arc::new(OnceCell::new());
    let exchange_env: Arc<OnceCell<ExchangeEnv>> = Arc::new(OnceCell::new());
    // What the engine measures, written after each invocation as
    // CloudWatch embedded-metric-format lines (docs/metrics.md).
    let emf = skein_lambda::emf::EmfRecorder::install();
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let (stage, exchange_env, emf) = (stage.clone(), exchange_env.clone(), emf.clone());
        async move {
            let function = event.context.env_config.function_name.clone();
            let own = OwnUsage::start(&stage);
            let result = handle(event, stage.clone(), exchange_env).await;
            if let Some(emf) = &emf {
                emf.print(&function);
            }
            result.map(|answer| own.add_to(answer, &stage))
        }
    }))
    .await
}

/// This invocation's own cost, measured around its handler, for the
/// `usage` of its answer (skein_engine::usage): Lambda bills the handler's
/// time rounded up to 1 ms.
struct OwnUsage {
    started: std::time::Instant,
    cpu_s: f64,
    /// Objects and bytes the stage had written to its checkpoint store.
    written: (u64, u64),
}

impl OwnUsage {
    fn start(stage: &OnceCell<StageFunction>) -> Self {
        OwnUsage {
            started: std::time::Instant::now(),
            cpu_s: skein::cost::process_cpu_s(),
            written: checkpoint_written(stage),
        }
    }

    /// The answer with this invocation added to the usage it reports.
    fn add_to(self, mut answer: Value, stage: &OnceCell<StageFunction>) -> Value {
        let Some(fields) = answer.as_object_mut() else {
            return answer;
        };
        let mut usage: Usage = fields
            .get("usage")
            .and_then(|u| serde_json::from_value(u.clone()).ok())
            .unwrap_or_default();
        usage.add(&Usage {
            invocations: 1,
            billed_ms: self.started.elapsed().as_micros().div_ceil(1000) as u64,
            cpu_ms: ((skein::cost::process_cpu_s() - self.cpu_s).max(0.0) * 1000.0).round() as u64,
            payload_bytes: 0,
            checkpoint_puts: checkpoint_written(stage).0.saturating_sub(self.written.0),
            checkpoint_bytes: checkpoint_written(stage).1.saturating_sub(self.written.1),
        });
        if let Ok(u) = serde_json::to_value(usage) {
            fields.insert("usage".into(), u);
        }
        answer
    }
}

/// Objects and bytes this instance's stage has written to its checkpoint
/// store.
fn checkpoint_written(stage: &OnceCell<StageFunction>) -> (u64, u64) {
    stage
        .get()
        .and_then(|s| s.checkpoints())
        .map_or((0, 0), |c| (c.puts(), c.bytes_written()))
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

async fn handle(
    event: LambdaEvent<Value>,
    stage: Arc<OnceCell<StageFunction>>,
    exchange_env: Arc<OnceCell<ExchangeEnv>>,
) -> Result<Value, Diagnostic> {
    let (payload, context) = event.into_parts();
    let request = Request::from_value(payload).map_err(|e| invalid(e.to_string()))?;
    match request {
        Request::Exchange(request) => {
            let request: ExchangeRequest = serde_json::from_value(request)
                .map_err(|e| invalid(format!("bad exchange request: {e}")))?;
            bench_scope("an exchange request")?
                .check_exchange(&request)
                .map_err(refused)?;
            let env = exchange_env
                .get_or_try_init(build_exchange_env)
                .await
                .map_err(internal)?;
            exchange::handle(request, env)
                .await
                .map_err(|e| Diagnostic {
                    error_type: "Skein.Exchange".into(),
                    error_message: format!("{}: {e}", context.env_config.function_name),
                })
        }
        Request::DeadLetter(record) => {
            let record = Value::Object(record);
            let url = std::env::var(STORE_ENV).map_err(|_| {
                internal(format!("a dead letter arrived but {STORE_ENV} is not set"))
            })?;
            let store = skein_lambda::store::open(&url).map_err(|e| internal(e.to_string()))?;
            let key = skein_lambda::dead_letter::record(&store, &record, &context.request_id)
                .await
                .map_err(|e| internal(format!("recording a dead letter: {e}")))?;
            tracing::warn!(%key, "async invocation failed its retries; recorded");
            Ok(serde_json::json!({ "recorded": key }))
        }
        Request::Records(event) => {
            let batch = match parse_kinesis_event(&event) {
                Some(batch) => batch.map_err(|e| invalid(format!("bad Kinesis event: {e}")))?,
                None => {
                    return Err(invalid(
                        "an event with Records that is not from Kinesis".into(),
                    ));
                }
            };
            let function = &context.env_config.function_name;
            let stage = stage
                .get_or_try_init(build_stage)
                .await
                .map_err(|e| engine_error(function, &e))?;
            let response = stage
                .run_pushed(batch.batch_id, &batch.records)
                .await
                .map_err(|e| engine_error(function, &e))?;
            pushed_answer(stage.context(), function, &response).await
        }
        Request::Drive(drive) => {
            // Only the driver function of this very query runs its ticks.
            let drives = std::env::var(DRIVER_ENV).unwrap_or_default();
            if drives.is_empty() || drives != drive.query {
                return Err(Diagnostic {
                    error_type: "Skein.Refused".into(),
                    error_message: format!(
                        "{}: a driver tick for {} is not served here",
                        context.env_config.function_name, drive.query
                    ),
                });
            }
            let report = drive_tick(&drive.query, &context.request_id)
                .await
                .map_err(|e| internal(format!("{}: {e}", context.env_config.function_name)))?;
            serde_json::to_value(&report).map_err(|e| internal(format!("encoding the report: {e}")))
        }
        request @ (Request::Trigger(_) | Request::Data(_)) => {
            let function = &context.env_config.function_name;
            let stage = stage
                .get_or_try_init(build_stage)
                .await
                .map_err(|e| engine_error(function, &e))?;
            let response = stage
                .serve(request)
                .await
                .map_err(|e| engine_error(function, &e))?;
            serde_json::to_value(&response)
                .map_err(|e| internal(format!("encoding the response: {e}")))
        }
        Request::Probe(probe) => {
            let mut report = ProbeReport::new(&context);
            if let Some(stage) = stage.get() {
                report.pending = stage.pending().await;
            }
            tracing::debug!(recorded = probe.record_to.is_some(), "probe answered");
            if let Some(target) = &probe.record_to {
                bench_scope("a probe with record_to")?
                    .check_record_to(target)
                    .map_err(refused)?;
                record(target, &report).await?;
            }
            serde_json::to_value(&report).map_err(|e| internal(format!("encoding report: {e}")))
        }
    }
}

/// The answer to a pushed batch: the function's response with
/// `batchItemFailures` naming its first poison record, so the mapping
/// retries from it (bisecting) and, after its retries, hands it to the
/// on-failure destination. Each poison record is recorded with the query's
/// dead letters first, whatever the platform does.
async fn pushed_answer(
    ctx: &CloudContext,
    function: &str,
    response: &skein_engine::function::Response,
) -> Result<Value, Diagnostic> {
    if !response.poison.is_empty() {
        let url = std::env::var(STORE_ENV)
            .map_err(|_| internal(format!("poison records but {STORE_ENV} is not set")))?;
        let store = skein_lambda::store::open(&url).map_err(|e| internal(e.to_string()))?;
        for p in &response.poison {
            let key =
                skein_lambda::dead_letter::record_poison(&store, &ctx.query_code, function, p)
                    .await
                    .map_err(|e| internal(format!("recording a poison record: {e}")))?;
            tracing::warn!(%key, shard = %p.partition, sequence = %p.position, reason = %p.reason, "poison record");
        }
    }
    let failures: Vec<Value> = response
        .poison
        .first()
        .map(|p| serde_json::json!({ "itemIdentifier": p.position }))
        .into_iter()
        .collect();
    let mut answer = serde_json::to_value(response)
        .map_err(|e| internal(format!("encoding the response: {e}")))?;
    answer["batchItemFailures"] = Value::Array(failures);
    Ok(answer)
}

/// This function's bench scope; an error for a function that is not one.
fn bench_scope(what: &'static str) -> Result<BenchScope, Diagnostic> {
    match BenchScope::from_env() {
        Ok(Some(scope)) => Ok(scope),
        Ok(None) => Err(refused(ScopeError::NotBench { what })),
        Err(e) => Err(internal(e.to_string())),
    }
}

fn refused(e: ScopeError) -> Diagnostic {
    tracing::warn!(error = %e, "request refused");
    Diagnostic {
        error_type: "Skein.Refused".into(),
        error_message: e.to_string(),
    }
}

/// The stage handler from the cloud context in the environment.
async fn build_stage() -> Result<StageFunction, EngineError> {
    let value = std::env::var(CONTEXT_ENV).map_err(|_| {
        EngineError::Context(format!(
            "{CONTEXT_ENV} is not set: this function was not deployed by skein"
        ))
    })?;
    let store = match std::env::var(STORE_ENV) {
        Ok(url) if !url.is_empty() => {
            Some(skein_lambda::store::open(&url).map_err(|e| EngineError::Context(e.to_string()))?)
        }
        _ => None,
    };
    let ctx = CloudContext::from_env(&value, store.as_ref()).await?;
    // A cold instance of a checkpointing query loads the last commit.
    let checkpoints = skein_lambda::checkpoints::attach_from_env(&ctx)
        .map_err(|e| EngineError::Context(e.to_string()))?
        .map(Arc::new);
    let sdk = skein_lambda::sdk_config().await;
    let skein::registry::Registries { sources, sinks, .. } = skein::registry::registries();
    let env = FunctionEnv {
        sources,
        sinks,
        store,
        invoker: Arc::new(LambdaInvoker::new(&sdk)),
        max_backoff: Duration::from_secs(2),
        late: Default::default(),
        checkpoints,
        // A Lambda run's bound is kept by its driver, not its functions.
        bound: Default::default(),
    };
    let stage = StageFunction::new(ctx, env)?;
    tracing::info!(stage = stage.name(), "stage handler ready");
    Ok(stage)
}

/// One tick of a standing query: its spec from the store, the plan made
/// again from the query text (the source kinds are known here), the rest
/// in `skein_lambda::standing`.
async fn drive_tick(query: &str, holder: &str) -> Result<TickReport, String> {
    let url = std::env::var(STORE_ENV)
        .map_err(|_| format!("a driver tick arrived but {STORE_ENV} is not set"))?;
    let store = skein_lambda::store::open(&url).map_err(|e| e.to_string())?;
    let spec = standing::get_spec(&store, query)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no standing spec of {query} in {url} (deploy it again)"))?;
    let skein::registry::Registries { sources, .. } = skein::registry::registries();
    let ctx = session(&sources, spec.group_size);
    let options = PlanOptions {
        group_size: spec.group_size,
        encoding: spec.encoding,
        ..Default::default()
    };
    let mut plan = plan_query(&ctx, &spec.sql, &options)
        .await
        .map_err(|e| format!("planning {query}: {e}"))?;
    standing::route_collect(&mut plan, &spec.store);
    standing::tick(&spec, &plan, holder)
        .await
        .map_err(|e| e.to_string())
}

/// The invoker and store of the exchange benchmark, once per instance.
async fn build_exchange_env() -> Result<ExchangeEnv, String> {
    let url = std::env::var(STORE_ENV)
        .map_err(|_| format!("an exchange request arrived but {STORE_ENV} is not set"))?;
    let store = skein_lambda::store::open(&url).map_err(|e| e.to_string())?;
    let sdk = skein_lambda::sdk_config().await;
    Ok(ExchangeEnv {
        invoker: Arc::new(LambdaInvoker::new(&sdk)),
        store,
    })
}

/// An engine error as a Lambda error; the message names this function (the
/// stage) and, for payload errors, the payload's uuid.
fn engine_error(function: &str, e: &EngineError) -> Diagnostic {
    let error_type = match e {
        EngineError::BadPayload { .. } | EngineError::BadEnvelope(_) => "Skein.InvalidPayload",
        EngineError::Context(_) => "Skein.Context",
        _ => "Skein.Engine",
    };
    tracing::warn!(function, error = %e, "stage request failed");
    Diagnostic {
        error_type: error_type.into(),
        error_message: format!("{function}: {e}"),
    }
}

#[derive(Debug, Serialize)]
struct ProbeReport {
    function_name: String,
    request_id: String,
    /// Every `SKEIN_*` variable of the process, sorted by name.
    env: BTreeMap<String, String>,
    /// What this instance's stage waits for (the driver asks before a
    /// commit); empty when it has not built its stage.
    pending: Vec<String>,
}

impl ProbeReport {
    fn new(context: &lambda_runtime::Context) -> Self {
        // The context may hold source credentials: its size only.
        let env = std::env::vars()
            .filter(|(k, _)| k.starts_with("SKEIN_"))
            .map(|(k, v)| match k.as_str() {
                CONTEXT_ENV => (k, format!("<{} bytes>", v.len())),
                _ => (k, v),
            })
            .collect();
        Self {
            function_name: context.env_config.function_name.clone(),
            request_id: context.request_id.clone(),
            env,
            pending: vec![],
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

#[cfg(test)]
mod tests {
    use super::*;

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
