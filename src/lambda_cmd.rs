//! The Lambda backend on the command line: `skein deploy`, `skein destroy`,
//! `skein status` and `skein package` (`skein run --backend lambda` is in
//! `lambda_run.rs`, `skein bench lambda` in `lambda_bench.rs`).
//!
//! Every function runs the `skein-function` binary that sits next to this
//! one (or `--function-binary`), zipped as `bootstrap`. Results of a query
//! without `INSERT INTO` go to the `RESULTS` sink in the deployment's object
//! store (`--store`, default `s3://skein`) and are read back from there.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use aws_sdk_lambda::types::Architecture;
use clap::{Args, ValueEnum};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::json;
use skein_engine::driver::destroy as destroy_functions;
use skein_engine::invoke::{FunctionService, FunctionSpec};
use skein_engine::planner::{PlanOptions, QueryPlan, plan_query, session};
use skein_lambda::dead_letter;
use skein_lambda::deploy::{Deployed, deploy as deploy_functions};
use skein_lambda::esm;
use skein_lambda::package::{bootstrap_zip, code_sha256};
use skein_lambda::{CodeSource, LambdaFunctionService, RUN_ENV, STORE_ENV, ServiceOptions};

use crate::PlanArgs;
use crate::registry::registries;
use crate::run::read_sql;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The in-process function runtime.
    #[default]
    Local,
    /// AWS Lambda (or a stand-in at AWS_ENDPOINT_URL).
    Lambda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Arch {
    #[value(name = "x86_64")]
    X86_64,
    Arm64,
}

impl Arch {
    pub(crate) fn lambda(self) -> Architecture {
        match self {
            Arch::X86_64 => Architecture::X8664,
            Arch::Arm64 => Architecture::Arm64,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        }
    }

    fn host() -> Option<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }
}

/// Where and how functions are deployed.
#[derive(Args, Clone, Debug)]
pub struct LambdaArgs {
    /// Where the functions run.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,
    /// A ready bootstrap.zip (default: zip the skein-function next to this binary).
    #[arg(long)]
    pub zip: Option<PathBuf>,
    /// The skein-function binary to package when no --zip is given.
    #[arg(long, env = "SKEIN_FUNCTION_BINARY")]
    pub function_binary: Option<PathBuf>,
    /// Execution role of the functions.
    #[arg(
        long,
        env = "SKEIN_LAMBDA_ROLE",
        default_value = "arn:aws:iam::000000000000:role/skein"
    )]
    pub role: String,
    /// Memory of each function, MB [default: 512; `skein cost`: 1769,
    /// one vCPU, which it also prices].
    #[arg(long, value_parser = clap::value_parser!(i32).range(128..=10240))]
    pub memory: Option<i32>,
    /// Timeout of each function, seconds (a synchronous hop waits for the rest of the DAG).
    #[arg(long, default_value_t = 300)]
    pub timeout: i32,
    #[arg(long, value_enum, default_value_t = Arch::X86_64)]
    pub arch: Arch,
    /// Object store for spilled contexts, code and results: s3://bucket or file:///dir.
    #[arg(long, env = "SKEIN_STORE", default_value = "s3://skein")]
    pub store: String,
    /// On-failure destination (SQS, SNS or Lambda ARN) of async invocations
    /// (default: the query's dead-letter function `<query-code>-dlq`, which
    /// records them in the store).
    #[arg(long)]
    pub on_failure: Option<String>,
}

/// Memory of a function deployed without --memory.
const DEFAULT_MEMORY_MB: i32 = 512;

impl LambdaArgs {
    pub fn memory_mb(&self) -> i32 {
        self.memory.unwrap_or(DEFAULT_MEMORY_MB)
    }
}

#[derive(Args, Debug)]
pub struct DeployArgs {
    pub file: PathBuf,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub lambda: LambdaArgs,
    #[command(flatten)]
    pub standing: crate::lambda_standing::StandingArgs,
    /// One JSON line instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DestroyArgs {
    /// A SQL file or a query code (as `skein status` lists them).
    pub query: String,
    /// Also delete the query's checkpoint store (offsets, state, lease),
    /// its standing spec and its dead letters.
    #[arg(long)]
    pub purge: bool,
    /// The deployment's store (where the spec and default checkpoints are).
    #[arg(long, env = "SKEIN_STORE", default_value = "s3://skein")]
    pub store: String,
}

/// The query code of a SQL file, or the argument itself.
pub(crate) fn query_code_arg(query: &str) -> Result<String> {
    if Path::new(query).is_file() {
        let sql = read_sql(Path::new(query))?;
        return Ok(skein_engine::planner::query_code(&sql));
    }
    Ok(query.to_string())
}

#[derive(Args, Debug)]
pub struct PackageArgs {
    #[arg(long, value_enum, default_value_t = Arch::X86_64)]
    pub arch: Arch,
    /// The skein-function binary (default: next to this binary).
    #[arg(long, env = "SKEIN_FUNCTION_BINARY")]
    pub function_binary: Option<PathBuf>,
    /// Where to write the zip (default: bootstrap.zip next to the binary).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

fn function_binary(given: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.clone());
    }
    let me = std::env::current_exe().context("locating the skein binary")?;
    let sibling = me.with_file_name("skein-function");
    if !sibling.exists() {
        bail!(
            "{} not found: build it (cargo build --bin skein-function) or pass --function-binary",
            sibling.display()
        );
    }
    Ok(sibling)
}

/// The binary stripped of symbols and debug info (a debug build is past
/// Lambda's 250 MB unzipped limit, stripped well under it); as is when
/// `strip` is missing.
pub fn stripped(binary: &Path) -> Result<Vec<u8>> {
    let out = std::env::temp_dir().join(format!("skein-bootstrap-{}", std::process::id()));
    let ok = std::process::Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&out)
        .arg(binary)
        .status()
        .is_ok_and(|s| s.success());
    let bytes = if ok {
        std::fs::read(&out)
    } else {
        std::fs::read(binary)
    };
    let _ = std::fs::remove_file(&out);
    bytes.with_context(|| format!("reading {}", binary.display()))
}

/// `skein package`: bootstrap.zip of the built skein-function.
pub fn package(args: PackageArgs) -> Result<()> {
    if Arch::host() != Some(args.arch) {
        bail!(
            "skein package zips the skein-function built for this machine ({}); for {} build it with \
             cargo-lambda or docker/ and pass --zip to deploy",
            std::env::consts::ARCH,
            args.arch.name()
        );
    }
    let binary = function_binary(&args.function_binary)?;
    let zip = bootstrap_zip(&stripped(&binary)?, true)?;
    let out = args
        .out
        .unwrap_or_else(|| binary.with_file_name("bootstrap.zip"));
    std::fs::write(&out, &zip).with_context(|| format!("writing {}", out.display()))?;
    if args.json {
        println!(
            "{}",
            json!({"path": out.display().to_string(), "bytes": zip.len(), "arch": args.arch.name()})
        );
    } else {
        println!(
            "{} ({} bytes, {})",
            out.display(),
            zip.len(),
            args.arch.name()
        );
    }
    Ok(())
}

/// Everything a Lambda command talks to.
pub struct Connection {
    pub(crate) sdk: aws_config::SdkConfig,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) store_url: String,
}

pub(crate) async fn connect(store_url: &str) -> Result<Connection> {
    let sdk = skein_lambda::sdk_config().await;
    skein_lambda::store::ensure_bucket(&sdk, store_url).await?;
    let store = skein_lambda::store::open(store_url)?;
    Ok(Connection {
        sdk,
        store,
        store_url: store_url.trim_end_matches('/').to_string(),
    })
}

/// The code to deploy: a zip in S3 under its hash (uploaded once, not with
/// every function), or the zip itself for a file store.
pub(crate) async fn code(b: &Connection, args: &LambdaArgs) -> Result<(CodeSource, String)> {
    let zip = match &args.zip {
        Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        None => {
            let binary = function_binary(&args.function_binary)?;
            // Stored, not deflated: deflating a debug build takes minutes.
            bootstrap_zip(&stripped(&binary)?, false)?
        }
    };
    let sha = code_sha256(&zip);
    let Some(bucket) = skein_lambda::store::s3_bucket(&b.store_url) else {
        return Ok((CodeSource::Zip(Arc::new(zip)), sha));
    };
    let hex_sha = sha.replace(['/', '+', '='], "_");
    let key = format!("skein/code/{hex_sha}.zip");
    let path = StorePath::from(key.as_str());
    if b.store.head(&path).await.is_err() {
        b.store
            .put(&path, zip.into())
            .await
            .context("uploading the function code")?;
    }
    Ok((
        CodeSource::S3 {
            bucket: bucket.to_string(),
            key,
        },
        sha,
    ))
}

pub(crate) fn run_id() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("{millis}-{:04x}", std::process::id() & 0xffff)
}

/// Plan the query; a query without INSERT INTO writes to the RESULTS sink.
pub(crate) async fn plan(
    sql: &str,
    p: &PlanArgs,
    store_url: &str,
) -> Result<(QueryPlan, datafusion::prelude::SessionContext)> {
    let regs = registries();
    let ctx = session(&regs.sources, p.group_size);
    let mut plan = plan_query(&ctx, sql, &p.options())
        .await
        .context("planning the query")?;
    skein_lambda::standing::route_collect(&mut plan, store_url);
    for (table, offsets) in crate::checkpoint::resume_from_sink(&mut plan).await? {
        tracing::info!(%table, %offsets, "resuming from the sink's checkpoint");
    }
    Ok((plan, ctx))
}

/// The Kinesis tables declared `'mode' 'push'`, with the function an
/// event-source mapping feeds: the source stage's first member.
pub(crate) fn pushed_sources(plan: &QueryPlan) -> Result<Vec<(String, String)>> {
    let mut out = vec![];
    for stage in &plan.stages {
        for leaf in &stage.sources {
            let pushed = leaf.config.kind.eq_ignore_ascii_case("KINESIS")
                && leaf.config.option(esm::MODE_OPTION) == Some(esm::MODE_PUSH);
            if !pushed {
                continue;
            }
            if stage.sources.len() != 1 {
                bail!(
                    "table {} is pushed ('mode' 'push'), but its stage reads {} tables: a pushed \
                     batch feeds a stage that reads that table alone",
                    leaf.table,
                    stage.sources.len()
                );
            }
            // Past the source stage, pushed batches are epochs of the
            // offsets log, taken by one source member.
            if stage.consumer.is_some() && stage.members != 1 {
                bail!(
                    "table {} is pushed ('mode' 'push') and feeds a shuffle, window or aggregate: \
                     its batches become epochs taken by one source member; declare it with \
                     'parallelism' '1' (Lambda still runs one invocation per shard)",
                    leaf.table
                );
            }
            out.push((
                leaf.config.location.clone(),
                skein_engine::context::function_name(&plan.query_code, stage.id, 0),
            ));
        }
    }
    Ok(out)
}

/// Whether a pushed table feeds later stages: its batches are then epochs
/// of the offsets log, so the deployment checkpoints.
fn pushes_into_stages(plan: &QueryPlan) -> bool {
    plan.stages.iter().any(|stage| {
        stage.consumer.is_some()
            && stage.sources.iter().any(|leaf| {
                leaf.config.kind.eq_ignore_ascii_case("KINESIS")
                    && leaf.config.option(esm::MODE_OPTION) == Some(esm::MODE_PUSH)
            })
    })
}

/// The options every function of the query is deployed with: its code
/// (uploaded once) and the on-failure destination of its async invocations
/// (the query's dead-letter function, deployed here, unless --on-failure
/// names another).
pub(crate) async fn service_options(
    b: &Connection,
    args: &LambdaArgs,
    plan: &QueryPlan,
) -> Result<ServiceOptions> {
    let (code, code_sha256) = code(b, args).await?;
    let mut options = ServiceOptions {
        code,
        code_sha256,
        role: args.role.clone(),
        memory_mb: args.memory_mb(),
        timeout_s: args.timeout,
        arch: args.arch.lambda(),
        extra_env: BTreeMap::from([
            (STORE_ENV.to_string(), b.store_url.clone()),
            (RUN_ENV.to_string(), run_id()),
        ]),
        on_failure: None,
    };
    options.on_failure = match &args.on_failure {
        Some(arn) => Some(arn.clone()),
        None => {
            let dlq = LambdaFunctionService::new(&b.sdk, Some(options.clone()));
            let name = dead_letter::function_name(&plan.query_code);
            dlq.create(FunctionSpec {
                name: name.clone(),
                environment: BTreeMap::new(),
                concurrency: skein_engine::planner::STATELESS_CONCURRENCY,
            })
            .await?;
            Some(dlq.function_arn(&name).await?)
        }
    };
    Ok(options)
}

/// Deploy every stage function with `env` added to its environment and a
/// new run id, so every function starts from a fresh instance.
pub(crate) async fn deploy_stages(
    b: &Connection,
    service_options: &ServiceOptions,
    plan: &QueryPlan,
    options: &PlanOptions,
    epochs: Option<u64>,
    env: &BTreeMap<String, String>,
) -> Result<Vec<Deployed>> {
    let mut service_options = service_options.clone();
    service_options.extra_env.extend(env.clone());
    service_options
        .extra_env
        .insert(RUN_ENV.to_string(), run_id());
    let extra_env = service_options.extra_env.clone();
    let service = LambdaFunctionService::new(&b.sdk, Some(service_options));
    Ok(deploy_functions(plan, &service, &b.store, options, epochs, &extra_env).await?)
}

/// Deploy the query's dead-letter function (unless --on-failure names
/// another destination), then every stage function.
pub(crate) async fn deploy_plan(
    b: &Connection,
    args: &LambdaArgs,
    plan: &QueryPlan,
    p: &PlanArgs,
    epochs: Option<u64>,
) -> Result<Vec<Deployed>> {
    let service = service_options(b, args, plan).await?;
    deploy_stages(b, &service, plan, &p.options(), epochs, &BTreeMap::new()).await
}

/// `skein deploy FILE.sql --backend lambda`.
pub async fn deploy(args: DeployArgs) -> Result<()> {
    if args.lambda.backend != Backend::Lambda {
        bail!(
            "skein deploy needs --backend lambda (the local backend deploys as part of skein run)"
        );
    }
    let sql = read_sql(&args.file)?;
    let b = connect(&args.lambda.store).await?;
    let (plan, _) = plan(&sql, &args.plan, &b.store_url).await?;
    let start = Instant::now();
    let pushed = pushed_sources(&plan)?;
    let service = service_options(&b, &args.lambda, &plan).await?;
    // A query that checkpoints (and is not pushed) runs on its own: a
    // driver function on a schedule.
    let standing = if pushed.is_empty() {
        crate::lambda_standing::deploy(
            &b,
            &service,
            &plan,
            &args.plan.options(),
            &sql,
            &args.standing,
        )
        .await?
    } else {
        None
    };
    let (deployed, standing) = match standing {
        Some(s) => (s.functions, Some(s.summary)),
        None if pushes_into_stages(&plan) => {
            if args.plan.invoke_async {
                bail!(
                    "a pushed table that feeds windows or aggregates needs synchronous hops: drop --invoke-async"
                );
            }
            // Every pushed batch is an epoch of the query's offsets log, and
            // every member keeps its state at every epoch.
            let url = skein_lambda::checkpoints::default_url(&b.store_url, &plan.query_code);
            let store = skein_lambda::checkpoints::open(&url, &plan.query_code).await?;
            let mut options = args.plan.options();
            options.run = store.manifest().run.clone();
            options.checkpoint = Some(skein_engine::context::CheckpointSpec { interval: 1 });
            let env =
                BTreeMap::from([(skein_lambda::checkpoints::CHECKPOINTS_ENV.to_string(), url)]);
            (
                deploy_stages(&b, &service, &plan, &options, None, &env).await?,
                None,
            )
        }
        None => (
            deploy_stages(
                &b,
                &service,
                &plan,
                &args.plan.options(),
                None,
                &BTreeMap::new(),
            )
            .await?,
            None,
        ),
    };
    let mut mappings = vec![];
    if !pushed.is_empty() {
        let lambda = aws_sdk_lambda::Client::new(&b.sdk);
        let kinesis = aws_sdk_kinesis::Client::new(&b.sdk);
        let settings = esm::MappingSettings::for_store(&b.store_url);
        for (stream, function) in pushed {
            let arn = esm::stream_arn(&kinesis, &stream).await?;
            let uuid = esm::map_stream(&lambda, &arn, &function, &settings).await?;
            mappings.push(json!({"stream": stream, "function": function, "uuid": uuid}));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if args.json {
        let functions: Vec<_> = deployed
            .iter()
            .map(|d| json!({"name": d.name, "concurrency": d.concurrency, "spilled": d.spilled}))
            .collect();
        println!(
            "{}",
            json!({"query_code": plan.query_code, "functions": functions,
                   "event_source_mappings": mappings, "standing": standing, "deploy_s": secs})
        );
    } else {
        for m in &mappings {
            println!(
                "{} -> {} (event-source mapping {})",
                m["stream"], m["function"], m["uuid"]
            );
        }
        for d in &deployed {
            println!(
                "{}  concurrency {}{}",
                d.name,
                if d.concurrency >= skein_engine::planner::STATELESS_CONCURRENCY {
                    "unreserved".to_string()
                } else {
                    d.concurrency.to_string()
                },
                if d.spilled {
                    "  (context in the object store)"
                } else {
                    ""
                }
            );
        }
        if let Some(s) = &standing {
            println!(
                "{} invoked by schedule {} ({}), checkpoints in {}",
                s["driver"].as_str().unwrap_or_default(),
                s["schedule"].as_str().unwrap_or_default(),
                s["rate"].as_str().unwrap_or_default(),
                s["checkpoint_dir"].as_str().unwrap_or_default()
            );
        }
        println!(
            "query {}: {} functions deployed in {secs:.2} s{}",
            plan.query_code,
            deployed.len(),
            if standing.is_some() {
                "; it runs on its own (skein status, skein stop, skein destroy)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// `skein destroy FILE.sql|QUERY_CODE [--purge]`.
pub async fn destroy(args: DestroyArgs) -> Result<()> {
    let code = query_code_arg(&args.query)?;
    let sdk = skein_lambda::sdk_config().await;
    let removed = crate::lambda_standing::destroy(&sdk, &args.store, &code, args.purge).await?;
    let service = LambdaFunctionService::new(&sdk, None);
    // Event-source mappings first: they would keep invoking deleted functions.
    let lambda = aws_sdk_lambda::Client::new(&sdk);
    let mut unmapped = 0;
    for name in service.list(&format!("{code}-")).await? {
        unmapped += esm::unmap_function(&lambda, &name).await?;
    }
    let n = destroy_functions(&code, &service).await?;
    println!(
        "query {code}: {n} functions, {unmapped} event-source mappings and {} schedule deleted{}",
        usize::from(removed.schedule),
        removed
            .purged_objects
            .map(|n| format!("; checkpoint store purged ({n} objects)"))
            .unwrap_or_default()
    );
    Ok(())
}

/// `skein status`: deployed queries and their functions.
pub async fn status(as_json: bool) -> Result<()> {
    let sdk = skein_lambda::sdk_config().await;
    let service = LambdaFunctionService::new(&sdk, None);
    let mut queries: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for name in service.list("").await? {
        if let Some(code) = skein_lambda::service::query_code_of(&name) {
            queries.entry(code.to_string()).or_default().insert(name);
        }
    }
    // Dead letters of each query, when the store is there to ask.
    let mut dead: BTreeMap<String, usize> = BTreeMap::new();
    let store_url = std::env::var("SKEIN_STORE").unwrap_or_else(|_| "s3://skein".into());
    if let Ok(store) = skein_lambda::store::open(&store_url) {
        for code in queries.keys() {
            let n = dead_letter::list(&store, code)
                .await
                .map(|v| v.len())
                .unwrap_or(0);
            if n > 0 {
                dead.insert(code.clone(), n);
            }
        }
    }
    if as_json {
        println!("{}", json!({"queries": queries, "dead_letters": dead}));
    } else if queries.is_empty() {
        println!("no queries deployed");
    } else {
        for (code, names) in &queries {
            let dl = dead
                .get(code)
                .map(|n| format!(", {n} dead letters"))
                .unwrap_or_default();
            println!("{code}: {} functions{dl}", names.len());
            for n in names {
                println!("  {n}");
            }
        }
    }
    Ok(())
}

pub(crate) async fn object_keys(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
) -> Result<Vec<StorePath>> {
    use futures::TryStreamExt;
    Ok(store
        .list(Some(&StorePath::from(prefix)))
        .map_ok(|m| m.location)
        .try_collect()
        .await?)
}
