//! `skein run --metrics ADDR` serves Prometheus text while the query runs.
//! Uses the built-in NEXMark generator; the lookup join's test also the
//! real Redis.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

/// The value of the first sample of `name` whose labels contain `label`.
fn sample(body: &str, name: &str, label: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Runs `sql` with `skein run --metrics` and scrapes until `complete`
/// holds for the body (the child is killed then); fails with skein's
/// stderr if it exits first. The run's bound and the patience are hang
/// guards: the test waits for the metrics, not for the clock.
fn scrape_while_running(name: &str, sql: &str, complete: impl Fn(&str) -> bool) -> String {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let file = std::env::temp_dir().join(format!("{}.sql", common::unique_name(name)));
    std::fs::write(&file, sql).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args([
            "run",
            file.to_str().unwrap(),
            "--duration",
            "10m",
            "--interval",
            "100ms",
            "--json",
        ])
        .args(["--group-size", "2", "--metrics", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start skein");
    let what = format!("complete metrics from {addr}");
    let body = common::wait_until(&mut child, Duration::from_secs(300), &what, || {
        common::scrape(&addr).filter(|b| complete(b))
    });
    let _ = child.kill();
    let _ = child.wait();
    body
}

#[test]
fn a_running_query_serves_its_metrics() {
    // 2 s of event time per second of wall time: windows close while it runs.
    let sql = "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid'
           OPTIONS ('rate' '2000', 'partitions' '2', 'events_per_epoch' '400', 'event_time' 'date_time');
         SELECT tumble(date_time, INTERVAL '1' SECOND) AS w, count(*) AS n FROM bid GROUP BY 1";
    // Scrape until the windowed stage has reported its state and watermark.
    let body = scrape_while_running("metrics", sql, |b| {
        b.contains("skein_watermark_delay_seconds") && b.contains("skein_sink_rows_total")
    });
    for name in [
        "skein_source_records_total",
        "skein_invocations_total",
        "skein_payload_bytes_total",
        "skein_state_bytes",
        "skein_epoch_duration_seconds_bucket",
        "skein_sink_writes_total",
    ] {
        assert!(body.contains(name), "{name} missing from:\n{body}");
    }
    let records = sample(&body, "skein_source_records_total", "partition=\"0\"").unwrap();
    assert!(records > 0.0, "partition 0 records: {records}\n{body}");
    let epochs = sample(&body, "skein_epochs_total", "").unwrap();
    assert!(epochs >= 1.0, "{body}");
    // Every series names its query: the code, and the name (the file's stem).
    let stem = body
        .lines()
        .find(|l| l.starts_with("skein_epochs_total"))
        .unwrap();
    assert!(
        stem.contains("query=\"q") && stem.contains("query_name=\"metrics-"),
        "{stem}"
    );
}

/// Bids joined with their auction's seller in Redis (`SET <p>:auction:<id>`
/// for some of the auctions): the cache answers repeated auctions, the
/// rest are fetched, and the auctions without a key are not found.
#[test]
fn a_lookup_join_counts_its_cache_and_requests() {
    let sellers = common::sellers::declare("metrics-lookup", 1200);
    let sql = format!(
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid'
           OPTIONS ('rate' '2000', 'partitions' '2', 'events_per_epoch' '400', 'event_time' 'date_time');
         {sellers}
         SELECT b.auction, s.seller FROM bid b LEFT JOIN sellers s ON b.auction = s.id"
    );
    let table = "table=\"sellers\"";
    let body = scrape_while_running("metrics-lookup", &sql, |b| {
        sample(b, "skein_lookup_cache_hits_total", table).is_some_and(|n| n > 0.0)
            && sample(b, "skein_lookup_not_found_total", table).is_some_and(|n| n > 0.0)
    });
    let requests = sample(&body, "skein_lookup_requests_total", table).unwrap();
    let misses = sample(&body, "skein_lookup_cache_misses_total", table).unwrap();
    let not_found = sample(&body, "skein_lookup_not_found_total", table).unwrap();
    assert!(requests >= 1.0, "{body}");
    // Each request asks for at least one key; some of them have no key.
    assert!(misses >= requests && not_found < misses, "{body}");
    let timed = sample(&body, "skein_lookup_request_seconds_count", table).unwrap();
    assert_eq!(timed, requests, "one duration per request:\n{body}");
}
