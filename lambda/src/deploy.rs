//! Deploying a query to stay (`skein deploy`), pausing and resuming it
//! (`skein stop`, `skein start`) and removing it (`skein destroy`).
//!
//! A query that checkpoints runs on its own: its stage functions attached
//! to its checkpoint location, its spec in the store, a driver function
//! and the schedule that invokes it ([`crate::standing`]). A query reading
//! a pushed (`'mode' 'push'`) Kinesis table is run by the event-source
//! mapping that feeds its source function. Any other query is deployed and
//! waits to be triggered.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use serde::Serialize;
use skein_engine::context::CheckpointSpec;
use skein_engine::driver::Deployed;
use skein_engine::invoke::{FunctionService, FunctionSpec};
use skein_engine::planner::{PlanOptions, QueryPlan};
use skein_engine::query::CheckpointRequest;

use crate::checkpoints::{self, CHECKPOINTS_ENV};
use crate::deployment::{Deployment, pushed_sources, pushes_into_stages};
use crate::error::{LambdaError, Result};
use crate::schedule::{RATE, Schedules, schedule_name};
use crate::standing::{self, DRIVER_ENV, StandingSpec};
use crate::{LambdaFunctionService, ServiceOptions, esm};

/// How a deployed query runs on its own.
#[derive(Debug, Clone)]
pub struct StandingOptions {
    /// Time between epochs (default: the source tables' `'epoch.interval'`, else 1 s).
    pub interval: Option<Duration>,
    /// Epochs between commits (default: 10 s of epochs).
    pub checkpoint_interval: Option<u64>,
    /// Checkpoint location (default `<store>/skein/checkpoints/<query-code>`).
    pub checkpoint_dir: Option<PathBuf>,
    /// The role EventBridge Scheduler assumes to invoke the driver.
    pub scheduler_role: String,
    /// `--autoscale`: the sizes the driver keeps each group within.
    pub autoscale: Option<skein_engine::autoscale::AutoscaleRange>,
}

/// A standing query's driver, schedule and checkpoint location.
#[derive(Debug, Clone, Serialize)]
pub struct Standing {
    /// The driver function.
    pub driver: String,
    /// Its schedule.
    pub schedule: String,
    /// The schedule's rate.
    pub rate: &'static str,
    /// Where the query checkpoints.
    pub checkpoint_dir: String,
    /// How long a tick runs epochs, s.
    pub tick_s: f64,
}

/// A Kinesis stream mapped to a query's source function.
#[derive(Debug, Clone, Serialize)]
pub struct Mapping {
    /// The stream.
    pub stream: String,
    /// The function it pushes to.
    pub function: String,
    /// The mapping's id.
    pub uuid: String,
}

/// What `skein deploy` did.
#[derive(Debug)]
pub struct DeployedQuery {
    /// The query code.
    pub query_code: String,
    /// The stage functions.
    pub functions: Vec<Deployed>,
    /// The event-source mappings of pushed tables.
    pub mappings: Vec<Mapping>,
    /// The driver and schedule of a standing query.
    pub standing: Option<Standing>,
    /// How long it took, s.
    pub deploy_s: f64,
}

/// Deploy `sql` to stay: standing (a driver on a schedule) when it
/// checkpoints, mapped to its streams when it reads a pushed table, else
/// its functions alone.
pub async fn deploy(
    deployment: &Deployment,
    sql: &str,
    options: &PlanOptions,
    standing: &StandingOptions,
) -> Result<DeployedQuery> {
    let (plan, _) = deployment.plan(sql, options).await?;
    let start = Instant::now();
    let pushed = pushed_sources(&plan)?;
    let service = deployment.service_options(&plan).await?;
    // A query that checkpoints (and is not pushed) runs on its own: a
    // driver function on a schedule.
    let deployed_standing = if pushed.is_empty() {
        deploy_standing(deployment, &service, &plan, options, sql, standing).await?
    } else {
        None
    };
    let (functions, standing) = match deployed_standing {
        Some((functions, s)) => (functions, Some(s)),
        None if pushes_into_stages(&plan) => {
            if options.invoke_async {
                return Err(LambdaError::refused(
                    "a pushed table that feeds windows or aggregates needs synchronous hops: \
                     drop --invoke-async",
                ));
            }
            // Every pushed batch is an epoch of the query's offsets log, and
            // every member keeps its state at every epoch.
            let url = checkpoints::default_url(&deployment.store_url, &plan.query_code);
            let store = checkpoints::open(&url, &plan.query_code).await?;
            let mut options = options.clone();
            options.run = store.manifest().run.clone();
            options.checkpoint = Some(CheckpointSpec { interval: 1 });
            let env = BTreeMap::from([(CHECKPOINTS_ENV.to_string(), url)]);
            let functions = deployment
                .deploy_stages(&service, &plan, &options, None, &env)
                .await?;
            (functions, None)
        }
        None => {
            let functions = deployment
                .deploy_stages(&service, &plan, options, None, &BTreeMap::new())
                .await?;
            (functions, None)
        }
    };
    let mut mappings = vec![];
    if !pushed.is_empty() {
        let lambda = aws_sdk_lambda::Client::new(&deployment.sdk);
        let kinesis = aws_sdk_kinesis::Client::new(&deployment.sdk);
        let settings = esm::MappingSettings::for_store(&deployment.store_url);
        for (stream, function) in pushed {
            let arn = esm::stream_arn(&kinesis, &stream).await?;
            let uuid = esm::map_stream(&lambda, &arn, &function, &settings).await?;
            mappings.push(Mapping {
                stream,
                function,
                uuid,
            });
        }
    }
    Ok(DeployedQuery {
        query_code: plan.query_code,
        functions,
        mappings,
        standing,
        deploy_s: start.elapsed().as_secs_f64(),
    })
}

/// Deploy `plan` as a standing query: the stage functions attached to its
/// checkpoint location, a driver function and the schedule that invokes
/// it. `None` (nothing deployed) when the query does not checkpoint.
pub async fn deploy_standing(
    deployment: &Deployment,
    service: &ServiceOptions,
    plan: &QueryPlan,
    options: &PlanOptions,
    sql: &str,
    standing: &StandingOptions,
) -> Result<Option<(Vec<Deployed>, Standing)>> {
    let request = CheckpointRequest {
        dir: standing.checkpoint_dir.clone(),
        off: false,
    };
    let Some(cp) = deployment
        .open_checkpoints(plan, &request, options.invoke_async)
        .await?
    else {
        return Ok(None);
    };
    let interval =
        skein_engine::interval::effective_interval(standing.interval, plan.source_tables())?;
    let checkpoint_interval = standing
        .checkpoint_interval
        .unwrap_or_else(|| skein_engine::epochs::default_checkpoint_interval(true, interval));
    let mut options = options.clone();
    options.run = cp.store.manifest().run.clone();
    options.checkpoint = Some(CheckpointSpec {
        interval: checkpoint_interval,
    });
    let env = BTreeMap::from([(CHECKPOINTS_ENV.to_string(), cp.url.clone())]);
    let functions = deployment
        .deploy_stages(service, plan, &options, None, &env)
        .await?;

    let spec = StandingSpec {
        query_code: plan.query_code.clone(),
        sql: sql.to_string(),
        group_size: options.group_size,
        encoding: options.encoding,
        interval_ms: interval.as_millis() as u64,
        checkpoint_interval,
        checkpoints: cp.url.clone(),
        store: deployment.store_url.clone(),
        run_for_ms: StandingSpec::run_for(service.timeout_s).as_millis() as u64,
        shape: Some(plan.shape()),
        autoscale: standing.autoscale,
    };
    standing::put_spec(&deployment.store, &spec).await?;

    let mut driver_options = service.clone();
    driver_options.extra_env.extend(env);
    let driver = LambdaFunctionService::new(&deployment.sdk, Some(driver_options));
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
    Schedules::new(&deployment.sdk)
        .put(
            &schedule,
            &arn,
            &standing.scheduler_role,
            &standing::drive_input(&plan.query_code),
        )
        .await?;
    Ok(Some((
        functions,
        Standing {
            driver: driver_name,
            schedule,
            rate: RATE,
            checkpoint_dir: cp.url,
            tick_s: spec.run_for_ms as f64 / 1000.0,
        },
    )))
}

/// Pause (`enabled` false) or resume a standing query: its schedule is
/// disabled or enabled, its state kept. Returns the schedule's name.
pub async fn set_running(
    sdk: &aws_config::SdkConfig,
    query_code: &str,
    enabled: bool,
) -> Result<String> {
    let schedule = schedule_name(query_code);
    if !Schedules::new(sdk).set_enabled(&schedule, enabled).await? {
        return Err(LambdaError::refused(format!(
            "query {query_code} has no schedule ({schedule}): deploy it with `skein deploy \
             FILE.sql --backend lambda` (a query that checkpoints gets one)"
        )));
    }
    Ok(schedule)
}

/// What `skein destroy` removed.
#[derive(Debug, Default)]
pub struct Destroyed {
    /// Functions deleted.
    pub functions: usize,
    /// Event-source mappings deleted.
    pub mappings: usize,
    /// Whether a schedule was.
    pub schedule: bool,
    /// With `purge`: objects deleted from the checkpoint store, the spec
    /// and the dead letters.
    pub purged_objects: Option<usize>,
}

/// Remove a query: its schedule, its event-source mappings, its functions
/// and, with `purge`, its checkpoint store, spec and dead letters.
pub async fn destroy(
    sdk: &aws_config::SdkConfig,
    store_url: &str,
    query_code: &str,
    purge: bool,
) -> Result<Destroyed> {
    // The schedule first: it would invoke a deleted driver.
    let schedule = Schedules::new(sdk)
        .delete(&schedule_name(query_code))
        .await?;
    let service = LambdaFunctionService::new(sdk, None);
    // Event-source mappings next: they would keep invoking deleted functions.
    let lambda = aws_sdk_lambda::Client::new(sdk);
    let mut mappings = 0;
    for name in service.list(&format!("{query_code}-")).await? {
        mappings += esm::unmap_function(&lambda, &name).await?;
    }
    let functions = skein_engine::driver::destroy(query_code, &service).await?;
    let purged_objects = if purge {
        Some(purge_query(store_url, query_code).await?)
    } else {
        None
    };
    Ok(Destroyed {
        functions,
        mappings,
        schedule,
        purged_objects,
    })
}

/// Delete a query's checkpoint store, standing spec and dead letters.
async fn purge_query(store_url: &str, query_code: &str) -> Result<usize> {
    let store = crate::store::open(store_url)?;
    let url = match standing::get_spec(&store, query_code).await? {
        Some(spec) => spec.checkpoints,
        None => checkpoints::default_url(store_url, query_code),
    };
    let (cp_store, root) = checkpoints::locate(&url)?;
    let mut n = delete_under(&cp_store, &root).await?;
    standing::delete_spec(&store, query_code).await?;
    let letters = Path::from(format!("{}/{query_code}", crate::dead_letter::PREFIX));
    n += delete_under(&store, &letters).await?;
    Ok(n)
}

/// Delete every object under `root`; how many there were.
pub async fn delete_under(store: &Arc<dyn ObjectStore>, root: &Path) -> Result<usize> {
    let keys: Vec<_> = store
        .list(Some(root))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(LambdaError::store(format!("listing {root}")))?;
    for key in &keys {
        store
            .delete(key)
            .await
            .map_err(LambdaError::store(format!("deleting {key}")))?;
    }
    Ok(keys.len())
}
