//! The Lambda handler: what the `skein-function` bootstrap binary (runtime
//! `provided.al2023`) runs.
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
//! --exchange` (payloads vs S3 between two functions; `crate::exchange`).
//!
//! Exchange requests and `record_to` act with the function's role, so only a
//! bench function serves them, within the scope its `SKEIN_BENCH` names
//! (`crate::bench_scope`); a query's functions refuse them. The
//! request is parsed once, into `skein_engine::request::Request`.
//!
//! Bad input never panics the function: it becomes a Lambda error whose type
//! and message say what was wrong.

mod probe;

use std::sync::Arc;
use std::time::Duration;

use lambda_runtime::{Diagnostic, LambdaEvent, service_fn};
use serde_json::Value;
use skein_engine::EngineError;
use skein_engine::catalog::Catalog;
use skein_engine::context::{CONTEXT_ENV, CloudContext};
use skein_engine::function::{FunctionEnv, StageFunction};
use skein_engine::request::Request;
use skein_engine::usage::{Usage, process_cpu_s};
use tokio::sync::OnceCell;

use crate::bench_scope::{BenchScope, ScopeError};
use crate::exchange::{self, ExchangeEnv, ExchangeRequest};
use crate::pushed::parse_kinesis_event;
use crate::standing::{self, DRIVER_ENV, TickReport};
use crate::{LambdaInvoker, STORE_ENV};
use probe::{ProbeReport, record};

/// Variables a Lambda runtime must provide; `lambda_runtime` panics without them.
pub const RUNTIME_VARS: [&str; 4] = [
    "AWS_LAMBDA_RUNTIME_API",
    "AWS_LAMBDA_FUNCTION_NAME",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
    "AWS_LAMBDA_FUNCTION_VERSION",
];

/// The runtime variables this process lacks: started by hand rather than
/// by a Lambda runtime.
pub fn missing_runtime_vars() -> Vec<&'static str> {
    RUNTIME_VARS
        .into_iter()
        .filter(|v| std::env::var_os(v).is_none())
        .collect()
}

/// Serve invocations until the runtime stops, with the table kinds of
/// `catalog`.
pub async fn serve(catalog: Catalog) -> Result<(), lambda_runtime::Error> {
    let catalog = Arc::new(catalog);
    // The stage handler of this instance: built on the first stage request
    // (a cold start), then kept with its arena while the instance is warm.
    let stage: Arc<OnceCell<StageFunction>> = Arc::new(OnceCell::new());
    let exchange_env: Arc<OnceCell<ExchangeEnv>> = Arc::new(OnceCell::new());
    // What the engine measures, written after each invocation as
    // CloudWatch embedded-metric-format lines (docs/metrics.md).
    let emf = crate::emf::EmfRecorder::install();
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let (stage, exchange_env, emf) = (stage.clone(), exchange_env.clone(), emf.clone());
        let catalog = catalog.clone();
        async move {
            let function = event.context.env_config.function_name.clone();
            let own = OwnUsage::start(&stage);
            let result = handle(event, &catalog, stage.clone(), exchange_env).await;
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
            cpu_s: process_cpu_s(),
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
        let billed_ms = self.started.elapsed().as_micros().div_ceil(1000) as u64;
        let (puts, bytes) = checkpoint_written(stage);
        usage.add(&Usage {
            invocations: 1,
            billed_ms,
            cpu_ms: ((process_cpu_s() - self.cpu_s).max(0.0) * 1000.0).round() as u64,
            payload_bytes: 0,
            checkpoint_puts: puts.saturating_sub(self.written.0),
            checkpoint_bytes: bytes.saturating_sub(self.written.1),
            // The stage's own work is in the answer already: the function
            // measured it without its waits on callees.
            busy_ms_by_stage: Default::default(),
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

async fn handle(
    event: LambdaEvent<Value>,
    catalog: &Catalog,
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
            let store = crate::store::open(&url).map_err(|e| internal(e.to_string()))?;
            let key = crate::dead_letter::record(&store, &record, &context.request_id)
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
            let stage = stage_of(&stage, catalog, function).await?;
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
            let report = drive_tick(catalog, &drive.query, &context.request_id)
                .await
                .map_err(|e| internal(format!("{}: {e}", context.env_config.function_name)))?;
            serde_json::to_value(&report).map_err(|e| internal(format!("encoding the report: {e}")))
        }
        request @ (Request::Trigger(_) | Request::Data(_)) => {
            let function = &context.env_config.function_name;
            let stage = stage_of(&stage, catalog, function).await?;
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
        let store = crate::store::open(&url).map_err(|e| internal(e.to_string()))?;
        for p in &response.poison {
            let key = crate::dead_letter::record_poison(&store, &ctx.query_code, function, p)
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
/// The function's stage, built on its first request.
async fn stage_of<'a>(
    stage: &'a OnceCell<StageFunction>,
    catalog: &Catalog,
    function: &str,
) -> Result<&'a StageFunction, Diagnostic> {
    stage
        .get_or_try_init(|| build_stage(catalog))
        .await
        .map_err(|e| engine_error(function, &e))
}

async fn build_stage(catalog: &Catalog) -> Result<StageFunction, EngineError> {
    let value = std::env::var(CONTEXT_ENV).map_err(|_| {
        EngineError::Context(format!(
            "{CONTEXT_ENV} is not set: this function was not deployed by skein"
        ))
    })?;
    let store = match std::env::var(STORE_ENV) {
        Ok(url) if !url.is_empty() => {
            Some(crate::store::open(&url).map_err(|e| EngineError::Context(e.to_string()))?)
        }
        _ => None,
    };
    let ctx = CloudContext::from_env(&value, store.as_ref()).await?;
    // A cold instance of a checkpointing query loads the last commit.
    let checkpoints = crate::checkpoints::attach_from_env(&ctx)
        .map_err(|e| EngineError::Context(e.to_string()))?
        .map(Arc::new);
    // Group sizes are the store's, not the deployment's: a rescale
    // records them and replaces every instance (lambda/src/rescale.rs).
    let ctx = match &checkpoints {
        Some(cs) => match cs.next_layout().await? {
            Some(layout) => ctx.with_layout(&layout),
            None => ctx,
        },
        None => ctx,
    };
    let sdk = crate::sdk_config().await;
    let env = FunctionEnv {
        catalog: catalog.clone(),
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

/// One tick of a standing query: its spec from the store, the plan's
/// shape from the spec, the rest in `crate::standing`.
async fn drive_tick(catalog: &Catalog, query: &str, holder: &str) -> Result<TickReport, String> {
    let url = std::env::var(STORE_ENV)
        .map_err(|_| format!("a driver tick arrived but {STORE_ENV} is not set"))?;
    let store = crate::store::open(&url).map_err(|e| e.to_string())?;
    let spec = standing::get_spec(&store, query)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no standing spec of {query} in {url} (deploy it again)"))?;
    let shape = match &spec.shape {
        Some(shape) => shape.clone(),
        None => shape_from_sql(catalog, &spec)
            .await
            .map_err(|e| format!("{query}: {e}"))?,
    };
    standing::tick(&spec, &shape, holder)
        .await
        .map_err(|e| e.to_string())
}

/// The shape of a spec deployed before specs carried one: planned from its
/// SQL where this binary has the SQL front end.
#[cfg(feature = "sql")]
async fn shape_from_sql(
    catalog: &Catalog,
    spec: &standing::StandingSpec,
) -> Result<skein_engine::planner::PlanShape, String> {
    use skein_engine::catalog::parallelism::SourceBudget;
    use skein_engine::planner::{PlanOptions, plan_query, session};
    let mut catalog = catalog.clone();
    catalog.set_source_budget(SourceBudget::Members(spec.group_size));
    let ctx = session(&catalog, spec.group_size);
    let options = PlanOptions {
        group_size: spec.group_size,
        encoding: spec.encoding,
        ..Default::default()
    };
    let plan = plan_query(&ctx, &spec.sql, &options)
        .await
        .map_err(|e| format!("planning: {e}"))?;
    Ok(plan.shape())
}

#[cfg(not(feature = "sql"))]
async fn shape_from_sql(
    _catalog: &Catalog,
    _spec: &standing::StandingSpec,
) -> Result<skein_engine::planner::PlanShape, String> {
    Err(
        "its spec predates plan shapes and this function has no SQL planner; \
         deploy the query again"
            .into(),
    )
}

/// The invoker and store of the exchange benchmark, once per instance.
async fn build_exchange_env() -> Result<ExchangeEnv, String> {
    let url = std::env::var(STORE_ENV)
        .map_err(|_| format!("an exchange request arrived but {STORE_ENV} is not set"))?;
    let store = crate::store::open(&url).map_err(|e| e.to_string())?;
    let sdk = crate::sdk_config().await;
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
