//! A standing query on Lambda with no local process (ministack, real Kafka
//! and Redis, our real `bootstrap`): `skein deploy` creates the schedule
//! that invokes the driver function; events are published for
//! `SKEIN_STANDING_SECS` (default 180). The group is deployed at 4 members
//! with `--autoscale 1..3`: the driver moves it into that range by itself;
//! halfway, `skein rescale --backend lambda` changes its size by hand, and
//! once the driver has carried that out every `bootstrap` process of the
//! query is SIGKILLed, while the new members are taking their key groups'
//! state. Redis ends with exactly the reference result (a list per window
//! and key, so a doubled write shows), `skein status --json` lists both
//! rescales and shows the lag at 0. Then stop, start (state kept), and
//! destroy --purge (nothing left).

use crate::common;

use std::time::{Duration, Instant};

use crate::common::windowed::{self, BASE_MS, WINDOW_MS};
use crate::{eventually, lambda_status};

const PARTITIONS: usize = 2;

/// `skein status --backend lambda --json`'s rescale history.
fn status_resized(store: &str, code: &str) -> Vec<skein_engine::status::Resized> {
    lambda_status(store, code).0.resized
}

/// Once the driver has moved the group into its `--autoscale` range, asks
/// for another size within it by hand and waits until the driver has
/// carried it out: (the group's stage, its new size).
fn rescale_by_hand(store: &str, code: &str) -> (u32, u32) {
    let (stage, now) = eventually(180, "the group moved into 1..3 by --autoscale", || {
        let last = status_resized(store, code).pop()?;
        last.groups.into_iter().find(|&(_, n)| n <= 3)
    });
    let size = if now == 3 { 2 } else { 3 };
    common::skein_on_aws_ok(
        store,
        &[
            "rescale",
            code,
            "--backend",
            "lambda",
            "--stage",
            &stage.to_string(),
            "--group-size",
            &size.to_string(),
        ],
    );
    eventually(180, "the rescale by hand carried out", || {
        let (s, _) = lambda_status(store, code);
        (s.rescale_asked.is_none()
            && status_resized(store, code)
                .last()
                .is_some_and(|r| r.groups.get(&stage) == Some(&size)))
        .then_some(())
    });
    (stage, size)
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

    let (code, deployed) = common::deploy_on_aws(
        &store,
        sql_path,
        &["--group-size", "4", "--autoscale", "1..3"],
    );
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
    let mut rescaled = None;
    for (i, chunk) in records.chunks(per_chunk).enumerate() {
        windowed::produce(&topic, chunk);
        std::thread::sleep(Duration::from_secs(secs) / chunks as u32);
        // Halfway, once a tick has committed: a rescale by hand, then
        // every bootstrap killed once.
        if killed.is_empty()
            && i >= chunks / 2
            && lambda_status(&store, &code).0.store.committed.is_some()
        {
            rescaled = Some(rescale_by_hand(&store, &code));
            killed = common::kills::kill_query_bootstraps(&code);
        }
    }
    let close = BASE_MS + span_ms + 3 * WINDOW_MS;
    let closing: Vec<(usize, String)> = (0..PARTITIONS)
        .map(|p| (p, format!(r#"{{"k":"end","v":0,"ts":{close}}}"#)))
        .collect();
    windowed::produce(&topic, &closing);
    eprintln!(
        "published in {:.0} s; rescaled by hand (stage, size): {rescaled:?}; killed {} \
         bootstraps: {killed:?}",
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
        let (s, platform) = lambda_status(&store, &code);
        (s.lag == 0).then_some((s, platform))
    });
    assert_eq!(lag0_platform["schedule"], "ENABLED", "{lag0_platform}");
    assert!(
        lag0_platform["lease"]["holder"].is_string(),
        "{lag0_platform}"
    );
    let committed = lag0.store.committed.map(|c| c.epoch).expect("a commit");
    let (stage, size) = rescaled.expect("rescaled by hand");
    let history: Vec<u32> = status_resized(&store, &code)
        .iter()
        .filter_map(|r| r.groups.get(&stage).copied())
        .collect();
    assert!(
        history.first().is_some_and(|&n| n <= 3) && history.contains(&size),
        "the driver moved the group from 4 into 1..3, then to {size} by hand: {history:?}"
    );

    // Stop: the schedule is disabled, the state kept; start resumes.
    common::skein_on_aws_ok(&store, &["stop", &code]);
    assert_eq!(lambda_status(&store, &code).1["schedule"], "DISABLED");
    common::skein_on_aws_ok(&store, &["start", &code]);
    let (after, after_platform) = lambda_status(&store, &code);
    assert_eq!(after_platform["schedule"], "ENABLED");
    assert!(
        after.store.committed.map(|c| c.epoch) >= Some(committed),
        "state kept across stop/start: {after:?}"
    );

    // destroy --purge leaves no function, schedule or checkpoint.
    common::skein_on_aws_ok(&store, &["destroy", &code, "--purge"]);
    let (ok, _, stderr) =
        common::skein_on_aws(Some(&store), &["status", &code, "--backend", "lambda"]);
    assert!(!ok && stderr.contains("not deployed"), "{stderr}");
    let listed = common::skein_on_aws_ok(&store, &["status", "--json"]);
    assert!(!listed.contains(&code), "functions left: {listed}");
    let _ = std::fs::remove_file(&sql);
}
