//! The editor's API: explain a query as written, and preview it on the
//! live tables (rows stream back as JSON lines while epochs complete).
//! Neither writes a sink nor commits an offset.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use skein_engine::planner::{PlanOptions, QueryPlan, plan_query, session};
use skein_engine::preview::{PreviewEvent, PreviewOptions, PreviewStart, preview};

use crate::App;

/// The longest preview the page may ask for, and the most rows.
const MAX_SECONDS: u64 = 300;
const MAX_ROWS: usize = 10_000;

/// A query as the editor holds it.
#[derive(Debug, Deserialize)]
pub(crate) struct Written {
    sql: String,
    /// Members of each function group (explain); default 8.
    #[serde(default)]
    group_size: Option<usize>,
    /// Preview: stop once this many rows came out (default 100).
    #[serde(default)]
    rows: Option<usize>,
    /// Preview: stop after this many seconds (default 30).
    #[serde(default)]
    seconds: Option<u64>,
    /// Preview: `latest` (default), `earliest`, or a time (RFC 3339, or
    /// ms since the epoch).
    #[serde(default)]
    from: Option<String>,
}

/// A planning error as the page shows it: the message, and the line of
/// the SQL it names, if it names one.
pub(crate) fn planning_error(e: &skein_engine::EngineError) -> Response {
    let message = skein_engine::error::one_line(e);
    let body = json!({ "error": message, "line": line_named(&message) });
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

/// The line a parser error names (`... at Line: 3, Column: 7`).
fn line_named(message: &str) -> Option<u64> {
    let at = message.find("Line: ")? + "Line: ".len();
    let digits: String = message[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// Plan `sql` with the page's catalog at `group_size` members (default
/// 8); a planning error is the page's 400.
pub(crate) async fn plan_written(
    app: &App,
    sql: &str,
    group_size: Option<usize>,
) -> Result<QueryPlan, Response> {
    let group_size = group_size
        .unwrap_or(skein_engine::planner::DEFAULT_GROUP_SIZE)
        .max(1);
    let ctx = session(&app.options.catalog, group_size);
    let options = PlanOptions {
        group_size,
        ..Default::default()
    };
    plan_query(&ctx, sql, &options)
        .await
        .map_err(|e| planning_error(&e))
}

/// POST /api/explain: the stage graph the query plans to, each stage's
/// mode and state, as `skein explain --json` prints it.
pub(crate) async fn explain(State(app): State<Arc<App>>, Json(w): Json<Written>) -> Response {
    match plan_written(&app, &w.sql, w.group_size).await {
        Ok(plan) => Json(plan.explain_json()).into_response(),
        Err(refused) => refused,
    }
}

/// POST /api/preview: the query run on its live tables; the answer is
/// JSON lines, one event each (`started`, `rows`, `ended`, or `error`),
/// sent as they happen.
pub(crate) async fn preview_rows(State(app): State<Arc<App>>, Json(w): Json<Written>) -> Response {
    let from = match PreviewStart::parse(w.from.as_deref().unwrap_or("latest")) {
        Ok(from) => from,
        Err(e) => {
            let body = json!({ "error": skein_engine::error::one_line(&e) });
            return (StatusCode::BAD_REQUEST, Json(body)).into_response();
        }
    };
    let options = PreviewOptions {
        rows: w.rows.unwrap_or(100).clamp(1, MAX_ROWS),
        seconds: Duration::from_secs(w.seconds.unwrap_or(30).clamp(1, MAX_SECONDS)),
        from,
        ..Default::default()
    };
    // Planning errors answer 400 before anything streams.
    let ctx = session(&app.options.catalog, 1);
    if let Err(e) = plan_query(&ctx, &w.sql, &PlanOptions::default()).await {
        return planning_error(&e);
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let catalog = app.options.catalog.clone();
    tokio::spawn(async move {
        let lines = tx.clone();
        // The page going away (Stop, another preview, a closed tab) drops
        // the stream: the preview then ends after the epoch in flight.
        let ran = preview(&catalog, &w.sql, &options, move |event| {
            let mut line = serde_json::to_value(&event).unwrap_or_default();
            if let PreviewEvent::Ended {
                events,
                epochs,
                invocations,
                billed_ms,
                ..
            } = event
            {
                line["usd_per_million_events"] =
                    json!(preview_price(events, epochs, invocations, billed_ms));
            }
            lines.send(line.to_string() + "\n").is_ok()
        })
        .await;
        if let Err(e) = ran {
            let error: Value = json!({"type": "error", "error": skein_engine::error::one_line(&e)});
            let _ = tx.send(error.to_string() + "\n");
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|line| (Ok::<_, std::convert::Infallible>(line), rx))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// $ per million events on Lambda arm64 of what a preview's epochs used:
/// its invocations and handler time, without the checkpoint writes a
/// deployed query adds.
fn preview_price(events: u64, epochs: u64, invocations: u64, billed_ms: u64) -> Option<f64> {
    let totals = skein_engine::checkpoint::Totals {
        events,
        epochs,
        usage: skein_engine::usage::Usage {
            invocations,
            billed_ms,
            ..Default::default()
        },
    };
    crate::view::usd_per_million(&totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parser_error_names_its_line() {
        let m = "SQL error: ParserError(\"Expected: end of statement, found: FORM at Line: 3, Column: 10\")";
        assert_eq!(line_named(m), Some(3));
        assert_eq!(line_named("table t not found"), None);
    }
}
