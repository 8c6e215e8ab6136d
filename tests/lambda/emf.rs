//! The embedded-metric-format lines a function writes reach its log on
//! ministack: a query with a Redis lookup join runs with `skein run
//! --backend lambda`, then the functions' CloudWatch Logs groups
//! (`/aws/lambda/<function>`) are read back. Every EMF document there must
//! be well formed, and what they count must add up to what the run reports.

use crate::common;

use std::collections::BTreeMap;

use serde_json::Value;
use skein::report::Report;

/// Every log line of every function of `query_code`, by function name.
async fn function_logs(query_code: &str) -> BTreeMap<String, Vec<String>> {
    let config = common::aws_sdk_config().await;
    let logs = aws_sdk_cloudwatchlogs::Client::new(&config);
    let prefix = format!("/aws/lambda/{query_code}-");
    let groups = logs
        .describe_log_groups()
        .log_group_name_prefix(&prefix)
        .send()
        .await
        .expect("DescribeLogGroups");
    let mut out = BTreeMap::new();
    for group in groups.log_groups() {
        let name = group.log_group_name().expect("a group name");
        let mut lines = vec![];
        let mut token = None;
        loop {
            let page = logs
                .filter_log_events()
                .log_group_name(name)
                .set_next_token(token)
                .send()
                .await
                .expect("FilterLogEvents");
            lines.extend(
                page.events()
                    .iter()
                    .filter_map(|e| e.message().map(str::to_string)),
            );
            token = page.next_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        let function = name.trim_start_matches("/aws/lambda/").to_string();
        out.insert(function, lines);
    }
    out
}

/// Checks one EMF document against the specification's shape; returns it.
fn emf_document(function: &str, line: &str) -> Value {
    let doc: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let cw = &doc["_aws"];
    assert!(cw["Timestamp"].as_i64().is_some_and(|t| t > 0), "{line}");
    let defs = cw["CloudWatchMetrics"]
        .as_array()
        .expect("CloudWatchMetrics");
    assert_eq!(defs.len(), 1, "{line}");
    assert_eq!(defs[0]["Namespace"], "Skein", "{line}");
    for dims in defs[0]["Dimensions"].as_array().expect("Dimensions") {
        for d in dims.as_array().expect("a dimension set") {
            let d = d.as_str().expect("a dimension name");
            assert!(doc[d].is_string(), "dimension {d} has no value: {line}");
        }
    }
    let metrics = defs[0]["Metrics"].as_array().expect("Metrics");
    assert!(!metrics.is_empty(), "{line}");
    for m in metrics {
        let name = m["Name"].as_str().expect("a metric name");
        assert!(m["Unit"].is_string(), "{line}");
        let value = &doc[name];
        let numbers = value.is_number()
            || value
                .as_array()
                .is_some_and(|v| !v.is_empty() && v.iter().all(Value::is_number));
        assert!(numbers, "{name} has no value: {line}");
    }
    assert_eq!(doc["function_name"], function, "{line}");
    doc
}

/// The sum of `name` over the documents whose labels include `labels`.
fn total(docs: &[Value], name: &str, labels: &[(&str, &str)]) -> f64 {
    docs.iter()
        .filter(|d| labels.iter().all(|(k, v)| d[*k] == *v))
        .filter_map(|d| match &d[name] {
            Value::Array(values) => Some(values.len() as f64),
            v => v.as_f64(),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn functions_write_emf_lines_to_their_logs() {
    let store = format!("s3://{}", common::unique_name("skein-lambda-emf"));
    // The sellers' prefix makes the query text, so its code and functions, new.
    let sellers = common::sellers::declare("emf-lookup", 1100);
    let sql = format!(
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid'
           OPTIONS ('events' '3000', 'rate' '1000', 'partitions' '2', 'event_time' 'date_time');
         {sellers}
         SELECT s.seller, count(*) AS bids FROM bid b LEFT JOIN sellers s ON b.auction = s.id
         GROUP BY s.seller"
    );
    let file = std::env::temp_dir().join(format!("{}.sql", common::unique_name("emf")));
    std::fs::write(&file, sql).unwrap();
    let file = file.display().to_string();
    let args = [
        "run",
        file.as_str(),
        "--backend",
        "lambda",
        "--group-size",
        "2",
        "--epochs",
        "3",
        "--json",
    ];
    let (ok, stdout, stderr) = common::skein_on_aws(Some(&store), &args);
    assert!(ok, "skein run failed:\n{stdout}\n{stderr}");
    let report: Report = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON report in {stdout}"));
    let code = report.query_code.as_str();
    let events = report.events as f64;
    assert!(events > 0.0, "{report:?}");

    let logs_by_function = function_logs(code).await;
    assert!(
        logs_by_function.len() >= 2,
        "no log groups of {code}'s functions: {logs_by_function:?}"
    );
    let mut docs = vec![];
    for (function, lines) in &logs_by_function {
        docs.extend(
            lines
                .iter()
                .filter(|l| l.starts_with("{\"_aws\""))
                .map(|l| emf_document(function, l)),
        );
    }
    // Each record pulled is counted once, by the function that pulled it.
    let pulled = total(&docs, "skein_source_records_total", &[("table", "bid")]);
    assert_eq!(pulled, events, "records in EMF vs the run's report");
    assert!(
        total(&docs, "skein_invocations_total", &[]) > 0.0,
        "no invocations in {docs:?}"
    );
    // The lookup join ran in the source functions, which fetched from Redis.
    let sellers = [("table", "sellers")];
    let requests = total(&docs, "skein_lookup_requests_total", &sellers);
    assert!(requests > 0.0, "no lookup requests in {docs:?}");
    assert_eq!(
        total(&docs, "skein_lookup_request_seconds", &sellers),
        requests,
        "one duration per request"
    );
    let misses = total(&docs, "skein_lookup_cache_misses_total", &sellers);
    let not_found = total(&docs, "skein_lookup_not_found_total", &sellers);
    assert!(misses >= requests && not_found > 0.0 && not_found < misses);
    common::skein_on_aws(Some(&store), &["destroy", &file]);
    // Destroying functions leaves their logs, as on AWS: drop them here.
    let logs = aws_sdk_cloudwatchlogs::Client::new(&common::aws_sdk_config().await);
    for function in logs_by_function.keys() {
        let _ = logs
            .delete_log_group()
            .log_group_name(format!("/aws/lambda/{function}"))
            .send()
            .await;
    }
}
