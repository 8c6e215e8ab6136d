//! `skein ui` in a real browser (headless Chromium through chromedriver)
//! and through its JSON API, over a standing query on real Kafka: the
//! graph has the plan's stages (as `skein explain --json` lists them), lag
//! and events/s are numbers that change between two page loads while
//! records arrive, and once the query is stopped (SIGTERM) the list shows
//! it stopped. The same for a standing query deployed on Lambda (ministack),
//! stopped and started with the page's buttons. Screenshots go to
//! target/ui-screenshots (docs/ui.md). From a topic to a deployed query
//! in the editor, locally and on Lambda: `deploy.rs`.

#[path = "../common/mod.rs"]
mod common;
mod deploy;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::browser::{Browser, get_json, http, screenshot_dir};
use common::windowed;
use serde_json::Value;

const PARTITIONS: usize = 2;

/// A child process killed when dropped (the test's own processes only).
pub(crate) struct Owned(Option<Child>);

impl Owned {
    fn new(child: Child) -> Self {
        Owned(Some(child))
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// The child, no longer killed on drop.
    fn take(&mut self) -> Child {
        self.0.take().expect("running")
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `skein ui` on a free port, looking at Lambda with the deployment's
/// `store` if given: (process, port).
fn start_ui(checkpoint_root: &Path, store: Option<&str>) -> (Owned, u16) {
    start_ui_with(checkpoint_root, store, &[])
}

/// [`start_ui`] with more arguments (`--kafka BROKERS`).
fn start_ui_with(checkpoint_root: &Path, store: Option<&str>, more: &[&str]) -> (Owned, u16) {
    let port = common::free_port();
    let mut command = match store {
        Some(store) => {
            let mut c = common::skein_command_on_aws();
            // What a deploy from the page deploys.
            c.env("SKEIN_STORE", store)
                .env("SKEIN_FUNCTION_BINARY", common::function_binary());
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_skein")),
    };
    command
        .args(["ui", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--checkpoint-root")
        .arg(checkpoint_root)
        .args(more)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if store.is_none() {
        command.arg("--no-lambda");
    }
    let child = Owned::new(command.spawn().expect("starting skein ui"));
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "skein ui did not listen within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (child, port)
}

/// The stage ids `skein explain --json` gives for `sql`, and "sink".
fn planned_stages(sql: &Path, group_size: &str) -> Vec<String> {
    let (ok, out, err) = common::skein(&[
        "explain",
        sql.to_str().unwrap(),
        "--group-size",
        group_size,
        "--json",
    ]);
    assert!(ok, "skein explain: {err}");
    let plan: Value = serde_json::from_str(out.trim()).expect("explain --json");
    let mut ids: Vec<String> = plan["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["id"].to_string())
        .collect();
    ids.push("sink".into());
    ids
}

/// The stage ids drawn in the page's graph.
const GRAPH_STAGES: &str = "const ids = [...document.querySelectorAll('#graph g.node')]\
    .map(n => n.dataset.stage); return ids.length ? ids : null;";

/// Every edge of the graph is labelled with a rate above zero rows/s.
const EDGES_FLOWING: &str = "const rates = [...document.querySelectorAll('#graph g.edge text.rate')]\
    .filter(t => t.textContent.endsWith('rows/s')); \
    return rates.length > 0 && rates.every(t => !t.textContent.startsWith('0 '));";

/// The number in an element's text (`1,234`, `12.5k`), or null.
fn number_of(id: &str) -> String {
    format!(
        "const e = document.getElementById('{id}'); if (!e) return null; \
         const m = e.textContent.replace(/,/g, '').match(/^(-?[0-9.]+)([kMG]?)$/); \
         if (!m) return null; return parseFloat(m[1]) * ({{'': 1, k: 1e3, M: 1e6, G: 1e9}})[m[2]];"
    )
}

/// Produces records into `topic` until `stop`, a chunk at a time, so the
/// query always has more to read (and its lag and rate keep moving).
fn keep_producing(topic: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (records, _) = windowed::records(200_000, PARTITIONS, 2_000_000);
        let started = Instant::now();
        for chunk in records.chunks(1_500) {
            if stop.load(Ordering::Relaxed) || started.elapsed() > Duration::from_secs(600) {
                break;
            }
            windowed::produce(&topic, chunk);
            std::thread::sleep(Duration::from_millis(300));
        }
    })
}

#[test]
fn the_page_shows_a_running_local_query_and_then_that_it_stopped() {
    let work = std::env::temp_dir().join(common::unique_name("skein-ui"));
    let root = work.join("checkpoints");
    std::fs::create_dir_all(&root).unwrap();
    let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 300);
    let (_, sink) = windowed::kafka_sink();
    let sql = work.join("q.sql");
    std::fs::write(&sql, windowed::query(&source, &sink)).unwrap();
    let stages = planned_stages(&sql, "2");

    let stop_producing = Arc::new(AtomicBool::new(false));
    let producer = keep_producing(topic, stop_producing.clone());
    let mut run = Owned::new(
        Command::new(env!("CARGO_BIN_EXE_skein"))
            .args(["run", sql.to_str().unwrap(), "--group-size", "2"])
            .args(["--interval", "500ms", "--checkpoint-dir"])
            .arg(root.join("q"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting skein run"),
    );
    let (_ui, port) = start_ui(&root, None);

    // The JSON API: the query is listed running, with figures.
    let listed = wait_json(
        port,
        "/api/queries",
        120,
        "the query running with a lag",
        |v| {
            let q = v["queries"].as_array()?.first()?.clone();
            (q["state"] == "running" && q["lag"].is_u64() && q["events_per_s"].is_f64())
                .then_some(q)
        },
    );
    let id = listed["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("local/q"), "{listed}");
    assert_eq!(get_json(port, "/api/queries")["authentication"], "none");
    let detail = get_json(port, &format!("/api/queries/{id}"));
    let mut drawn: Vec<String> = detail["graph"]["nodes"]
        .as_array()
        .expect("a graph")
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    drawn.sort();
    let mut planned = stages.clone();
    planned.sort();
    assert_eq!(drawn, planned, "the API's graph has the plan's stages");
    assert_eq!(
        detail["partitions"].as_array().map(Vec::len),
        Some(PARTITIONS),
        "lag per partition: {}",
        detail["partitions"]
    );
    assert!(
        detail["explain"]
            .as_str()
            .unwrap_or_default()
            .contains("stage")
    );
    let (status, body) = http(port, "GET", "/api/queries/local/qnope", None);
    assert_eq!(status, 404, "{body}");
    let (status, body) = http(port, "POST", &format!("/api/queries/{id}/start"), None);
    assert_eq!(
        status, 400,
        "a local query is started by running it: {body}"
    );

    // The browser: the graph, and numbers that change between two loads.
    let browser = Browser::start();
    let page = format!("http://127.0.0.1:{port}/#/q/{id}");
    browser.goto(&page);
    let mut shown: Vec<String> =
        serde_json::from_value(browser.wait_for(60, "the stage graph", GRAPH_STAGES)).unwrap();
    shown.sort();
    assert_eq!(shown, planned, "the page draws the plan's stages");
    let first = (
        browser.wait_for(60, "a lag", &number_of("lag")),
        browser.wait_for(60, "events/s", &number_of("events-per-s")),
    );
    browser.wait_for(
        60,
        "a checkpoint in the table",
        "return document.querySelector('#checkpoints-table tbody tr') !== null",
    );
    let started = Instant::now();
    loop {
        browser.goto(&page);
        let lag = browser.wait_for(60, "a lag", &number_of("lag"));
        let rate = browser.wait_for(60, "events/s", &number_of("events-per-s"));
        if lag != first.0 && rate != first.1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "lag and events/s did not both change between loads in 120 s: first {first:?}, \
             now ({lag}, {rate})"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Rows flow on every edge, stages know their watermark, and the
    // charts have a few points: then the page is worth a picture.
    browser.wait_for(120, "rows per second on every edge", EDGES_FLOWING);
    browser.wait_for(
        60,
        "a stage's watermark",
        "return [...document.querySelectorAll('#graph g.node text')].some(t => /behind$/.test(t.textContent))",
    );
    browser.wait_for(
        120,
        "three points of history",
        "return document.querySelector('#chart-events polyline')?.points.numberOfItems >= 3",
    );
    // The windowed query's one group, at --group-size 2, over time.
    browser.wait_for(
        60,
        "the group's members charted",
        "return document.querySelector('#chart-members polyline') !== null \
         && document.querySelector('#chart-members text.last')?.textContent === 'now 2'",
    );
    browser.screenshot(&screenshot_dir().join("query-local.png"));
    browser.goto(&format!("http://127.0.0.1:{port}/#/"));
    browser.wait_for(
        60,
        "the query running in the list",
        &format!("return document.querySelector('tr.query[data-id=\"{id}\"]')?.dataset.state === 'running'"),
    );
    browser.screenshot(&screenshot_dir().join("queries.png"));

    // Stopped: SIGTERM commits the epoch in flight and exits 0.
    stop_producing.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    let pid = run.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let out = common::wait_with_timeout(run.take(), Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    browser.wait_for(
        30,
        "the query stopped in the list",
        &format!("return document.querySelector('tr.query[data-id=\"{id}\"]')?.dataset.state === 'stopped'"),
    );
    let after = get_json(port, &format!("/api/queries/{id}"));
    assert_eq!(after["state"], "stopped", "{after}");
    browser.goto(&page);
    browser.wait_for(
        30,
        "the query stopped on its page",
        "return document.getElementById('state')?.dataset.state === 'stopped'",
    );
    let _ = std::fs::remove_dir_all(&work);
}

/// GET `path` until `ready` picks something out of it.
fn wait_json(
    port: u16,
    path: &str,
    secs: u64,
    what: &str,
    mut ready: impl FnMut(&Value) -> Option<Value>,
) -> Value {
    let started = Instant::now();
    loop {
        let v = get_json(port, path);
        if let Some(got) = ready(&v) {
            return got;
        }
        assert!(
            started.elapsed() < Duration::from_secs(secs),
            "no {what} at {path} within {secs} s: {v}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn skein_aws(store: &str, args: &[&str]) -> String {
    let (ok, stdout, stderr) = common::skein_on_aws(Some(store), args);
    assert!(ok, "skein {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}

#[test]
fn the_page_shows_a_standing_query_on_lambda_and_stops_and_starts_it() {
    common::require_aws();
    let work = std::env::temp_dir().join(common::unique_name("skein-ui-lambda"));
    std::fs::create_dir_all(&work).unwrap();
    let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 300);
    let (_, sink) = windowed::kafka_sink();
    let sql = work.join("q.sql");
    std::fs::write(&sql, windowed::query(&source, &sink)).unwrap();
    let sql_path = sql.to_str().unwrap();
    let stages = planned_stages(&sql, "2");
    let store = format!("s3://{}", common::unique_name("skein-ui"));
    let deployed: Value = serde_json::from_str(
        skein_aws(
            &store,
            &[
                "deploy",
                sql_path,
                "--backend",
                "lambda",
                "--group-size",
                "2",
                "--json",
            ],
        )
        .trim(),
    )
    .expect("deploy --json");
    let code = deployed["query_code"]
        .as_str()
        .expect("query_code")
        .to_string();
    let stop_producing = Arc::new(AtomicBool::new(false));
    let producer = keep_producing(topic, stop_producing.clone());
    let (_ui, port) = start_ui(&work.join("none"), Some(&store));
    let id = format!("lambda/{code}");

    // Listed running once a tick of its driver has committed.
    let row = wait_json(
        port,
        "/api/queries",
        240,
        "the Lambda query committed",
        |v| {
            let q = v["queries"]
                .as_array()?
                .iter()
                .find(|q| q["id"] == id.as_str())?
                .clone();
            (q["state"] == "running" && q["committed_epoch"].is_u64()).then_some(q)
        },
    );
    assert_eq!(row["backend"], "lambda", "{row}");
    let detail = get_json(port, &format!("/api/queries/{id}"));
    assert_eq!(detail["schedule"], "ENABLED", "{detail}");
    assert_eq!(detail["controls"], true, "{detail}");

    let browser = Browser::start();
    let page = format!("http://127.0.0.1:{port}/#/q/{id}");
    browser.goto(&page);
    let mut shown: Vec<String> =
        serde_json::from_value(browser.wait_for(60, "the stage graph", GRAPH_STAGES)).unwrap();
    shown.sort();
    let mut planned = stages;
    planned.sort();
    assert_eq!(shown, planned, "the page draws the plan's stages");
    browser.wait_for(60, "a lag", &number_of("lag"));
    browser.wait_for(
        120,
        "invocation times of a stage",
        "return [...document.querySelectorAll('#graph g.node text')].some(t => /p50 [0-9]/.test(t.textContent))",
    );
    browser.wait_for(120, "rows per second on every edge", EDGES_FLOWING);
    browser.wait_for(
        120,
        "two points of history",
        "return document.querySelector('#chart-events polyline')?.points.numberOfItems >= 2",
    );
    browser.screenshot(&screenshot_dir().join("query-lambda.png"));

    // Stop and start with the page's buttons: what `skein stop`/`start` do.
    browser.eval("document.getElementById('stop').click(); return true;");
    browser.accept_dialog();
    browser.wait_for(
        60,
        "the query stopped",
        "return document.getElementById('state')?.dataset.state === 'stopped'",
    );
    let status: Value = serde_json::from_str(
        skein_aws(&store, &["status", &code, "--backend", "lambda", "--json"]).trim(),
    )
    .unwrap();
    assert_eq!(
        status["schedule"], "DISABLED",
        "skein status agrees: {status}"
    );
    browser.wait_for(
        30,
        "a start button",
        "return document.getElementById('start')?.disabled === false",
    );
    browser.eval("document.getElementById('start').click(); return true;");
    browser.accept_dialog();
    browser.wait_for(
        60,
        "the query running again",
        "return document.getElementById('state')?.dataset.state === 'running'",
    );
    assert_eq!(
        get_json(port, &format!("/api/queries/{id}"))["schedule"],
        "ENABLED"
    );

    // The same through the API, as a script would.
    for (action, state) in [("stop", "DISABLED"), ("start", "ENABLED")] {
        let (status, body) = http(port, "POST", &format!("/api/queries/{id}/{action}"), None);
        assert_eq!(status, 200, "POST {action}: {body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["state"], state, "{answer}");
        assert_eq!(
            get_json(port, &format!("/api/queries/{id}"))["schedule"],
            state
        );
    }

    stop_producing.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    skein_aws(&store, &["destroy", &code, "--purge"]);
    let _ = std::fs::remove_dir_all(&work);
}

/// Set the editor's SQL and press one of its buttons.
fn editor_run(browser: &Browser, sql: &str, button: &str) {
    let sql = serde_json::to_string(sql).unwrap();
    // As many rows and seconds as the page takes: the test ends a preview.
    browser.eval(&format!(
        "document.getElementById('sql').value = {sql}; \
         document.getElementById('preview-rows').value = '10000'; \
         document.getElementById('preview-seconds').value = '300'; \
         document.getElementById('{button}').click(); return true;"
    ));
}

/// Wait until the preview table's counts add up to `want`.
fn wait_preview_total(browser: &Browser, want: i64, what: &str) {
    browser.wait_for(
        120,
        what,
        &format!(
            "const r = (() => {{ {PREVIEW_COUNTS} }})(); \
             return r && r.reduce((s, x) => s + x[1], 0) === {want};"
        ),
    );
}

/// The preview table's rows as (key, count), or null while it has none.
const PREVIEW_COUNTS: &str = "const rows = [...document.querySelectorAll('#preview-rows tbody tr')]\
    .map(tr => [...tr.children].map(td => td.textContent)); \
    return rows.length ? rows.map(r => [r[1], Number(r[2])]) : null;";

#[test]
fn the_editor_explains_and_previews_queries_on_a_live_topic() {
    let work = std::env::temp_dir().join(common::unique_name("skein-ui-editor"));
    let root = work.join("checkpoints");
    std::fs::create_dir_all(&root).unwrap();
    let (topic, source) = windowed::empty_kafka_table(1, 500);
    let updating = format!("{source}\nSELECT k, count(*) AS n FROM ev GROUP BY k;\n");
    let windowed_sql = format!(
        "{source}\nSELECT tumble(ts, INTERVAL '1' SECOND) AS w, k, count(*) AS n FROM ev \
         GROUP BY tumble(ts, INTERVAL '1' SECOND), k;\n"
    );
    let (_ui, port) = start_ui(&root, None);

    // The API: a plan, and a planning error with the line it names.
    let (status, body) = http(
        port,
        "POST",
        "/api/explain",
        Some(&serde_json::json!({ "sql": updating })),
    );
    assert_eq!(status, 200, "{body}");
    let plan: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(plan["updates"], true, "{plan}");
    let stages = plan["stages"].as_array().expect("stages").len();
    let (status, body) = http(
        port,
        "POST",
        "/api/explain",
        Some(&serde_json::json!({ "sql": "SELECT k\nFROM ev WHERE\nGROUP k" })),
    );
    assert_eq!(status, 400, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(
        error["error"].as_str().is_some_and(|e| !e.contains('\n')),
        "{error}"
    );
    assert_eq!(error["line"], 3, "the line the parser names: {error}");
    let (status, body) = http(
        port,
        "POST",
        "/api/preview",
        Some(&serde_json::json!({ "sql": "SELECT * FROM no_such_table" })),
    );
    assert_eq!(status, 400, "an unknown table is one clear error: {body}");

    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{port}/#/editor"));
    browser.wait_for(30, "the editor", "return !!document.getElementById('sql')");

    // Explain: the stages of the plan, each with its mode.
    editor_run(&browser, &updating, "explain");
    let shown = browser.wait_for(
        60,
        "the plan's stages",
        "const r = document.querySelectorAll('#plan-stages tbody tr'); return r.length || null;",
    );
    assert_eq!(shown, stages, "the page lists the plan's stages");
    browser.wait_for(
        10,
        "an updating stage",
        "return [...document.querySelectorAll('#plan-stages td')].some(td => td.textContent === 'updating')",
    );

    // Preview of the updating query: counts that are taken back and
    // replaced as records arrive, one row per key.
    editor_run(&browser, &updating, "preview");
    browser.wait_for(
        60,
        "the preview running",
        "return document.getElementById('preview-status').textContent.startsWith('Running')",
    );
    let (records, _) = windowed::records(2_000, 1, 1_000);
    let mut expected: std::collections::BTreeMap<String, i64> = Default::default();
    for round in records.chunks(1_000) {
        windowed::produce(&topic, round);
        for (_, json) in round {
            let v: Value = serde_json::from_str(json).unwrap();
            *expected
                .entry(v["k"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        // Each round shows before the next is produced.
        wait_preview_total(
            &browser,
            expected.values().sum::<i64>(),
            "the round's counts",
        );
    }
    let shown: Vec<(String, i64)> =
        serde_json::from_value(browser.eval(PREVIEW_COUNTS)).expect("preview rows");
    let shown: std::collections::BTreeMap<String, i64> = shown.into_iter().collect();
    assert_eq!(shown, expected, "one row per key, at its count");
    browser.screenshot(&screenshot_dir().join("editor.png"));
    browser.eval("document.getElementById('stop-preview').click(); return true;");

    // Preview of a windowed query: windows show as event time passes them.
    editor_run(&browser, &windowed_sql, "preview");
    browser.wait_for(
        60,
        "the preview running",
        "return document.getElementById('preview-status').textContent.startsWith('Running')",
    );
    // Read from the latest offsets: only these, over 5 s of event time.
    let (later, _) = windowed::records(1_000, 1, 5_000);
    windowed::produce(&topic, &later);
    browser.wait_for(
        120,
        "closed windows",
        "return document.querySelectorAll('#preview-rows tbody tr').length > 0",
    );
    let _ = std::fs::remove_dir_all(&work);
}
