//! POST /api/queries: start the editor's query as a standing query under a
//! name, on this machine (what `skein run FILE --name NAME` does, in a
//! process of its own that outlives the page) or on Lambda (what `skein
//! deploy FILE --backend lambda` does). The query's text is kept in
//! `<checkpoint root>/.queries/<name>.sql`, a local run's output beside it
//! in `<name>.log`.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::catalog::Backend;
use crate::editor::plan_written;
use crate::{App, routes};

/// How long a local query may take to say it runs, and a Lambda deploy to
/// finish.
const LOCAL_START: Duration = Duration::from_secs(60);
const LAMBDA_DEPLOY: Duration = Duration::from_secs(600);

/// Where the page keeps the text (and a local run's output) of the
/// queries it started.
const QUERIES_DIR: &str = ".queries";

/// What the page sends.
#[derive(Debug, Deserialize)]
pub(crate) struct DeployRequest {
    sql: String,
    /// The query's name; default: a `-- name:` line of the SQL.
    #[serde(default)]
    name: Option<String>,
    /// `local` (default) or `lambda`.
    #[serde(default)]
    backend: Option<String>,
    /// Members of each function group; default 8.
    #[serde(default)]
    group_size: Option<usize>,
    /// A deploy starts something that runs until stopped: the caller says
    /// it means it.
    #[serde(default)]
    confirmed: bool,
}

fn refused(status: StatusCode, error: impl Into<String>) -> Response {
    (status, Json(json!({ "error": error.into() }))).into_response()
}

/// A name is a file name, a Lambda tag value and a metrics label: letters,
/// digits, `-`, `_` and `.`, at most 64.
fn check_name(name: &str) -> Result<(), String> {
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > 64 || !name.chars().all(fine) || name.starts_with('.') {
        return Err(format!(
            "name {name:?}: use 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'"
        ));
    }
    Ok(())
}

/// The text to deploy: `sql` with a `-- name:` line that says `name`, so
/// every backend records the name with the query.
fn named_sql(sql: &str, name: &str) -> String {
    if skein_engine::query::declared_name(sql).as_deref() == Some(name) {
        return sql.to_string();
    }
    let kept: Vec<&str> = sql
        .lines()
        .filter(|l| {
            !l.trim()
                .strip_prefix("--")
                .is_some_and(|c| c.trim().starts_with("name:"))
        })
        .collect();
    format!("-- name: {name}\n{}\n", kept.join("\n").trim_end())
}

pub(crate) async fn deploy(State(app): State<Arc<App>>, Json(r): Json<DeployRequest>) -> Response {
    if !r.confirmed {
        return refused(
            StatusCode::BAD_REQUEST,
            "a deploy starts a query that runs until stopped: send \"confirmed\": true",
        );
    }
    let backend = match r
        .backend
        .as_deref()
        .map_or(Some(Backend::Local), Backend::parse)
    {
        Some(b) => b,
        None => {
            return refused(
                StatusCode::BAD_REQUEST,
                format!(
                    "backend {:?}: local or lambda",
                    r.backend.unwrap_or_default()
                ),
            );
        }
    };
    if backend == Backend::Lambda && app.options.lambda_store.is_none() {
        return refused(
            StatusCode::BAD_REQUEST,
            "Lambda is not set up for this page: start skein ui with AWS_ENDPOINT_URL or \
             AWS_REGION in its environment (and without --no-lambda)",
        );
    }
    let name = match r
        .name
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .or_else(|| skein_engine::query::declared_name(&r.sql))
    {
        Some(n) => n,
        None => {
            return refused(
                StatusCode::BAD_REQUEST,
                "name the query: a name, or a `-- name: ...` line in the SQL",
            );
        }
    };
    if let Err(e) = check_name(&name) {
        return refused(StatusCode::BAD_REQUEST, e);
    }
    let sql = named_sql(&r.sql, &name);
    let plan = match plan_written(&app, &sql, r.group_size).await {
        Ok(plan) => plan,
        Err(refused) => return refused,
    };
    let group_size = plan.group_size;
    let (found, _) = routes::find_all(&app).await;
    let running = |f: &crate::catalog::Found| f.pid.is_some() || f.backend == Backend::Lambda;
    if let Some(other) = found
        .iter()
        .find(|f| running(f) && f.name.as_deref() == Some(&name) && f.code != plan.query_code)
    {
        return refused(
            StatusCode::CONFLICT,
            format!(
                "a running query is already named {name:?} ({} query {}): choose another name",
                other.backend.name(),
                other.code
            ),
        );
    }
    if let Some(same) = found
        .iter()
        .find(|f| running(f) && f.backend == backend && f.code == plan.query_code)
    {
        return refused(
            StatusCode::CONFLICT,
            format!(
                "this query already runs ({} query {}{})",
                same.backend.name(),
                same.code,
                same.pid
                    .map(|p| format!(", process {p}"))
                    .unwrap_or_default()
            ),
        );
    }
    let dir = app.options.checkpoint_root.join(QUERIES_DIR);
    let file = dir.join(format!("{name}.sql"));
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&file, &sql)) {
        return refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("writing {}: {e}", file.display()),
        );
    }
    let started = match backend {
        Backend::Local => start_local(&app, &file, &name, group_size, &plan.query_code).await,
        Backend::Lambda => deploy_lambda(&app, &file, group_size).await,
    };
    match started {
        Ok(mut answer) => {
            tracing::info!(query = %plan.query_code, %name, backend = backend.name(), "deployed from the page");
            answer["query_code"] = json!(plan.query_code);
            answer["name"] = json!(name);
            answer["backend"] = json!(backend.name());
            answer["id"] = json!(format!("{}/{}", backend.name(), plan.query_code));
            answer["sql_file"] = json!(file.display().to_string());
            Json(answer).into_response()
        }
        Err(e) => refused(StatusCode::BAD_GATEWAY, e),
    }
}

/// The last line of `text` that says something.
fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no output")
        .to_string()
}

/// `skein run FILE --name NAME` in a process group of its own (it runs on
/// when the page stops), its output in `<name>.log`; answered once the
/// query says it runs (a checkpoint directory it holds, or the file of a
/// query without one), or with the last line it wrote if it ends first.
async fn start_local(
    app: &App,
    file: &Path,
    name: &str,
    group_size: usize,
    code: &str,
) -> Result<Value, String> {
    let log = file.with_extension("log");
    let out =
        std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("opening {}: {e}", log.display()))?;
    let mut command = tokio::process::Command::new(&app.options.launcher);
    command
        .arg("run")
        .arg(file)
        .args(["--name", name, "--group-size", &group_size.to_string()])
        .env(
            skein_engine::running::ROOT_ENV,
            &app.options.checkpoint_root,
        )
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting {}: {e}", app.options.launcher.display()))?;
    let pid = child.id().unwrap_or_default();
    // Reap it whenever it ends, and say so.
    let (ended_tx, mut ended) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let status = child.wait().await;
        let _ = ended_tx.send(status);
    });
    let since = Instant::now();
    loop {
        if let Ok(status) = ended.try_recv() {
            let written = std::fs::read_to_string(&log).unwrap_or_default();
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            return Err(format!(
                "the query ended ({status}): {}",
                last_line(&written)
            ));
        }
        // Its checkpoint directory's lock, or the file of a query without
        // one: nothing else under the root need be opened.
        let root = &app.options.checkpoint_root;
        let holds_dir = crate::catalog::lock_holder(&root.join(code)) == Some(pid);
        if holds_dir
            || skein_engine::running::list(root)
                .iter()
                .any(|q| q.pid == pid)
        {
            return Ok(json!({ "pid": pid, "log": log.display().to_string() }));
        }
        if since.elapsed() > LOCAL_START {
            return Err(format!(
                "process {pid} did not say within {} s that the query runs; see {}",
                LOCAL_START.as_secs(),
                log.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `skein deploy FILE --backend lambda --json` with the page's store.
async fn deploy_lambda(app: &App, file: &Path, group_size: usize) -> Result<Value, String> {
    let store = app.options.lambda_store.clone().unwrap_or_default();
    let mut command = tokio::process::Command::new(&app.options.launcher);
    command
        .arg("deploy")
        .arg(file)
        .args(["--backend", "lambda", "--json"])
        .args(["--group-size", &group_size.to_string()])
        .env("SKEIN_STORE", store)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(LAMBDA_DEPLOY, command.output())
        .await
        .map_err(|_| format!("skein deploy took over {} s", LAMBDA_DEPLOY.as_secs()))?
        .map_err(|e| format!("starting {}: {e}", app.options.launcher.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("skein deploy: {}", last_line(&stderr)));
    }
    let deployed: Value = serde_json::from_str(last_line(&stdout).as_str())
        .map_err(|e| format!("skein deploy --json printed no JSON line: {e}"))?;
    Ok(json!({ "deployed": deployed }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployed_query_says_its_name_once() {
        assert_eq!(
            named_sql("SELECT 1;", "clicks"),
            "-- name: clicks\nSELECT 1;\n"
        );
        let named = "-- name: clicks\nSELECT 1;";
        assert_eq!(named_sql(named, "clicks"), named);
        assert_eq!(
            named_sql("-- name: old\nSELECT 1;", "new"),
            "-- name: new\nSELECT 1;\n"
        );
        assert!(check_name("clicks-per_ad.v2").is_ok());
        for bad in ["", "../x", "a b", ".hidden", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
