//! `skein deploy`, `skein destroy`, `skein stop` / `skein start`, `skein
//! status` without a query (the deployed queries) and `skein package`:
//! putting a query's functions on Lambda, pausing, resuming and removing
//! them, and zipping the function binary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use serde_json::json;
use skein_engine::invoke::FunctionService;
use skein_lambda::deploy::{DeployedQuery, StandingOptions};
use skein_lambda::package::{bootstrap_zip, carries_sql_front_end, function_binary, stripped};
use skein_lambda::{LambdaFunctionService, dead_letter};

use super::{Arch, Backend, LambdaArgs, query_code_arg};
use crate::PlanArgs;
use crate::args::{parse_duration, read_sql};

#[derive(Args, Debug)]
pub struct DeployArgs {
    pub file: PathBuf,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub lambda: LambdaArgs,
    #[command(flatten)]
    pub standing: StandingArgs,
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

/// How a deployed query runs on its own.
#[derive(Args, Clone, Debug)]
pub struct StandingArgs {
    /// Time between epochs of the standing query [default: the shortest
    /// 'epoch.interval' option of its source tables, else 1s].
    #[arg(long, value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Epochs between commits [default: 10 s of epochs].
    #[arg(long, value_parser = crate::positive)]
    pub checkpoint_interval: Option<usize>,
    /// Checkpoint location (default <store>/skein/checkpoints/<query-code>).
    #[arg(long, value_name = "s3://bucket/prefix")]
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// Role EventBridge Scheduler assumes to invoke the driver function.
    #[arg(
        long,
        env = "SKEIN_SCHEDULER_ROLE",
        default_value = "arn:aws:iam::000000000000:role/skein-scheduler"
    )]
    pub scheduler_role: String,
    /// Resize each function group within MIN..MAX members by how busy its
    /// members were (the driver decides at every commit); a group's
    /// functions are deployed at its --group-size, the most it can have.
    #[arg(long, value_name = "MIN..MAX")]
    pub autoscale: Option<skein_engine::autoscale::AutoscaleRange>,
}

impl StandingArgs {
    fn options(&self) -> StandingOptions {
        StandingOptions {
            interval: self.interval,
            checkpoint_interval: self.checkpoint_interval.map(|n| n as u64),
            checkpoint_dir: self.checkpoint_dir.clone(),
            scheduler_role: self.scheduler_role.clone(),
            autoscale: self.autoscale,
        }
    }
}

#[derive(Args, Debug)]
pub struct QueryArgs {
    /// A SQL file or a query code (as `skein status` lists them).
    pub query: String,
    #[arg(long)]
    pub json: bool,
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
    let binary = function_binary(args.function_binary.as_deref())?;
    let bootstrap = stripped(&binary)?;
    let sql_front_end = carries_sql_front_end(&bootstrap);
    if sql_front_end {
        eprintln!(
            "note: {} links DataFusion's SQL front end, which a function never runs; for a \
             smaller package build it on its own: cargo build --release --bin skein-function \
             --no-default-features --features jemalloc",
            binary.display()
        );
    }
    let zip = bootstrap_zip(&bootstrap, true)?;
    let out = args
        .out
        .unwrap_or_else(|| binary.with_file_name("bootstrap.zip"));
    std::fs::write(&out, &zip).map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))?;
    if args.json {
        println!(
            "{}",
            json!({"path": out.display().to_string(), "bytes": zip.len(),
                   "unzipped_bytes": bootstrap.len(), "sql_front_end": sql_front_end,
                   "arch": args.arch.name()})
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

/// `skein deploy FILE.sql --backend lambda`.
pub async fn deploy(args: DeployArgs) -> Result<()> {
    if args.lambda.backend != Backend::Lambda {
        bail!(
            "skein deploy needs --backend lambda (the local backend deploys as part of skein run)"
        );
    }
    let sql = read_sql(&args.file)?;
    let deployment = args.lambda.connect().await?;
    let deployed = skein_lambda::deploy::deploy(
        &deployment,
        &sql,
        &args.plan.options(),
        &args.standing.options(),
    )
    .await?;
    print_deployed(&deployed, args.json);
    Ok(())
}

fn print_deployed(d: &DeployedQuery, as_json: bool) {
    if as_json {
        let functions: Vec<_> = d
            .functions
            .iter()
            .map(|f| json!({"name": f.name, "concurrency": f.concurrency, "spilled": f.spilled}))
            .collect();
        println!(
            "{}",
            json!({"query_code": d.query_code, "functions": functions,
                   "event_source_mappings": d.mappings, "standing": d.standing, "deploy_s": d.deploy_s})
        );
        return;
    }
    for m in &d.mappings {
        println!(
            "{} -> {} (event-source mapping {})",
            m.stream, m.function, m.uuid
        );
    }
    for f in &d.functions {
        println!(
            "{}  concurrency {}{}",
            f.name,
            if f.concurrency >= skein_engine::planner::STATELESS_CONCURRENCY {
                "unreserved".to_string()
            } else {
                f.concurrency.to_string()
            },
            if f.spilled {
                "  (context in the object store)"
            } else {
                ""
            }
        );
    }
    if let Some(s) = &d.standing {
        println!(
            "{} invoked by schedule {} ({}), checkpoints in {}",
            s.driver, s.schedule, s.rate, s.checkpoint_dir
        );
    }
    println!(
        "query {}: {} functions deployed in {:.2} s{}",
        d.query_code,
        d.functions.len(),
        d.deploy_s,
        if d.standing.is_some() {
            "; it runs on its own (skein status, skein stop, skein destroy)"
        } else {
            ""
        }
    );
}

/// `skein destroy FILE.sql|QUERY_CODE [--purge]`.
pub async fn destroy(args: DestroyArgs) -> Result<()> {
    let code = query_code_arg(&args.query)?;
    let sdk = skein_lambda::sdk_config().await;
    let removed = skein_lambda::deploy::destroy(&sdk, &args.store, &code, args.purge).await?;
    println!(
        "query {code}: {} functions, {} event-source mappings and {} schedule deleted{}",
        removed.functions,
        removed.mappings,
        usize::from(removed.schedule),
        removed
            .purged_objects
            .map(|n| format!("; checkpoint store purged ({n} objects)"))
            .unwrap_or_default()
    );
    Ok(())
}

/// `skein stop QUERY` (`enabled` false) and `skein start QUERY`.
pub async fn set_running(args: QueryArgs, enabled: bool) -> Result<()> {
    let code = query_code_arg(&args.query)?;
    let sdk = skein_lambda::sdk_config().await;
    let schedule = skein_lambda::deploy::set_running(&sdk, &code, enabled).await?;
    let state = if enabled { "ENABLED" } else { "DISABLED" };
    if args.json {
        println!(
            "{}",
            json!({"query_code": code, "schedule": schedule, "state": state})
        );
    } else if enabled {
        println!("query {code}: started (schedule {schedule} enabled; the next tick resumes it)");
    } else {
        println!(
            "query {code}: stopped (schedule {schedule} disabled; a tick in flight finishes and \
             commits; state kept)"
        );
    }
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
    // Dead letters and names of each query, when the store is there to ask.
    let mut dead: BTreeMap<String, usize> = BTreeMap::new();
    let mut named: BTreeMap<String, String> = BTreeMap::new();
    let store_url = std::env::var("SKEIN_STORE").unwrap_or_else(|_| "s3://skein".into());
    if let Ok(store) = skein_lambda::store::open(&store_url) {
        for code in queries.keys() {
            let spec = skein_lambda::standing::get_spec(&store, code).await;
            if let Some(name) = spec
                .ok()
                .flatten()
                .and_then(|s| skein_engine::query::declared_name(&s.sql))
            {
                named.insert(code.clone(), name);
            }
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
        println!(
            "{}",
            json!({"queries": queries, "names": named, "dead_letters": dead})
        );
    } else if queries.is_empty() {
        println!("no queries deployed");
    } else {
        for (code, names) in &queries {
            let dl = dead
                .get(code)
                .map(|n| format!(", {n} dead letters"))
                .unwrap_or_default();
            let name = named
                .get(code)
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            println!("{code}{name}: {} functions{dl}", names.len());
            for n in names {
                println!("  {n}");
            }
        }
    }
    Ok(())
}
