//! A standing query on Lambda from the command line: what `skein deploy`
//! adds for a query that checkpoints (its spec, the driver function, the
//! schedule), `skein stop` / `skein start` (the schedule disabled or
//! enabled, state kept) and what `skein destroy` removes besides the
//! functions. The driver itself is `skein_lambda::standing`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::{Value, json};
use skein_engine::context::CheckpointSpec;
use skein_engine::invoke::{FunctionService, FunctionSpec};
use skein_engine::planner::{PlanOptions, QueryPlan};
use skein_lambda::checkpoints::{self, CHECKPOINTS_ENV};
use skein_lambda::deploy::Deployed;
use skein_lambda::schedule::{Schedules, schedule_name};
use skein_lambda::standing::{self, DRIVER_ENV, StandingSpec};
use skein_lambda::{LambdaFunctionService, ServiceOptions};

use crate::checkpoint_dir;
use crate::lambda_cmd::{Connection, deploy_stages};
use crate::lambda_run::open_checkpoints;
use crate::run::parse_duration;

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
}

/// What `skein deploy` did for a standing query.
pub struct Standing {
    pub functions: Vec<Deployed>,
    /// The driver, its schedule and the checkpoint location, as JSON.
    pub summary: Value,
}

/// Deploy `plan` as a standing query: the stage functions attached to its
/// checkpoint location, a driver function and the schedule that invokes
/// it. `None` (nothing deployed) when the query does not checkpoint.
pub async fn deploy(
    b: &Connection,
    service: &ServiceOptions,
    plan: &QueryPlan,
    options: &PlanOptions,
    sql: &str,
    args: &StandingArgs,
) -> Result<Option<Standing>> {
    let request = checkpoint_dir::Request {
        dir: args.checkpoint_dir.clone(),
        off: false,
    };
    let Some(cp) = open_checkpoints(b, plan, &request, options.invoke_async).await? else {
        return Ok(None);
    };
    let interval = skein_engine::interval::effective_interval(args.interval, plan)?;
    let checkpoint_interval = match args.checkpoint_interval {
        Some(n) => n as u64,
        None => skein_engine::epochs::default_checkpoint_interval(true, interval),
    };
    let mut options = options.clone();
    options.run = cp.store.manifest().run.clone();
    options.checkpoint = Some(CheckpointSpec {
        interval: checkpoint_interval,
    });
    let env = BTreeMap::from([(CHECKPOINTS_ENV.to_string(), cp.url.clone())]);
    let functions = deploy_stages(b, service, plan, &options, None, &env).await?;

    let spec = StandingSpec {
        query_code: plan.query_code.clone(),
        sql: sql.to_string(),
        group_size: options.group_size,
        encoding: options.encoding,
        interval_ms: interval.as_millis() as u64,
        checkpoint_interval,
        checkpoints: cp.url.clone(),
        store: b.store_url.clone(),
        run_for_ms: StandingSpec::run_for(service.timeout_s).as_millis() as u64,
    };
    standing::put_spec(&b.store, &spec).await?;

    let mut driver_options = service.clone();
    driver_options.extra_env.extend(env);
    let driver = LambdaFunctionService::new(&b.sdk, Some(driver_options));
    let driver_name = standing::driver_name(&plan.query_code);
    driver
        .create(FunctionSpec {
            name: driver_name.clone(),
            environment: BTreeMap::from([(DRIVER_ENV.to_string(), plan.query_code.clone())]),
            // One tick at a time per instance; the lease keeps it one overall.
            concurrency: 1,
        })
        .await?;
    let arn = driver.function_arn(&driver_name).await?;
    let schedule = schedule_name(&plan.query_code);
    Schedules::new(&b.sdk)
        .put(
            &schedule,
            &arn,
            &args.scheduler_role,
            &standing::drive_input(&plan.query_code),
        )
        .await?;
    Ok(Some(Standing {
        functions,
        summary: json!({
            "driver": driver_name,
            "schedule": schedule,
            "rate": skein_lambda::schedule::RATE,
            "checkpoint_dir": cp.url,
            "tick_s": spec.run_for_ms as f64 / 1000.0,
        }),
    }))
}

#[derive(Args, Debug)]
pub struct QueryArgs {
    /// A SQL file or a query code (as `skein status` lists them).
    pub query: String,
    #[arg(long)]
    pub json: bool,
}

/// `skein stop QUERY` (`enabled` false) and `skein start QUERY`.
pub async fn set_running(args: QueryArgs, enabled: bool) -> Result<()> {
    let code = crate::lambda_cmd::query_code_arg(&args.query)?;
    let sdk = skein_lambda::sdk_config().await;
    let schedule = schedule_name(&code);
    if !Schedules::new(&sdk).set_enabled(&schedule, enabled).await? {
        bail!(
            "query {code} has no schedule ({schedule}): deploy it with `skein deploy FILE.sql \
             --backend lambda` (a query that checkpoints gets one)"
        );
    }
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

/// What `skein destroy` removes besides functions and mappings: the
/// schedule and, with `purge`, the checkpoint store and the spec.
pub struct Removed {
    pub schedule: bool,
    pub purged_objects: Option<usize>,
}

pub async fn destroy(
    sdk: &aws_config::SdkConfig,
    store_url: &str,
    code: &str,
    purge: bool,
) -> Result<Removed> {
    // The schedule first: it would invoke a deleted driver.
    let schedule = Schedules::new(sdk).delete(&schedule_name(code)).await?;
    if !purge {
        return Ok(Removed {
            schedule,
            purged_objects: None,
        });
    }
    let store = skein_lambda::store::open(store_url)?;
    let url = match standing::get_spec(&store, code).await? {
        Some(spec) => spec.checkpoints,
        None => checkpoints::default_url(store_url, code),
    };
    let (cp_store, root) = checkpoints::locate(&url)?;
    let mut n = delete_under(&cp_store, &root).await?;
    standing::delete_spec(&store, code).await?;
    n += delete_under(
        &store,
        &object_store::path::Path::from(format!("{}/{code}", skein_lambda::dead_letter::PREFIX)),
    )
    .await?;
    Ok(Removed {
        schedule,
        purged_objects: Some(n),
    })
}

/// Delete every object under `root`; how many there were.
pub(crate) async fn delete_under(
    store: &std::sync::Arc<dyn ObjectStore>,
    root: &object_store::path::Path,
) -> Result<usize> {
    let keys: Vec<_> = store
        .list(Some(root))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .with_context(|| format!("listing {root}"))?;
    for key in &keys {
        store
            .delete(key)
            .await
            .with_context(|| format!("deleting {key}"))?;
    }
    Ok(keys.len())
}
