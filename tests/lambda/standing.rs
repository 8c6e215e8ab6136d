//! A standing query on Lambda with no local process (ministack, real Kafka
//! and Redis, our real `bootstrap`): `skein deploy` creates the schedule
//! that invokes the driver function; events are published for
//! `SKEIN_STANDING_SECS` (default 180) while every `bootstrap` process of
//! the query is SIGKILLed once; Redis ends with exactly the reference
//! result (a list per window and key, so a doubled write shows) and `skein status --json` shows the lag at 0. Then stop, start
//! (state kept), and destroy --purge (nothing left).

use crate::common;

use std::time::{Duration, Instant};

use crate::common::windowed::{self, BASE_MS, WINDOW_MS};
use serde_json::Value;
use skein_engine::status::QueryStatus;

const PARTITIONS: usize = 2;

fn skein_aws(store: &str, args: &[&str]) -> String {
    let (ok, stdout, stderr) = common::skein_on_aws(Some(store), args);
    assert!(ok, "skein {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}

/// `skein status CODE --backend lambda --json`: the query's status, typed,
/// and the whole object for what only Lambda adds (its schedule and lease,
/// an object of their own: src/status.rs).
fn status(store: &str, code: &str) -> (QueryStatus, Value) {
    let out = skein_aws(store, &["status", code, "--backend", "lambda", "--json"]);
    let v: Value = serde_json::from_str(out.trim()).expect("status --json");
    (common::typed(&v, &out), v)
}

/// Polls `ready` every 2 s for up to `secs`.
fn eventually<T>(secs: u64, what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = ready() {
            return v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(secs),
            "no {what} in {secs} s"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

#[test]
fn a_deployed_query_runs_on_its_own_through_kills_and_stop_start() {
    common::require_aws();
    let url = common::require_redis();
    let secs: u64 = std::env::var("SKEIN_STANDING_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(180);
    let span_ms = 100_000;
    let (records, reference) = windowed::records(6_000, PARTITIONS, span_ms);
    let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 500);
    let prefix = common::unique_name("standing");
    // A list per window and key: a doubled write shows as a second element.
    let sql_text = windowed::query(&source, &windowed::redis_list_sink(&url, &prefix));
    let sql = std::env::temp_dir().join(format!("{prefix}.sql"));
    std::fs::write(&sql, &sql_text).expect("writing the query");
    let sql_path = sql.to_str().expect("utf-8");
    let store = format!("s3://{}", common::unique_name("skein-standing"));

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
    assert!(
        deployed["standing"]["schedule"].is_string(),
        "a checkpointing query gets a schedule: {deployed}"
    );

    // Publish over `secs`, in event-time order; then one record per
    // partition far enough ahead to close every window of the reference.
    let chunks = 60;
    let per_chunk = records.len().div_ceil(chunks);
    let started = Instant::now();
    let mut killed = vec![];
    for (i, chunk) in records.chunks(per_chunk).enumerate() {
        windowed::produce(&topic, chunk);
        std::thread::sleep(Duration::from_secs(secs) / chunks as u32);
        // Halfway, once a tick has committed: kill every bootstrap once.
        if killed.is_empty() && i >= chunks / 2 && status(&store, &code).0.store.committed.is_some()
        {
            let wanted = format!("{code}-");
            for pid in common::kills::bootstraps(|f| f.starts_with(&wanted)) {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status();
                killed.push(pid);
            }
        }
    }
    let close = BASE_MS + span_ms + 3 * WINDOW_MS;
    let closing: Vec<(usize, String)> = (0..PARTITIONS)
        .map(|p| (p, format!(r#"{{"k":"end","v":0,"ts":{close}}}"#)))
        .collect();
    windowed::produce(&topic, &closing);
    eprintln!(
        "published in {:.0} s; killed {} bootstraps: {killed:?}",
        started.elapsed().as_secs_f64(),
        killed.len()
    );
    assert!(
        !killed.is_empty(),
        "no bootstrap of the query was running to kill"
    );

    let windows = |prefix: &str| -> usize {
        let (_, keys) = windowed::keys_under(&url, prefix);
        keys.iter().filter(|k| !k.ends_with("|end")).count()
    };
    eventually(300, "complete result in Redis", || {
        (windows(&prefix) >= reference.len()).then_some(())
    });
    windowed::assert_lists_exact(&url, &prefix, &reference, &["end"]);
    let (lag0, lag0_platform) = eventually(180, "lag 0 in skein status", || {
        let (s, platform) = status(&store, &code);
        (s.lag == 0).then_some((s, platform))
    });
    assert_eq!(lag0_platform["schedule"], "ENABLED", "{lag0_platform}");
    assert!(
        lag0_platform["lease"]["holder"].is_string(),
        "{lag0_platform}"
    );
    let committed = lag0.store.committed.map(|c| c.epoch).expect("a commit");

    // Stop: the schedule is disabled, the state kept; start resumes.
    skein_aws(&store, &["stop", &code]);
    assert_eq!(status(&store, &code).1["schedule"], "DISABLED");
    skein_aws(&store, &["start", &code]);
    let (after, after_platform) = status(&store, &code);
    assert_eq!(after_platform["schedule"], "ENABLED");
    assert!(
        after.store.committed.map(|c| c.epoch) >= Some(committed),
        "state kept across stop/start: {after:?}"
    );

    // destroy --purge leaves no function, schedule or checkpoint.
    skein_aws(&store, &["destroy", &code, "--purge"]);
    let (ok, _, stderr) =
        common::skein_on_aws(Some(&store), &["status", &code, "--backend", "lambda"]);
    assert!(!ok && stderr.contains("not deployed"), "{stderr}");
    let listed = skein_aws(&store, &["status", "--json"]);
    assert!(!listed.contains(&code), "functions left: {listed}");
    let _ = std::fs::remove_file(&sql);
}
