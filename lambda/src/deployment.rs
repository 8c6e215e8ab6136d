//! A deployment on Lambda: the connection (SDK, the deployment's object
//! store, the table kinds it plans with), the code every function runs
//! (uploaded once under its hash), the service options each function is
//! created with (its code, role, memory, and the query's dead-letter
//! function as the on-failure destination of async invocations), deploying
//! a plan's stages, opening its checkpoint location, and what a pushed
//! (`'mode' 'push'`) table allows.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_lambda::types::Architecture;
use datafusion::prelude::SessionContext;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use skein_engine::catalog::Catalog;
use skein_engine::catalog::parallelism::SourceBudget;
use skein_engine::checkpoint::CheckpointStore;
use skein_engine::driver::{Deployed, deploy};
use skein_engine::invoke::{FunctionService, FunctionSpec};
use skein_engine::planner::{PlanOptions, QueryPlan, STATELESS_CONCURRENCY};
use skein_engine::query::{CheckpointLocation, CheckpointRequest};

use crate::error::{LambdaError, Result};
use crate::esm::{MODE_OPTION, MODE_PUSH};
use crate::package::{code_sha256, deployable_zip};
use crate::{CodeSource, LambdaFunctionService, RUN_ENV, STORE_ENV, ServiceOptions};
use crate::{checkpoints, dead_letter, standing, store};

/// Where and how a query's functions are deployed.
#[derive(Debug, Clone)]
pub struct LambdaOptions {
    /// A ready bootstrap.zip; without it, the function binary is zipped.
    pub zip: Option<PathBuf>,
    /// The skein-function binary to zip (default: next to the running binary).
    pub function_binary: Option<PathBuf>,
    /// The functions' execution role.
    pub role: String,
    /// Memory of each function, MB.
    pub memory_mb: i32,
    /// Timeout of each function, seconds.
    pub timeout_s: i32,
    /// The functions' architecture.
    pub arch: Architecture,
    /// The deployment's object store: `s3://bucket` or `file:///dir`.
    pub store: String,
    /// The on-failure destination of async invocations (default: the
    /// query's dead-letter function).
    pub on_failure: Option<String>,
}

/// A connection to Lambda and the deployment's store, with the table kinds
/// queries are planned with.
pub struct Deployment {
    /// The AWS SDK's configuration.
    pub sdk: aws_config::SdkConfig,
    /// The deployment's object store (spilled contexts, code, results).
    pub store: Arc<dyn ObjectStore>,
    /// Its URL, without a trailing slash.
    pub store_url: String,
    /// The table kinds.
    pub catalog: Catalog,
    /// How functions are deployed.
    pub options: LambdaOptions,
}

/// A query's checkpoint location on Lambda and its store, opened.
pub struct Checkpoints {
    /// `s3://bucket/prefix` (or `file:///dir`).
    pub url: String,
    /// The store, opened by this driver.
    pub store: Arc<CheckpointStore>,
}

/// A new run id: every function deployed with it starts from a fresh
/// instance.
pub fn run_id() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("{millis}-{:04x}", std::process::id() & 0xffff)
}

impl Deployment {
    /// Connect to Lambda (the standard AWS chain, `AWS_ENDPOINT_URL`
    /// honoured) and open the store, creating its bucket if need be.
    pub async fn connect(catalog: Catalog, options: LambdaOptions) -> Result<Self> {
        let sdk = crate::sdk_config().await;
        store::ensure_bucket(&sdk, &options.store).await?;
        let store = store::open(&options.store)?;
        Ok(Deployment {
            sdk,
            store,
            store_url: options.store.trim_end_matches('/').to_string(),
            catalog,
            options,
        })
    }

    /// Plan `sql` as every run does (`skein_engine::query::prepare`); a
    /// query without INSERT INTO writes to the RESULTS sink in the store.
    pub async fn plan(
        &self,
        sql: &str,
        options: &PlanOptions,
    ) -> Result<(QueryPlan, SessionContext)> {
        // A source table reads with an instance per partition, up to the
        // group size: Lambda runs as many functions as it is given.
        let mut catalog = self.catalog.clone();
        catalog.set_source_budget(SourceBudget::Members(options.group_size));
        let ctx = skein_engine::session::session(&catalog, options.group_size);
        let mut plan = skein_engine::planner::plan_query(&ctx, sql, options).await?;
        standing::route_collect(&mut plan, &self.store_url);
        let prepared = skein_engine::query::finish(&catalog, ctx, plan).await?;
        Ok((prepared.plan, prepared.ctx))
    }

    /// The code to deploy: a zip in S3 under its hash (uploaded once, not
    /// with every function), or the zip itself for a file store.
    pub async fn code(&self) -> Result<(CodeSource, String)> {
        let o = &self.options;
        let zip = deployable_zip(o.zip.as_deref(), o.function_binary.as_deref())?;
        let sha = code_sha256(&zip);
        let Some(bucket) = store::s3_bucket(&self.store_url) else {
            return Ok((CodeSource::Zip(Arc::new(zip)), sha));
        };
        let hex_sha = sha.replace(['/', '+', '='], "_");
        let key = format!("skein/code/{hex_sha}.zip");
        let path = StorePath::from(key.as_str());
        if self.store.head(&path).await.is_err() {
            self.store
                .put(&path, zip.into())
                .await
                .map_err(LambdaError::store("uploading the function code"))?;
        }
        Ok((
            CodeSource::S3 {
                bucket: bucket.to_string(),
                key,
            },
            sha,
        ))
    }

    /// The options every function of the query is deployed with: its code
    /// (uploaded once) and the on-failure destination of its async
    /// invocations (the query's dead-letter function, deployed here, unless
    /// the options name another).
    pub async fn service_options(&self, plan: &QueryPlan) -> Result<ServiceOptions> {
        let (code, code_sha256) = self.code().await?;
        let o = &self.options;
        let name = skein_engine::query::declared_name(&plan.sql);
        let mut extra_env = BTreeMap::from([
            (STORE_ENV.to_string(), self.store_url.clone()),
            (RUN_ENV.to_string(), run_id()),
        ]);
        if let Some(name) = &name {
            extra_env.insert(crate::emf::QUERY_NAME_ENV.to_string(), name.clone());
        }
        let mut service = ServiceOptions {
            code,
            code_sha256,
            role: o.role.clone(),
            memory_mb: o.memory_mb,
            timeout_s: o.timeout_s,
            arch: o.arch.clone(),
            extra_env,
            on_failure: None,
            tags: crate::service::query_tags(&plan.query_code, name.as_deref()),
        };
        service.on_failure = match &o.on_failure {
            Some(arn) => Some(arn.clone()),
            None => {
                let dlq = LambdaFunctionService::new(&self.sdk, Some(service.clone()));
                let name = dead_letter::function_name(&plan.query_code);
                dlq.create(FunctionSpec {
                    name: name.clone(),
                    environment: BTreeMap::new(),
                    concurrency: STATELESS_CONCURRENCY,
                })
                .await?;
                Some(dlq.function_arn(&name).await?)
            }
        };
        Ok(service)
    }

    /// Deploy every stage function with `env` added to its environment and
    /// a new run id, so every function starts from a fresh instance.
    pub async fn deploy_stages(
        &self,
        service: &ServiceOptions,
        plan: &QueryPlan,
        options: &PlanOptions,
        epochs: Option<u64>,
        env: &BTreeMap<String, String>,
    ) -> Result<Vec<Deployed>> {
        let mut service = service.clone();
        service.extra_env.extend(env.clone());
        service.extra_env.insert(RUN_ENV.to_string(), run_id());
        let extra_env = service.extra_env.clone();
        let lambda = LambdaFunctionService::new(&self.sdk, Some(service));
        Ok(deploy(plan, &lambda, &self.store, options, epochs, &extra_env).await?)
    }

    /// Deploy the query's dead-letter function (unless the options name
    /// another destination), then every stage function.
    pub async fn deploy_plan(
        &self,
        plan: &QueryPlan,
        options: &PlanOptions,
        epochs: Option<u64>,
    ) -> Result<Vec<Deployed>> {
        let service = self.service_options(plan).await?;
        self.deploy_stages(&service, plan, options, epochs, &BTreeMap::new())
            .await
    }

    /// Open the query's checkpoint location when it checkpoints: the rule
    /// every backend follows (`skein_engine::query::checkpoint_location`),
    /// with S3 for a directory.
    pub async fn open_checkpoints(
        &self,
        plan: &QueryPlan,
        request: &CheckpointRequest,
        invoke_async: bool,
    ) -> Result<Option<Checkpoints>> {
        let location = skein_engine::query::checkpoint_location(&self.catalog, plan, request)?;
        let url = match location {
            Some(CheckpointLocation::Given(dir)) => {
                let url = dir.to_string_lossy().to_string();
                checkpoints::check_url(&url)?;
                store::ensure_bucket(&self.sdk, &url).await?;
                url
            }
            Some(CheckpointLocation::Default) => {
                checkpoints::default_url(&self.store_url, &plan.query_code)
            }
            None => {
                if let Some(reason) =
                    skein_engine::query::at_least_once_reason(&self.catalog, plan, request)
                {
                    tracing::warn!(%reason, "at least once across restarts, not exactly once");
                }
                return Ok(None);
            }
        };
        if invoke_async {
            return Err(LambdaError::refused(
                "checkpoints on Lambda need synchronous hops (an epoch is complete when its \
                 triggers return); drop --invoke-async, or run with --no-checkpoint",
            ));
        }
        let store = checkpoints::open(&url, &plan.query_code).await?;
        tracing::info!(%url, "checkpointing");
        Ok(Some(Checkpoints {
            url,
            store: Arc::new(store),
        }))
    }
}

/// Whether a source table is pushed: declared `'mode' 'push'` (the catalog
/// takes the option only on tables whose source takes pushed records).
fn is_pushed(config: &skein_engine::source::SourceConfig) -> bool {
    config.option(MODE_OPTION) == Some(MODE_PUSH)
}

/// The pushed tables with the function an event-source mapping feeds: the
/// source stage's first member. A pushed table must be read alone by its
/// stage, and by one member when it feeds later stages.
pub fn pushed_sources(plan: &QueryPlan) -> Result<Vec<(String, String)>> {
    let mut out = vec![];
    for stage in &plan.stages {
        for leaf in stage.sources.iter().filter(|l| is_pushed(&l.config)) {
            if stage.sources.len() != 1 {
                return Err(LambdaError::refused(format!(
                    "table {} is pushed ('mode' 'push'), but its stage reads {} tables: a pushed \
                     batch feeds a stage that reads that table alone",
                    leaf.table,
                    stage.sources.len()
                )));
            }
            // Past the source stage, pushed batches are epochs of the
            // offsets log, taken by one source member.
            if stage.consumer.is_some() && stage.members != 1 {
                return Err(LambdaError::refused(format!(
                    "table {} is pushed ('mode' 'push') and feeds a shuffle, window or aggregate: \
                     its batches become epochs taken by one source member; declare it with \
                     'parallelism' '1' (Lambda still runs one invocation per shard)",
                    leaf.table
                )));
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
pub fn pushes_into_stages(plan: &QueryPlan) -> bool {
    plan.stages.iter().any(|stage| {
        stage.consumer.is_some() && stage.sources.iter().any(|leaf| is_pushed(&leaf.config))
    })
}
