//! `--autoscale` of a standing query on Lambda (ministack, real Kafka and
//! Redis, our real `bootstrap`): an updating aggregate (`count(DISTINCT v)`
//! and `sum(v)` per key, which sources cannot pre-aggregate, so its groups
//! do the work) deployed at 4 members with `--autoscale 1..4`. Idle, its
//! driver shrinks a group to 1; a 300,000-record backlog makes it grow; once
//! the backlog is read it shrinks again. As soon as it has grown, every
//! `bootstrap` process of the query is SIGKILLed (the driver's too), while
//! the new members take their key groups' state. `skein status --json` records the
//! sizes, and Redis holds exactly the per-key reference computed here while
//! the query goes on running.

use crate::common;

use crate::common::windowed::{self, per_key_into_redis, totals};
use crate::{eventually, lambda_status};

const PARTITIONS: usize = 2;

/// Each group's sizes in status's rescale history, repeats merged.
fn histories(store: &str, code: &str) -> std::collections::BTreeMap<u32, Vec<u32>> {
    let mut out: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for r in lambda_status(store, code).0.resized {
        for (stage, n) in r.groups {
            let h = out.entry(stage).or_default();
            if h.last() != Some(&n) {
                h.push(n);
            }
        }
    }
    out
}

/// Whether `h` goes down to 1, up, and down to 1 again.
fn down_up_down(h: &[u32]) -> bool {
    let Some(down) = h.iter().position(|&m| m == 1) else {
        return false;
    };
    let Some(up) = h[down..].iter().position(|&m| m > 1) else {
        return false;
    };
    h[down + up..].contains(&1)
}

#[test]
fn a_standing_query_on_lambda_shrinks_idle_grows_under_a_backlog_and_shrinks_again_exactly() {
    common::require_aws();
    common::require_redis();
    let records = windowed::records(300_000, PARTITIONS, 250_000).0;
    let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 25_000);
    let prefix = common::unique_name("lambda-autoscale");
    let sql = std::env::temp_dir().join(format!("{prefix}.sql"));
    std::fs::write(
        &sql,
        per_key_into_redis(&source, &prefix, "count(DISTINCT v)"),
    )
    .expect("writing the query");
    let store = format!("s3://{}", common::unique_name("skein-autoscale"));
    let (code, _) = common::deploy_on_aws(
        &store,
        sql.to_str().expect("utf-8"),
        &[
            "--group-size",
            "4",
            "--autoscale",
            "1..4",
            "--interval",
            "100ms",
            "--checkpoint-interval",
            "1",
        ],
    );

    // Idle: the driver's ticks shrink a group to one member.
    let stage = eventually(300, "a group shrunk to 1 while idle", || {
        histories(&store, &code)
            .into_iter()
            .find(|(_, h)| h.contains(&1))
            .map(|(stage, _)| stage)
    });
    windowed::produce(&topic, &records);
    // As soon as the group has grown: every bootstrap of the query killed
    // (the driver's too), while the new members take their key groups.
    eventually(300, "the group grown under the backlog", || {
        let h = histories(&store, &code).remove(&stage).unwrap_or_default();
        let down = h.iter().position(|&m| m == 1)?;
        h[down..].iter().any(|&m| m > 1).then_some(())
    });
    // The grown group's new instances start on their first epoch.
    let members = format!("{code}-{stage:02}-");
    eventually(60, "instances of the grown group", || {
        (common::kills::bootstraps(|f| f.starts_with(&members)).len() > 1).then_some(())
    });
    let killed = common::kills::kill_query_bootstraps(&code);
    assert!(!killed.is_empty(), "no bootstrap of the query to kill");
    let reference = totals(&records);
    eventually(600, "the reference in Redis", || {
        (common::redis_counts(&prefix) == reference).then_some(())
    });
    let history = eventually(300, "the group down, up and down again", || {
        let h = histories(&store, &code).remove(&stage).unwrap_or_default();
        down_up_down(&h).then_some(h)
    });
    eprintln!(
        "stage {stage} sizes {history:?}; killed {} bootstraps once it grew",
        killed.len()
    );
    // Still exact, with the query running on.
    assert_eq!(common::redis_counts(&prefix), reference);

    common::skein_on_aws_ok(&store, &["destroy", &code, "--purge"]);
    let _ = std::fs::remove_file(&sql);
}
