//! `--autoscale 1..8` of standing queries on Lambda (ministack, real Kafka
//! and Redis, our real `bootstrap`). Two queries read one topic, each
//! deployed at 8 members: a windowed one (a tumbling `count(DISTINCT v)`
//! per key into a Redis list per window, so a doubled write shows) and an
//! updating one (`count(DISTINCT v)` and `sum(v)` per key into Redis
//! hashes). `DISTINCT` keeps sources from pre-aggregating, so the groups do
//! the work. The produced rate goes low (nothing) -> high (a 300,000-record
//! backlog) -> low: idle, each query's driver shrinks a group to 1; the
//! backlog makes it grow; once it is read the group shrinks again. As soon
//! as a query has grown and its new members have started, every `bootstrap`
//! process of that query is SIGKILLed (the driver's too), while the new
//! members take their key groups' state. `skein status --json` records the
//! sizes; Redis holds exactly the references computed here.

use std::collections::BTreeMap;

use crate::common;

use crate::common::windowed::{self, BASE_MS, WINDOW_MS};
use crate::{eventually, lambda_status};

const PARTITIONS: usize = 2;
const SPAN_MS: i64 = 250_000;

/// Each group's sizes in status's rescale history, repeats merged.
fn histories(store: &str, code: &str) -> BTreeMap<u32, Vec<u32>> {
    let mut out: BTreeMap<u32, Vec<u32>> = Default::default();
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

/// Where `h` first went up after being down to 1.
fn grew_after_shrinking(h: &[u32]) -> Option<usize> {
    let down = h.iter().position(|&m| m == 1)?;
    let up = h[down..].iter().position(|&m| m > 1)?;
    Some(down + up)
}

/// Whether `h` goes down to 1, up, and down to 1 again.
fn down_up_down(h: &[u32]) -> bool {
    grew_after_shrinking(h).is_some_and(|up| h[up..].contains(&1))
}

/// One standing query of the test: where it keeps its checkpoints, its code.
struct Standing {
    what: &'static str,
    deployed: common::DestroyOnDrop,
    killed: Vec<i32>,
}

impl Standing {
    fn deploy(what: &'static str, sql_text: &str) -> Self {
        let name = common::unique_name(&format!("lambda-autoscale-{what}"));
        let sql = std::env::temp_dir().join(format!("{name}.sql"));
        std::fs::write(&sql, sql_text).expect("writing the query");
        let store = format!("s3://{name}");
        let (code, _) = common::deploy_on_aws(
            &store,
            sql.to_str().expect("utf-8"),
            &[
                "--group-size",
                "8",
                "--autoscale",
                "1..8",
                "--interval",
                "100ms",
                "--checkpoint-interval",
                "1",
            ],
        );
        let _ = std::fs::remove_file(&sql);
        Self {
            what,
            deployed: common::DestroyOnDrop { store, code },
            killed: vec![],
        }
    }

    fn histories(&self) -> BTreeMap<u32, Vec<u32>> {
        histories(&self.deployed.store, &self.deployed.code)
    }

    /// Whether some group has shrunk to one member.
    fn shrunk(&self) -> bool {
        self.histories().values().any(|h| h.contains(&1))
    }

    /// Once a group has grown after shrinking and more than one of its
    /// members runs: every bootstrap of the query SIGKILLed. Whether that
    /// has happened.
    fn killed_once_grown(&mut self) -> bool {
        if !self.killed.is_empty() {
            return true;
        }
        let code = &self.deployed.code;
        let grown = self
            .histories()
            .into_iter()
            .filter(|(_, h)| grew_after_shrinking(h).is_some())
            .map(|(stage, _)| format!("{code}-{stage:02}-"));
        for members in grown {
            if common::kills::bootstraps(|f| f.starts_with(&members)).len() > 1 {
                self.killed = common::kills::kill_query_bootstraps(code);
                eprintln!("{}: killed {} bootstraps", self.what, self.killed.len());
                return !self.killed.is_empty();
            }
        }
        false
    }

    /// A group that went down to 1, up and down to 1 again: (stage, sizes).
    fn went_down_up_down(&self) -> Option<(u32, Vec<u32>)> {
        self.histories().into_iter().find(|(_, h)| down_up_down(h))
    }
}

#[test]
fn standing_queries_on_lambda_grow_and_shrink_with_the_load_exactly() {
    common::require_aws();
    let url = common::require_redis();
    let (backlog, windows) = windowed::records(300_000, PARTITIONS, SPAN_MS);
    let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 25_000);
    let lists = common::unique_name("autoscale-windows");
    let hashes = common::unique_name("autoscale-keys");
    let mut queries = [
        Standing::deploy(
            "windowed",
            &windowed::query_counting(
                &source,
                &windowed::redis_list_sink(&url, &lists),
                "count(DISTINCT v)",
            ),
        ),
        Standing::deploy(
            "updating",
            &windowed::per_key_into_redis(&source, &hashes, "count(DISTINCT v)"),
        ),
    ];

    // Low: nothing produced, the drivers' ticks shrink a group to 1.
    for q in &queries {
        eventually(
            300,
            &format!("{}: a group shrunk to 1 idle", q.what),
            || q.shrunk().then_some(()),
        );
    }
    // High: the backlog. Each query killed as soon as it has grown.
    windowed::produce(&topic, &backlog);
    eventually(300, "both queries grown and killed", || {
        let mut all = true;
        for q in &mut queries {
            all &= q.killed_once_grown();
        }
        all.then_some(())
    });
    // Low again: one record per partition, far enough ahead in event time
    // to close every window (distinct `v`s, so the per-key count counts
    // both).
    let close = BASE_MS + SPAN_MS + 3 * WINDOW_MS;
    let closing: Vec<(usize, String)> = (0..PARTITIONS)
        .map(|p| (p, format!(r#"{{"k":"end","v":-{},"ts":{close}}}"#, p + 1)))
        .collect();
    windowed::produce(&topic, &closing);
    let mut all = backlog;
    all.extend(closing);
    let per_key = windowed::totals(&all);
    eventually(600, "the per-key reference in Redis", || {
        (common::redis_counts(&hashes) == per_key).then_some(())
    });
    let written = || {
        let (_, keys) = windowed::keys_under(&url, &lists);
        keys.iter().filter(|k| !k.ends_with("|end")).count()
    };
    eventually(600, "every window in Redis", || {
        (written() >= windows.len()).then_some(())
    });
    for q in &queries {
        let (stage, sizes) = eventually(300, &format!("{}: down, up, down", q.what), || {
            q.went_down_up_down()
        });
        eprintln!(
            "{}: stage {stage} sizes {sizes:?}; killed {} bootstraps once it grew",
            q.what,
            q.killed.len()
        );
    }
    // Still exact, with both queries running on.
    windowed::assert_lists_exact(&url, &lists, &windows, &["end"]);
    assert_eq!(common::redis_counts(&hashes), per_key);
}
