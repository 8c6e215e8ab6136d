//! The HTTP routes: the page and its script, and the JSON API under
//! /api/ (listed in docs/ui.md).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use serde_json::{Value, json};
use skein_engine::planner::{PlanOptions, QueryPlan, plan_query, session};
use skein_lambda::schedule::{Schedules, schedule_name};

use crate::catalog::{self, Backend, Found};
use crate::error::UiError;
use crate::records::{self, Records};
use crate::{App, assets, deploy, editor, sources, view};

/// How long the sources may take to say where their partitions end.
const SOURCES_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/app.js", get(assets::script))
        .route("/style.css", get(assets::style))
        .route("/api/queries", get(list).post(deploy::deploy))
        .route("/api/queries/{backend}/{code}", get(one))
        .route("/api/queries/{backend}/{code}/stop", post(stop))
        .route("/api/queries/{backend}/{code}/start", post(start))
        .route("/api/explain", post(editor::explain))
        .route("/api/preview", post(editor::preview_rows))
        .route("/api/sources", get(sources::list))
        .route("/api/sources/sample", post(sources::sample))
        .with_state(app)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Every query, and why Lambda could not be asked if it could not.
pub(crate) async fn find_all(app: &App) -> (Vec<Found>, Option<String>) {
    let mut found = catalog::local(&app.options.checkpoint_root).await;
    let mut lambda_error = None;
    if let Some(url) = &app.options.lambda_store {
        match catalog::lambda(url).await {
            Ok(more) => found.extend(more),
            Err(e) => lambda_error = Some(e.to_string()),
        }
    }
    (found, lambda_error)
}

async fn find(app: &App, backend: &str, code: &str) -> Result<Found, UiError> {
    let not_found = || UiError::NotFound {
        backend: backend.to_string(),
        code: code.to_string(),
    };
    let wanted = Backend::parse(backend).ok_or_else(not_found)?;
    let (found, lambda_error) = find_all(app).await;
    match found
        .into_iter()
        .find(|f| f.backend == wanted && f.code == code)
    {
        Some(f) => Ok(f),
        None => match lambda_error {
            Some(e) if wanted == Backend::Lambda => Err(UiError::Lambda(e)),
            _ => Err(not_found()),
        },
    }
}

async fn read(found: &Found) -> Records {
    let Some(store) = &found.store else {
        return Records::default();
    };
    records::read(store).await.unwrap_or_else(|e| {
        tracing::warn!(query = %found.code, error = %e, "reading its checkpoint store");
        Records::default()
    })
}

/// The schedule's state of a standing query on Lambda.
async fn schedule(found: &Found) -> Option<String> {
    found.spec.as_ref()?;
    let sdk = skein_lambda::sdk_config().await;
    match Schedules::new(&sdk)
        .state(&schedule_name(&found.code))
        .await
    {
        Ok(state) => state,
        Err(e) => {
            tracing::warn!(query = %found.code, error = %e, "reading its schedule");
            None
        }
    }
}

async fn list(State(app): State<Arc<App>>) -> Json<Value> {
    let (found, lambda_error) = find_all(&app).await;
    let now = now_ms();
    let mut rows = vec![];
    for f in &found {
        let records = read(f).await;
        let schedule = schedule(f).await;
        rows.push(view::summary(f, &records, schedule.as_deref(), now));
    }
    Json(json!({
        "queries": rows,
        "lambda": {"store": app.options.lambda_store, "error": lambda_error},
        "authentication": "none",
    }))
}

async fn one(
    State(app): State<Arc<App>>,
    Path((backend, code)): Path<(String, String)>,
) -> Result<Json<view::Detail>, UiError> {
    let found = find(&app, &backend, &code).await?;
    let records = read(&found).await;
    let plan = plan(&app, &found).await;
    let partitions = match (&plan, &found.store) {
        (Ok(plan), Some(store)) => {
            let status = skein_engine::status::query_status(plan, store, &app.options.catalog);
            match tokio::time::timeout(SOURCES_TIMEOUT, status).await {
                Ok(Ok(s)) => Ok(s.partitions),
                Ok(Err(e)) => Err(skein_engine::error::one_line(&e)),
                Err(_) => Err(format!(
                    "the sources did not say where their partitions end within {} s",
                    SOURCES_TIMEOUT.as_secs()
                )),
            }
        }
        (Err(e), _) => Err(e.clone()),
        (_, None) => Err("the query has no checkpoint store".into()),
    };
    let live = view::Live {
        plan,
        partitions,
        schedule: schedule(&found).await,
    };
    Ok(Json(view::detail(&found, &records, live, now_ms())))
}

/// The query's plan, from the text its store or spec records.
async fn plan(app: &App, found: &Found) -> Result<Arc<QueryPlan>, String> {
    let Some((sql, group_size)) = &found.sql else {
        return Err(
            "its checkpoint store does not record the query's text (written before skein ui; \
             run the query again to record it)"
                .into(),
        );
    };
    let key = (found.code.clone(), *group_size);
    if let Some(p) = app.plans.lock().await.get(&key) {
        return Ok(p.clone());
    }
    let ctx = session(&app.options.catalog, *group_size);
    let options = PlanOptions {
        group_size: *group_size,
        ..Default::default()
    };
    let mut plan = plan_query(&ctx, sql, &options).await.map_err(|e| {
        UiError::Plan {
            code: found.code.clone(),
            reason: skein_engine::error::one_line(&e),
        }
        .to_string()
    })?;
    if let Some(spec) = &found.spec {
        skein_lambda::standing::route_collect(&mut plan, &spec.store);
    }
    let plan = Arc::new(plan);
    app.plans.lock().await.insert(key, plan.clone());
    Ok(plan)
}

async fn stop(
    state: State<Arc<App>>,
    path: Path<(String, String)>,
) -> Result<Json<Value>, UiError> {
    set_running(state, path, false).await
}

async fn start(
    state: State<Arc<App>>,
    path: Path<(String, String)>,
) -> Result<Json<Value>, UiError> {
    set_running(state, path, true).await
}

/// What `skein stop` / `skein start` do: disable or enable the standing
/// query's schedule (state kept). A local query is stopped as Ctrl-C stops
/// it (SIGTERM to its process: it finishes the epoch in flight).
async fn set_running(
    State(app): State<Arc<App>>,
    Path((backend, code)): Path<(String, String)>,
    enabled: bool,
) -> Result<Json<Value>, UiError> {
    if Backend::parse(&backend) == Some(Backend::Local) && !enabled {
        let found = find(&app, &backend, &code).await?;
        let Some(pid) = found.pid else {
            return Err(UiError::Refused(format!("query {code} is not running")));
        };
        let sent = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .map_err(|e| UiError::Refused(format!("kill -TERM {pid}: {e}")))?;
        if !sent.success() {
            return Err(UiError::Refused(format!("kill -TERM {pid}: {sent}")));
        }
        tracing::info!(query = %code, pid, "stopped from the page");
        return Ok(Json(
            json!({"query_code": code, "pid": pid, "signal": "SIGTERM"}),
        ));
    }
    if Backend::parse(&backend) != Some(Backend::Lambda) {
        return Err(UiError::Refused(
            "start is for standing queries on Lambda; run a local query again with `skein run`, \
             or deploy it from the editor"
                .into(),
        ));
    }
    let found = find(&app, &backend, &code).await?;
    let schedule = schedule_name(&found.code);
    let sdk = skein_lambda::sdk_config().await;
    let changed = Schedules::new(&sdk)
        .set_enabled(&schedule, enabled)
        .await
        .map_err(|e| UiError::Lambda(e.to_string()))?;
    if !changed {
        return Err(UiError::Refused(format!(
            "query {code} has no schedule ({schedule}): it is not a standing query"
        )));
    }
    let state = if enabled { "ENABLED" } else { "DISABLED" };
    tracing::info!(query = %code, state, "schedule changed from the page");
    Ok(Json(
        json!({"query_code": code, "schedule": schedule, "state": state}),
    ))
}
