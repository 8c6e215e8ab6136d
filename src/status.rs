//! `skein status [QUERY] [--json]`: without a query, the queries deployed
//! on Lambda (`lambda::deploy::status`); with one, its progress from its
//! checkpoint store and its sources (`skein_engine::status`), locally (a
//! SQL file and its checkpoint directory) or on Lambda (a query code or
//! file, its standing spec in the store, the schedule and the lease).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use skein_engine::catalog::Catalog;
use skein_engine::catalog::parallelism::SourceBudget;
use skein_engine::checkpoint::CheckpointStore;
use skein_engine::planner::{QueryPlan, plan_query, session};
use skein_engine::status::{QueryStatus, query_status};
use skein_lambda::schedule::{Schedules, schedule_name};
use skein_lambda::standing;

use crate::PlanArgs;
use crate::args::read_sql;
use crate::lambda::{Backend, query_code_arg};
use crate::registry::registries;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// A SQL file (local, or Lambda) or a query code (Lambda); without it,
    /// the queries deployed on Lambda.
    pub query: Option<String>,
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,
    /// The local checkpoint directory (default .skein/checkpoints/<query-code>).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// The deployment's store, where a Lambda query's spec is.
    #[arg(long, env = "SKEIN_STORE", default_value = "s3://skein")]
    pub store: String,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[arg(long)]
    pub json: bool,
}

pub async fn status(args: StatusArgs) -> Result<()> {
    let Some(query) = &args.query else {
        return crate::lambda::deploy::status(args.json).await;
    };
    let (status, platform) = match args.backend {
        Backend::Local => local(query, &args).await?,
        Backend::Lambda => lambda(query, &args).await?,
    };
    if args.json {
        let mut out = serde_json::to_value(&status)?;
        if let (Value::Object(o), Value::Object(p)) = (&mut out, platform) {
            o.extend(p);
        }
        println!("{out}");
    } else {
        render(&status, &platform);
    }
    Ok(())
}

async fn plan_sql(sql: &str, plan: &PlanArgs, catalog: &Catalog) -> Result<QueryPlan> {
    let ctx = session(catalog, plan.group_size());
    plan_query(&ctx, sql, &plan.options())
        .await
        .context("planning the query")
}

async fn local(query: &str, args: &StatusArgs) -> Result<(QueryStatus, Value)> {
    let (plan, store, name) = local_store(query, args.checkpoint_dir.as_ref(), &args.plan).await?;
    let mut status = query_status(&plan, &store, &registries().catalog).await?;
    status.resized = skein_engine::status::resized(&store).await?;
    Ok((status, json!({ "name": name })))
}

/// A local query's plan, its checkpoint store (which must exist) and its
/// name, from its SQL file.
pub(crate) async fn local_store(
    query: &str,
    checkpoint_dir: Option<&PathBuf>,
    plan_args: &PlanArgs,
) -> Result<(QueryPlan, CheckpointStore, Option<String>)> {
    if !Path::new(query).is_file() {
        bail!("{query}: no such SQL file (a query code needs --backend lambda)");
    }
    let sql = read_sql(Path::new(query))?;
    let mut catalog = registries().catalog;
    let request = crate::run::checkpoint_dir::Request {
        dir: checkpoint_dir.cloned(),
        off: false,
    };
    crate::run::checkpoint_dir::pin_sources(&mut catalog, &sql, &request)?;
    let plan = plan_sql(&sql, plan_args, &catalog).await?;
    let dir = checkpoint_dir
        .cloned()
        .unwrap_or_else(|| crate::run::checkpoint_dir::root().join(&plan.query_code));
    if !dir.join("manifest.json").is_file() {
        let root = crate::run::checkpoint_dir::root();
        if let Some(q) = skein_engine::running::list(&root)
            .into_iter()
            .find(|q| q.query_code == plan.query_code)
        {
            bail!(
                "query {}{} runs in process {} without a checkpoint store: it records no \
                 progress to report (skein ui lists it)",
                q.query_code,
                q.name.map(|n| format!(" ({n})")).unwrap_or_default(),
                q.pid
            );
        }
        bail!(
            "{}: not a checkpoint directory of this query (run it first, or pass --checkpoint-dir)",
            dir.display()
        );
    }
    let described = std::fs::read(dir.join("manifest.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<skein_engine::checkpoint::Manifest>(&b).ok())
        .and_then(|m| m.described);
    // Without --group-size, the size the query was first run with: its
    // groups and key groups as they are.
    let plan = match described.as_ref().map(|d| d.group_size) {
        Some(size) if plan_args.group_size.is_none() && size != plan_args.group_size() => {
            let mut first = plan_args.clone();
            first.group_size = Some(size);
            plan_sql(&sql, &first, &catalog).await?
        }
        _ => plan,
    };
    let name = described.and_then(|d| d.name);
    let store = CheckpointStore::attach_dir(dir, &plan.query_code, "");
    Ok((plan, store, name))
}

async fn lambda(query: &str, args: &StatusArgs) -> Result<(QueryStatus, Value)> {
    let (plan, store, spec) = lambda_store(query, &args.store).await?;
    let mut status = query_status(&plan, &store, &registries().catalog).await?;
    status.resized = skein_engine::status::resized(&store).await?;
    let sdk = skein_lambda::sdk_config().await;
    let schedule = Schedules::new(&sdk).state(&schedule_name(&plan.query_code)).await?;
    let (lease_store, lease_key) = standing::lease_location(&spec.checkpoints)?;
    let lease = skein_lambda::lease::read(&lease_store, &lease_key)
        .await?
        .map(|(record, _)| {
            let now = skein_lambda::lease::now_ms();
            json!({"holder": record.holder, "held": !record.free_at(now),
                   "expires_ms": record.expires_ms})
        });
    Ok((status, json!({"schedule": schedule, "lease": lease})))
}

/// A standing query on Lambda (a SQL file or a query code): its plan as
/// deployed, its checkpoint store and its spec.
pub(crate) async fn lambda_store(
    query: &str,
    store_url: &str,
) -> Result<(QueryPlan, CheckpointStore, standing::StandingSpec)> {
    let code = query_code_arg(query)?;
    let deployment = skein_lambda::store::open(store_url)?;
    let spec = standing::get_spec(&deployment, &code)
        .await?
        .with_context(|| {
            format!(
                "query {code} is not deployed as a standing query in {store_url} (skein deploy \
                 FILE.sql --backend lambda)"
            )
        })?;
    let plan_args = PlanArgs {
        group_size: Some(spec.group_size),
        encoding: spec.encoding,
        invoke_async: false,
        state_ttl: None,
        state_memory: None,
    };
    let mut catalog = registries().catalog;
    catalog.set_source_budget(SourceBudget::Members(spec.group_size));
    let mut plan = plan_sql(&spec.sql, &plan_args, &catalog).await?;
    standing::route_collect(&mut plan, &spec.store);
    let (cp_store, root) = skein_lambda::checkpoints::locate(&spec.checkpoints)?;
    let store = CheckpointStore::attach(cp_store, root, &code, "");
    Ok((plan, store, spec))
}

fn render(s: &QueryStatus, platform: &Value) {
    match platform["name"].as_str() {
        Some(name) => println!("query {} ({name})", s.query_code),
        None => println!("query {}", s.query_code),
    }
    for p in &s.partitions {
        let show = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
        let behind = p
            .behind_ms
            .map_or(String::new(), |ms| format!("  behind {ms} ms"));
        println!(
            "  {} [{}]  committed {}  latest {}  lag {}{behind}",
            p.source,
            p.partition,
            show(p.committed),
            show(p.latest),
            show(p.lag)
        );
    }
    println!("  lag {}", s.lag);
    match (s.watermark_ms, s.watermark_delay_ms) {
        (Some(w), Some(d)) => println!("  watermark {w} ms, {:.1} s behind now", d as f64 / 1e3),
        _ => println!("  watermark: none yet"),
    }
    let at = |ms: Option<i64>| ms.map_or(String::new(), |ms| format!(" (at {ms} ms)"));
    println!(
        "  last epoch run {}{}; last committed {}{}",
        s.store.last_epoch.map_or("-".into(), |e| e.to_string()),
        at(s.store.last_epoch_ms),
        s.store
            .committed
            .map_or("-".into(), |c| c.epoch.to_string()),
        at(s.store.committed_ms)
    );
    println!("  state {} bytes", s.store.state_bytes);
    let sizes = |groups: &skein_engine::checkpoint::Layout| {
        groups
            .iter()
            .map(|(stage, members)| format!("stage {stage}: {members}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !s.groups.is_empty() {
        println!("  group members {}", sizes(&s.groups));
    }
    for r in &s.resized {
        println!("  resized from epoch {}: {}", r.from_epoch, sizes(&r.groups));
    }
    if let Some(r) = &s.rescale_asked {
        println!(
            "  rescale asked: stage {} to {} members (after the next commit)",
            r.stage, r.members
        );
    }
    println!(
        "  since start: {} dead letters, {} late rows, {} sink errors",
        s.since_start.dead_letters, s.since_start.late_rows, s.since_start.sink_errors
    );
    for p in &s.problems {
        println!("  problem: {p}");
    }
    for sink in &s.sinks {
        let ago = |ms: i64| {
            let s = (skein_lambda::lease::now_ms() as i64 - ms).max(0) / 1000;
            format!("{s} s ago")
        };
        if sink.failing() {
            println!(
                "  sink {} FAILING: {} failures in a row{}; last error: {}",
                sink.sink,
                sink.consecutive_failures,
                sink.failing_since_ms
                    .map_or(String::new(), |ms| format!(" since {}", ago(ms))),
                sink.last_error.as_deref().unwrap_or("-")
            );
        } else if let Some(ms) = sink.last_success_ms {
            println!("  sink {} writing again since {}", sink.sink, ago(ms));
        }
    }
    if let Some(state) = platform.get("schedule").and_then(Value::as_str) {
        println!("  schedule {state}");
    }
    if let Some(lease) = platform.get("lease").filter(|l| !l.is_null()) {
        println!(
            "  lease {} by {}",
            if lease["held"] == true {
                "held"
            } else {
                "free"
            },
            lease["holder"].as_str().unwrap_or_default()
        );
    }
}
