//! A Redis outage in the middle of `skein ysb run`: Redis is stopped, kept
//! down until the run is retrying a write, and started again with its data
//! (append-only file); the run waits it out, retries the epoch's write and ends with
//! exact counts. The Redis server is this test's own (`redis-server` on a
//! free port), so the shared one on 6379 is never stopped.

use crate::common;

use crate::common::services::PrivateRedis;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A hang guard only: each wait has its own condition.
const HANG_GUARD: Duration = Duration::from_secs(300);

use serde_json::Value;
use skein_ysb::check::CheckReport;

fn ysb(cmd: &str, topic: &str, dir: &Path, redis: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_skein"));
    c.args(["ysb", cmd, "--topic", topic, "--seed", "43", "--json"])
        .arg("--dir")
        .arg(dir)
        .args(["--brokers", &common::kafka_brokers(), "--redis", redis])
        .args(extra)
        .env("RUST_BACKTRACE", "0");
    c
}

fn run_ok(mut c: Command) -> Value {
    let out = c.output().expect("running skein");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or(Value::Null)
}

#[test]
fn a_redis_outage_is_waited_out_and_the_counts_stay_exact() {
    common::require_kafka();
    let topic = common::unique_name("ysb-redis-outage");
    let dir = std::env::temp_dir().join(&topic);
    let data = dir.join("redis");
    std::fs::create_dir_all(&data).expect("temp dir");
    let mut redis = PrivateRedis::start(common::free_port(), &data);
    let url = redis.url();

    run_ok(ysb("setup", &topic, &dir, &url, &[]));
    let generated = run_ok(ysb("generate", &topic, &dir, &url, &["--events", "200000"]));
    // Small epochs, spaced out, so the run is still writing when Redis goes.
    let log = dir.join("run.log");
    let mut run = ysb(
        "run",
        &topic,
        &dir,
        &url,
        &["--max-records", "2000", "--interval", "200ms"],
    )
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(&log).expect("the run's log"))
    .spawn()
    .expect("ysb run");

    // Wait for a first committed epoch, then stop Redis until the run has
    // tried a write and is retrying it.
    let key = skein_sinks::redis::offsets_key(&format!("ysb:{topic}"));
    common::wait_until(&mut run, HANG_GUARD, "a first committed epoch", || {
        let fields: i64 = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("HLEN").arg(&key).query(&mut c))
            .unwrap_or(0);
        (fields > 0).then_some(())
    });
    redis.down();
    common::wait_until(
        &mut run,
        HANG_GUARD,
        "a retried write to the stopped Redis",
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("retrying").then_some(())
        },
    );
    redis.up();

    let out = common::wait_with_timeout(run, HANG_GUARD);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "ysb run failed: {stdout}{stderr}");
    assert!(
        stderr.contains("retrying"),
        "the run saw the outage and retried: {stderr}"
    );
    let check: CheckReport = common::typed(&run_ok(ysb("check", &topic, &dir, &url, &[])), "");
    assert!(check.exact, "{check:?}");
    assert_eq!(check.truth_exact, Some(true), "{check:?}");
    assert_eq!(
        Some(check.views),
        generated["views"].as_u64(),
        "{check:?} {generated}"
    );
}
