//! The streams of the clusters `skein ui` was pointed at (GET
//! /api/sources), and a sample of one with the table that reads it (POST
//! /api/sources/sample), through the catalog's browsers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use skein_engine::catalog::browse::{declaration, table_name};

use crate::App;

/// How long a cluster may take to list its streams or give a sample.
const ASK_TIMEOUT: Duration = Duration::from_secs(20);
/// The most records a sample may ask for.
const MAX_SAMPLE: usize = 100;

/// A cluster the page lists the streams of.
#[derive(Debug, Clone, Serialize)]
pub struct SourceCluster {
    /// Its table kind (`KAFKA`).
    pub kind: String,
    /// How a person names it (the brokers' addresses).
    pub name: String,
    /// Its options, as a table of the kind would give them.
    pub options: BTreeMap<String, String>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// GET /api/sources: each cluster with its streams, or why not.
pub(crate) async fn list(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let mut clusters = vec![];
    for (i, c) in app.options.sources.iter().enumerate() {
        let listed = match app.options.catalog.browser(&c.kind) {
            None => Err(format!("{} streams cannot be listed", c.kind)),
            Some(b) => match tokio::time::timeout(ASK_TIMEOUT, b.list(&c.options)).await {
                Ok(Ok(streams)) => Ok(streams),
                Ok(Err(e)) => Err(skein_engine::error::one_line(&e)),
                Err(_) => Err(format!(
                    "{} did not answer within {} s",
                    c.name,
                    ASK_TIMEOUT.as_secs()
                )),
            },
        };
        let (streams, error) = match listed {
            Ok(s) => (s, None),
            Err(e) => (vec![], Some(e)),
        };
        clusters.push(json!({
            "cluster": i, "kind": c.kind, "name": c.name, "streams": streams, "error": error,
        }));
    }
    Json(json!({ "clusters": clusters }))
}

/// What the page asks to sample.
#[derive(Debug, Deserialize)]
pub(crate) struct SampleRequest {
    /// The cluster's index in GET /api/sources.
    cluster: usize,
    stream: String,
    /// How many of its newest records (default 20).
    #[serde(default)]
    records: Option<usize>,
}

/// POST /api/sources/sample: the stream's newest records, the columns and
/// format they suggest, and the `CREATE EXTERNAL TABLE` that reads them.
pub(crate) async fn sample(State(app): State<Arc<App>>, Json(r): Json<SampleRequest>) -> Response {
    let Some(c) = app.options.sources.get(r.cluster) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no cluster {} (GET /api/sources lists them)", r.cluster),
        );
    };
    let Some(browser) = app.options.catalog.browser(&c.kind) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("{} streams cannot be sampled", c.kind),
        );
    };
    let records = r.records.unwrap_or(20).clamp(1, MAX_SAMPLE);
    let sampled = tokio::time::timeout(ASK_TIMEOUT, browser.sample(&c.options, &r.stream, records));
    match sampled.await {
        Ok(Ok(sample)) => {
            let table = table_name(&r.stream);
            let ddl = declaration(&c.kind, &table, &r.stream, &sample);
            Json(json!({
                "cluster": r.cluster, "stream": r.stream, "table": table,
                "declaration": ddl, "sample": sample,
            }))
            .into_response()
        }
        Ok(Err(e)) => error(StatusCode::BAD_GATEWAY, skein_engine::error::one_line(&e)),
        Err(_) => error(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "{} did not answer within {} s",
                c.name,
                ASK_TIMEOUT.as_secs()
            ),
        ),
    }
}
