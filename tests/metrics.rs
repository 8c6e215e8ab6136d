//! `skein run --metrics ADDR` serves Prometheus text while the query runs.
//! Uses the built-in NEXMark generator: no external service.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The value of the first sample of `name` whose labels contain `label`.
fn sample(body: &str, name: &str, label: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_running_query_serves_its_metrics() {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let sql = std::env::temp_dir().join(format!("{}.sql", common::unique_name("metrics")));
    // 2 s of event time per second of wall time: windows close while it runs.
    std::fs::write(
        &sql,
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid'
           OPTIONS ('rate' '2000', 'partitions' '2', 'events_per_epoch' '400', 'event_time' 'date_time');
         SELECT tumble(date_time, INTERVAL '1' SECOND) AS w, count(*) AS n FROM bid GROUP BY 1",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args([
            "run",
            sql.to_str().unwrap(),
            "--duration",
            "20s",
            "--interval",
            "100ms",
            "--json",
        ])
        .args(["--group-size", "2", "--metrics", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start skein");
    let started = Instant::now();
    let mut body = None;
    // Scrape until the windowed stage has reported its state and watermark.
    while started.elapsed() < Duration::from_secs(18) {
        std::thread::sleep(Duration::from_millis(500));
        if let Some(b) = common::scrape(&addr)
            && b.contains("skein_watermark_delay_seconds")
            && b.contains("skein_sink_rows_total")
        {
            body = Some(b);
            break;
        }
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let body = body.unwrap_or_else(|| {
        panic!(
            "no complete metrics from {addr}; stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
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
}
