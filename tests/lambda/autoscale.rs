//! `--autoscale 1..8` of standing queries on Lambda (ministack, real Kafka
//! and Redis, our real `bootstrap`). Two queries read one topic, each
//! deployed at 8 members: a windowed one (sliding 10 s windows every 2 s,
//! `count(DISTINCT v)` per key into a Redis list per window, so a doubled
//! write shows) and an updating one (`count(DISTINCT v)` and `sum(v)` per
//! key into Redis hashes). `DISTINCT` keeps sources from pre-aggregating, so
//! the groups do the work; the sliding windows put each record in five
//! windows, so the windowed group has work to grow for. The produced rate
//! goes low (nothing) -> high (a 600,000-record backlog) -> low: idle, each
//! query's driver shrinks a group (to 1, or to 2 on a loaded machine, where
//! an idle member's own overhead is a larger share of the 100 ms interval).
//! The backlog makes each query's group grow past that, and once it is read
//! the group shrinks again. As soon as a query has grown and its new members
//! have started, every `bootstrap` process of that query is SIGKILLed (the
//! driver's too), while the new members take their key groups' state.
//! `skein status --json` records the sizes; Redis holds exactly the
//! references computed here.

use std::collections::BTreeMap;

use crate::common;

use crate::common::windowed::{self, BASE_MS, WINDOW_MS};
use crate::{eventually, lambda_status};

const PARTITIONS: usize = 2;
const SPAN_MS: i64 = 250_000;
const DEPLOYED: u32 = 8;
/// The windowed query's sliding windows.
const SLIDE_MS: i64 = 2_000;
const SIZE_MS: i64 = 10_000;

/// Each group's sizes in status's rescale history (the last 20 rescales),
/// repeats merged: (the first epoch at the size, the size).
fn histories(store: &str, code: &str) -> BTreeMap<u32, Vec<(u64, u32)>> {
    let mut out: BTreeMap<u32, Vec<(u64, u32)>> = Default::default();
    for r in lambda_status(store, code).0.resized {
        for (stage, n) in r.groups {
            let h = out.entry(stage).or_default();
            if h.last().map(|&(_, m)| m) != Some(n) {
                h.push((r.from_epoch, n));
            }
        }
    }
    out
}

/// The sizes alone.
fn sizes(h: &[(u64, u32)]) -> Vec<u32> {
    h.iter().map(|&(_, m)| m).collect()
}

/// Whether sizes `after` (since the backlog landed, at `from` then) went
/// up and then down again.
fn up_down(from: u32, after: &[u32]) -> bool {
    let Some(up) = after.iter().position(|&m| m > from) else {
        return false;
    };
    after[up + 1..].iter().any(|&m| m < after[up])
}

/// One standing query of the test: where it keeps its checkpoints, its code.
struct Standing {
    what: &'static str,
    deployed: common::DestroyOnDrop,
    killed: Vec<i32>,
    /// The last rescale's first epoch when the backlog landed, and every
    /// group's size then.
    at_backlog: (u64, BTreeMap<u32, u32>),
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
                &DEPLOYED.to_string(),
                "--autoscale",
                &format!("1..{DEPLOYED}"),
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
            at_backlog: Default::default(),
        }
    }

    fn histories(&self) -> BTreeMap<u32, Vec<(u64, u32)>> {
        histories(&self.deployed.store, &self.deployed.code)
    }

    /// Whether some group has shrunk to `most` members or fewer.
    fn shrunk_to(&self, most: u32) -> bool {
        self.histories()
            .values()
            .any(|h| h.last().is_some_and(|&(_, m)| m <= most))
    }

    /// The backlog lands: every group's size now.
    fn backlog_lands(&mut self) {
        let h = self.histories();
        let last = h.values().flatten().map(|&(e, _)| e).max().unwrap_or(0);
        let now = h
            .into_iter()
            .map(|(stage, h)| (stage, h.last().map_or(DEPLOYED, |&(_, m)| m)))
            .collect();
        self.at_backlog = (last, now);
    }

    /// Per group: its size when the backlog landed, its sizes since.
    fn since_backlog(&self) -> BTreeMap<u32, (u32, Vec<u32>)> {
        let (last, then) = &self.at_backlog;
        self.histories()
            .into_iter()
            .map(|(stage, h)| {
                let after = h.iter().filter(|&&(e, _)| e > *last).map(|&(_, m)| m);
                (
                    stage,
                    (
                        then.get(&stage).copied().unwrap_or(DEPLOYED),
                        after.collect(),
                    ),
                )
            })
            .collect()
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
            .since_backlog()
            .into_iter()
            .filter(|(_, (from, after))| after.iter().any(|m| m > from))
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

    /// A group that grew under the backlog and shrank again: (stage, its
    /// whole history).
    fn went_up_and_down(&self) -> Option<(u32, Vec<u32>)> {
        let (stage, _) = self
            .since_backlog()
            .into_iter()
            .find(|(_, (from, after))| up_down(*from, after))?;
        Some((
            stage,
            sizes(&self.histories().remove(&stage).unwrap_or_default()),
        ))
    }
}

/// Polls every second until `ready` holds for every query; fails naming
/// `what` and every group's sizes if `secs` pass first.
fn until_all(
    secs: u64,
    what: &str,
    queries: &mut [Standing],
    mut ready: impl FnMut(&mut Standing) -> bool,
) {
    let started = std::time::Instant::now();
    loop {
        let mut all = true;
        for q in queries.iter_mut() {
            all &= ready(q);
        }
        if all {
            return;
        }
        if started.elapsed() > std::time::Duration::from_secs(secs) {
            let seen: Vec<_> = queries.iter().map(|q| (q.what, q.histories())).collect();
            panic!("no {what} in {secs} s; (epoch, size) per group: {seen:?}");
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

#[test]
fn standing_queries_on_lambda_grow_and_shrink_with_the_load_exactly() {
    common::require_aws();
    let url = common::require_redis();
    let (backlog, _) = windowed::records(600_000, PARTITIONS, SPAN_MS);
    let windows = windowed::hop_reference(&backlog, SLIDE_MS, SIZE_MS);
    let (topic, source) = windowed::empty_kafka_table(PARTITIONS, 25_000);
    let lists = common::unique_name("autoscale-windows");
    let hashes = common::unique_name("autoscale-keys");
    let mut queries = [
        Standing::deploy(
            "windowed",
            &windowed::hop_into_redis_lists(
                &source,
                &url,
                &lists,
                "count(DISTINCT v)",
                SLIDE_MS,
                SIZE_MS,
            ),
        ),
        Standing::deploy(
            "updating",
            &windowed::per_key_into_redis(&source, &hashes, "count(DISTINCT v)"),
        ),
    ];

    // Low: nothing produced, the drivers' ticks shrink a group, to 1 if
    // they get there in another two minutes.
    until_all(
        420,
        "group of each query shrunk to 2 idle",
        &mut queries,
        |q| q.shrunk_to(2),
    );
    let more = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::time::Instant::now() < more && !queries.iter().all(|q| q.shrunk_to(1)) {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    // High: the backlog. Each query's group grows; as soon as it has, every
    // bootstrap of that query is killed, in the middle of the backlog.
    for q in &mut queries {
        q.backlog_lands();
    }
    windowed::produce(&topic, &backlog);
    until_all(420, "group grown and killed", &mut queries, |q| {
        q.killed_once_grown()
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
    until_all(300, "group grown and shrunk again", &mut queries, |q| {
        q.went_up_and_down().is_some()
    });
    for q in &queries {
        let (stage, sizes) = q.went_up_and_down().expect("seen above");
        eprintln!(
            "{}: stage {stage} sizes {sizes:?}; killed {} bootstraps",
            q.what,
            q.killed.len()
        );
    }
    // Still exact, with both queries running on.
    windowed::assert_lists_exact(&url, &lists, &windows, &["end"]);
    assert_eq!(common::redis_counts(&hashes), per_key);
}
