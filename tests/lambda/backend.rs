//! The Lambda backend end to end on ministack: `skein deploy / run / status /
//! destroy --backend lambda` as a user runs them, with the real
//! `skein-function` binary as every function's bootstrap. Results must equal
//! single-process DataFusion and the in-process backend on the same input,
//! in as many rows as a count computed here from the generated events.

use crate::common;

use std::time::Duration;

use serde_json::{Value, json};
use skein::report::Report;
use skein_engine::EngineError;
use skein_engine::invoke::{InvocationType, Invoker, invoke_with_retry};
use skein_generators::nexmark::{Event, NexmarkConfig, NexmarkGenerator};
use skein_lambda::LambdaInvoker;

/// Runs the CLI against ministack with its own bucket; returns stdout, or
/// fails the test with stderr.
fn skein(store: &str, args: &[&str]) -> String {
    let (ok, stdout, stderr) = common::skein_on_aws(Some(store), args);
    assert!(ok, "skein {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}

/// The last JSON line of `text`, read into `T`: the report a command
/// printed, or a `Value` where the command prints an object of its own
/// (`deploy`, `status` without a query).
fn json_line<T: serde::de::DeserializeOwned>(text: &str) -> T {
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in {text:?}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

fn write_sql(name: &str, sql: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}.sql", common::unique_name(name)));
    std::fs::write(&path, sql).expect("writing the query");
    path.display().to_string()
}

fn nexmark_tables(events: u64, partitions: usize) -> String {
    ["person", "auction", "bid"]
        .iter()
        .map(|t| {
            format!(
                "CREATE EXTERNAL TABLE {t} STORED AS NEXMARK LOCATION '{t}' OPTIONS ('events' '{events}', \
                 'rate' '1000', 'partitions' '{partitions}', 'event_time' 'date_time');"
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first `events` events of the generator NEXMark tables read at
/// `rate` events per second of event time (seed 0).
fn nexmark_events(events: u64, rate: u64) -> Vec<Event> {
    NexmarkGenerator::new(NexmarkConfig {
        first_event_rate: rate,
        max_events: Some(events),
        ..Default::default()
    })
    .expect("generator")
    .into_events()
    .collect()
}

/// Runs `file` on Lambda and in-process; both must verify, with the same
/// rows, and as many as `expected_rows`: a count the test computed from
/// the generated events without the planner or DataFusion.
fn run_both(
    store: &str,
    file: &str,
    group_size: &str,
    epochs: &str,
    expected_rows: usize,
) -> (Report, Report) {
    let common_args = [
        "--group-size",
        group_size,
        "--epochs",
        epochs,
        "--verify",
        "--json",
    ];
    let mut lambda_args = vec!["run", file, "--backend", "lambda"];
    lambda_args.extend(common_args);
    let on_lambda: Report = json_line(&skein(store, &lambda_args));
    let mut local_args = vec!["run", file];
    local_args.extend(common_args);
    let local: Report = json_line(&skein(store, &local_args));
    assert_eq!(on_lambda.verified, Some(true), "{on_lambda:?}");
    assert_eq!(local.verified, Some(true), "{local:?}");
    assert_eq!(
        on_lambda.result_rows, local.result_rows,
        "lambda {on_lambda:?} local {local:?}"
    );
    assert_eq!(
        on_lambda.events, local.events,
        "lambda {on_lambda:?} local {local:?}"
    );
    assert_eq!(
        on_lambda.functions, local.functions,
        "lambda {on_lambda:?} local {local:?}"
    );
    assert!(expected_rows > 0, "a reference with no rows proves little");
    assert_eq!(
        on_lambda.result_rows, expected_rows,
        "rows computed from the generated events: {on_lambda:?}"
    );
    (on_lambda, local)
}

/// A shuffling group-by over a group of 4, fed by 4 source instances at once
/// (so every member, at reserved concurrency 1, is throttled and retried),
/// with a filter literal large enough that the source contexts pass Lambda's
/// 4 KB environment limit and must be read back from S3. Then destroy.
#[tokio::test(flavor = "multi_thread")]
async fn shuffled_group_by_on_lambda() {
    let store = format!("s3://{}", common::unique_name("skein-lambda-shuffle"));
    // Random hex does not compress: the context cannot fit in 4 KB.
    let literal: String = (0..6000)
        .map(|_| format!("{:x}", rand::random::<u8>() % 16))
        .collect();
    let sql = format!(
        "{}\nSELECT auction, count(*) AS bids, max(price) AS top FROM bid WHERE channel <> '{literal}' GROUP BY auction",
        nexmark_tables(4000, 4)
    );
    let file = write_sql("shuffle", &sql);

    let deployed: Value = json_line(&skein(
        &store,
        &[
            "deploy",
            &file,
            "--backend",
            "lambda",
            "--group-size",
            "4",
            "--json",
        ],
    ));
    let code = deployed["query_code"]
        .as_str()
        .expect("query_code")
        .to_string();
    let functions = deployed["functions"].as_array().expect("functions").clone();
    assert!(
        functions.iter().any(|f| f["spilled"] == Value::Bool(true)),
        "no context was spilled: {deployed}"
    );

    // Group members reserve concurrency 1 on Lambda itself.
    let lambda = aws_sdk_lambda::Client::new(&common::aws_sdk_config().await);
    let members: Vec<&str> = functions
        .iter()
        .filter(|f| f["concurrency"] == 1)
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert!(members.len() >= 4, "{deployed}");
    for m in &members {
        let c = lambda
            .get_function_concurrency()
            .function_name(*m)
            .send()
            .await
            .expect("GetFunctionConcurrency");
        assert_eq!(c.reserved_concurrent_executions(), Some(1), "{m}");
    }

    // One row per auction that has bids (no channel equals the literal).
    let auctions: std::collections::BTreeSet<i64> = nexmark_events(4000, 1000)
        .iter()
        .filter_map(|e| match e {
            Event::Bid(b) => Some(b.auction),
            _ => None,
        })
        .collect();
    let (on_lambda, _) = run_both(&store, &file, "4", "3", auctions.len());
    assert_eq!(on_lambda.query_code, code);
    assert!(
        on_lambda.lambda.as_ref().map_or(0, |l| l.spilled_contexts) > 0,
        "{on_lambda:?}"
    );

    throttles_are_retried_not_lost(&lambda, &code).await;
    corrupt_payload_is_an_error_naming_uuid_and_stage(&code).await;
    poisoned_async_payload_ends_as_a_dead_letter(&store, &code).await;

    // The stage functions and the query's dead-letter function.
    let status: Value = json_line(&skein(&store, &["status", "--json"]));
    assert_eq!(
        status["queries"][&code].as_array().map(Vec::len),
        Some(functions.len() + 1),
        "{status}"
    );
    skein(&store, &["destroy", &file]);
    let status: Value = json_line(&skein(&store, &["status", "--json"]));
    assert!(
        status["queries"].get(&code).is_none(),
        "functions left behind: {status}"
    );
    let left = lambda.list_functions().send().await.expect("ListFunctions");
    assert!(
        !left
            .functions()
            .iter()
            .filter_map(|f| f.function_name())
            .any(|n| n.starts_with(&code)),
        "functions of {code} left behind"
    );
}

/// A windowed aggregate (NEXMark q7: the highest bid per 10 s tumbling
/// window) over several epochs: window state lives in warm function
/// instances across invocations.
#[tokio::test(flavor = "multi_thread")]
async fn windowed_aggregate_on_lambda() {
    let store = format!("s3://{}", common::unique_name("skein-lambda-window"));
    let query = std::fs::read_to_string(common::repo_path("queries/nexmark/q7.sql")).expect("q7");
    let file = write_sql("q7", &format!("{}\n{query}", nexmark_tables(6000, 2)));
    let q7 = common::nexmark_reference::q7(&nexmark_events(6000, 1000));
    run_both(&store, &file, "2", "4", q7.len());
    skein(&store, &["destroy", &file]);
}

/// A windowed aggregate with every edge invoked with `Event`: the run ends
/// when the last stage has written the last epoch, and reports what the
/// in-process run reports. Every receiver has one sender (one source
/// partition, groups of 1, no join): ministack, unlike Lambda, dead-letters
/// an async event still throttled after its two retries, and q7's join (two
/// stages into one receiver at concurrency 1) lost one that way now and then.
#[tokio::test(flavor = "multi_thread")]
async fn async_edges_on_lambda() {
    let store = format!("s3://{}", common::unique_name("skein-lambda-async"));
    let query = "SELECT tumble(date_time, INTERVAL '10' SECOND) AS window_start, auction, \
                 count(*) AS bids, max(price) AS top FROM bid \
                 GROUP BY tumble(date_time, INTERVAL '10' SECOND), auction";
    let file = write_sql(
        "tumble-async",
        &format!("{}\n{query}", nexmark_tables(6000, 1)),
    );
    let args = [
        "--group-size",
        "1",
        "--epochs",
        "4",
        "--invoke-async",
        "--verify",
        "--json",
    ];
    let mut lambda_args = vec!["run", file.as_str(), "--backend", "lambda"];
    lambda_args.extend(args);
    let on_lambda: Report = json_line(&skein(&store, &lambda_args));
    let mut local_args = vec!["run", file.as_str()];
    local_args.extend(args);
    let local: Report = json_line(&skein(&store, &local_args));
    assert_eq!(on_lambda.verified, Some(true), "{on_lambda:?}");
    assert_eq!(
        on_lambda.lambda.as_ref().map(|l| l.dead_letters),
        Some(0),
        "{on_lambda:?}"
    );
    let figures = |r: &Report| {
        [
            ("result_rows", r.result_rows as u64),
            ("events", r.events),
            ("functions", r.functions as u64),
            ("stages", r.stages as u64),
            ("epochs", r.epochs),
        ]
    };
    for ((key, lambda), (_, local_figure)) in figures(&on_lambda).into_iter().zip(figures(&local)) {
        assert_eq!(
            lambda, local_figure,
            "{key}: lambda {on_lambda:?} local {local:?}"
        );
    }
    assert!(on_lambda.result_rows > 0, "{on_lambda:?}");
    skein(&store, &["destroy", &file]);
}

/// A source function limited to one instance and triggered four times at
/// once: raw calls are throttled (429 -> EngineError::Throttled), and with
/// `invoke_with_retry` every one of them is served.
async fn throttles_are_retried_not_lost(lambda: &aws_sdk_lambda::Client, code: &str) {
    let source = format!("{code}-01-00");
    lambda
        .put_function_concurrency()
        .function_name(&source)
        .reserved_concurrent_executions(1)
        .send()
        .await
        .expect("PutFunctionConcurrency");
    let invoker = LambdaInvoker::new(&common::aws_sdk_config().await);
    let trigger = json!({"trigger": {"qid": code, "epoch": 2, "last": true}})
        .to_string()
        .into_bytes();
    let mut throttled = 0;
    for _round in 0..3 {
        let calls = (0..4).map(|_| invoker.invoke(&source, trigger.clone(), InvocationType::Sync));
        for r in futures::future::join_all(calls).await {
            match r {
                Ok(_) => {}
                Err(EngineError::Throttled { .. }) => throttled += 1,
                Err(e) => panic!("{source}: {e}"),
            }
        }
        if throttled > 0 {
            break;
        }
    }
    assert!(
        throttled > 0,
        "four concurrent calls to {source} at concurrency 1 were never throttled"
    );
    let calls = (0..4).map(|_| {
        invoke_with_retry(
            &invoker,
            &source,
            trigger.clone(),
            InvocationType::Sync,
            Duration::from_millis(500),
            100,
        )
    });
    for r in futures::future::join_all(calls).await {
        r.unwrap_or_else(|e| panic!("{source} with retries: {e}"));
    }
}

/// A poisoned payload sent asynchronously (Event): Lambda retries it, then
/// hands it to the query's dead-letter function, and `skein status` counts it.
async fn poisoned_async_payload_ends_as_a_dead_letter(store: &str, code: &str) {
    let member = format!("{code}-02-01");
    let invoker = LambdaInvoker::new(&common::aws_sdk_config().await);
    let poisoned = json!({
        "uuid": {"qid": "poison-async", "seq_num": 0, "seq_len": 4},
        "epoch": 0, "shuffle_id": 1, "encoding": "zstd", "data": "AAAA"
    });
    invoker
        .invoke(
            &member,
            poisoned.to_string().into_bytes(),
            InvocationType::Async,
        )
        .await
        .unwrap_or_else(|e| panic!("Event invoke of {member}: {e}"));
    let counted = common::within(90, "waiting for the dead letter", async {
        loop {
            let status: Value = json_line(&skein(store, &["status", "--json"]));
            if let Some(n) = status["dead_letters"][code].as_u64() {
                break n;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    assert_eq!(counted, 1);
}

/// A corrupt payload comes back as a function error naming the payload's
/// uuid and the stage; the function keeps serving.
async fn corrupt_payload_is_an_error_naming_uuid_and_stage(code: &str) {
    let member = format!("{code}-02-00");
    let invoker = LambdaInvoker::new(&common::aws_sdk_config().await);
    let corrupt = json!({
        "uuid": {"qid": "poison", "seq_num": 0, "seq_len": 4},
        "epoch": 0, "shuffle_id": 1, "encoding": "zstd", "data": "%%% not base64"
    });
    let err = invoker
        .invoke(
            &member,
            corrupt.to_string().into_bytes(),
            InvocationType::Sync,
        )
        .await
        .expect_err("a corrupt payload must fail");
    let text = err.to_string();
    assert!(text.contains(&member) && text.contains("poison"), "{text}");
    let probe = invoker
        .invoke(
            &member,
            br#"{"probe": true}"#.to_vec(),
            InvocationType::Sync,
        )
        .await;
    assert!(probe.is_ok(), "{member} stopped serving: {probe:?}");
}
