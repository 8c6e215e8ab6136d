//! NEXMark q0–q9 and q11–q22 read from live Kafka topics at the default
//! group size, through SIGKILLs and restarts from the checkpoint directory,
//! checked against references computed here without the engine
//! (tests/common/nexmark_reference/).
//!
//! The updating queries (q3, q4, q6, q9 and q14–q22: aggregates, joins and
//! top-N without windows) write a files table that is a changelog
//! (`'op.column'`): replaying its rows gives the final table. The others
//! (passed-through bids, tumbling, sliding and session windows, a window
//! join, a side input) append, with event time from `date_time`. A
//! replayed write that doubled, a retraction that went missing or a window
//! emitted early leaves rows the reference does not have.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::common::nexmark_columns::{Kind, columns};
use crate::common::nexmark_reference::{self as reference, Row, float};
use crate::common::nexmark_topics::NexmarkTopics;
use crate::common::rows::read_rows;
use serde_json::{Map, Value};
use skein::report::Report;
use skein_generators::nexmark::Event;

const EVENTS: u64 = 40_000;
/// Events per second of event time: 40,000 events span 200 s, so tumbling
/// windows close 20 times, sliding ones 40 times, and bidders' sessions
/// end and start again.
const EVENT_RATE: u64 = 200;

/// The NEXMark topics every test here reads, published once.
fn topics() -> &'static NexmarkTopics {
    static TOPICS: OnceLock<NexmarkTopics> = OnceLock::new();
    TOPICS.get_or_init(|| {
        common::nexmark_topics::publish("nexmark-updating", EVENTS, Some(EVENT_RATE))
    })
}

/// The queries whose result is a changelog (no window closes their rows).
const UPDATING: [u32; 13] = [3, 4, 6, 9, 14, 15, 16, 17, 18, 19, 20, 21, 22];

/// The three tables over the topics, every column declared; event time is
/// `date_time` for the queries that append.
fn tables(prefix: &str, updating: bool) -> String {
    let brokers = common::kafka_brokers();
    let event_time = if updating {
        ""
    } else {
        ", 'event_time' 'date_time'"
    };
    // People and auctions are a tenth of the stream: read in smaller pulls,
    // a query of only those (q3) still runs over enough epochs for each
    // planned kill to land after a commit of its own.
    let table = |name: &str, columns: &str| {
        let pull = if name == "bid" { 500 } else { 100 };
        format!(
            "CREATE EXTERNAL TABLE {name} ({columns}) STORED AS KAFKA LOCATION '{prefix}-{name}' \
             OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json', \
             'max.records.per.pull' '{pull}'{event_time});\n"
        )
    };
    [
        table(
            "person",
            "id BIGINT, name VARCHAR, email_address VARCHAR, credit_card VARCHAR, \
             city VARCHAR, state VARCHAR, date_time TIMESTAMP, extra VARCHAR",
        ),
        table(
            "auction",
            "id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, \
             reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, \
             category BIGINT, extra VARCHAR",
        ),
        table(
            "bid",
            "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, \
             date_time TIMESTAMP, extra VARCHAR",
        ),
    ]
    .concat()
}

fn want(query: u32, events: &[Event]) -> Vec<Row> {
    match query {
        0 => reference::q0(events),
        1 => reference::q1(events),
        2 => reference::q2(events),
        5 => reference::q5(events),
        7 => reference::q7(events),
        8 => reference::q8(events),
        11 => reference::q11(events),
        12 => reference::q12(events),
        13 => reference::q13(events),
        3 => reference::q3(events),
        4 => reference::q4(events),
        6 => reference::q6(events),
        9 => reference::q9(events),
        14 => reference::q14(events),
        15 => reference::q15(events),
        16 => reference::q16(events),
        17 => reference::q17(events),
        18 => reference::q18(events),
        19 => reference::q19(events),
        20 => reference::q20(events),
        21 => reference::q21(events),
        22 => reference::q22(events),
        q => panic!("no reference for q{q}"),
    }
}

fn command(sql: &Path, checkpoints: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_skein"));
    c.args(["run", sql.to_str().expect("utf-8 path")])
        .args(["--until-drained", "--interval", "10ms", "--json"])
        .args([
            "--checkpoint-dir",
            checkpoints.to_str().expect("utf-8 path"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The final table a changelog of rows (each with its `op`) adds up to.
fn replay(rows: &[Map<String, Value>], cols: &[(&str, Kind)]) -> Vec<Row> {
    let mut table: BTreeMap<Row, i64> = BTreeMap::new();
    for r in rows {
        let row: Row = cols
            .iter()
            .map(|(name, kind)| kind.text(r.get(*name).unwrap_or(&Value::Null)))
            .collect();
        let weight = match r.get("op").and_then(Value::as_str) {
            // An appending query's rows carry no op.
            None if !r.contains_key("op") => 1,
            Some("insert") => 1,
            Some("delete") => -1,
            other => panic!("a changelog row with op {other:?}: {r:?}"),
        };
        *table.entry(row).or_default() += weight;
    }
    let negative: Vec<_> = table.iter().filter(|(_, n)| **n < 0).collect();
    assert!(
        negative.is_empty(),
        "rows deleted more often than inserted (a doubled retraction): {:?}",
        &negative[..negative.len().min(5)]
    );
    table
        .into_iter()
        .flat_map(|(row, n)| std::iter::repeat_n(row, n as usize))
        .collect()
}

/// Runs qN from the topics through `kills` SIGKILLs; compares the table its
/// changelog adds up to with the reference.
fn check(query: u32, kills: usize) {
    let t = topics();
    let cols = columns(query);
    let dir = std::env::temp_dir().join(common::unique_name(&format!("nexmark-upd-q{query}")));
    let out = dir.join("out");
    std::fs::create_dir_all(&out).expect("output directory");
    let updating = UPDATING.contains(&query);
    let sink = format!(
        "CREATE EXTERNAL TABLE out ({}) STORED AS FILES LOCATION 'file://{}' \
         OPTIONS ('format' 'json'{});\n",
        cols.iter()
            .map(|(n, k)| format!("{n} {}", k.sql()))
            .collect::<Vec<_>>()
            .join(", "),
        out.display(),
        if updating { ", 'op.column' 'op'" } else { "" }
    );
    let body = std::fs::read_to_string(common::repo_path(&format!("queries/nexmark/q{query}.sql")))
        .expect("the query file");
    let sql = dir.join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "{}{sink}INSERT INTO out\n{body}",
            tables(&t.prefix, updating)
        ),
    )
    .expect("writing the query");
    let checkpoints = dir.join("checkpoints");
    let run = common::kills::run_through_kills(|| command(&sql, &checkpoints), &checkpoints, kills);
    // The first kill lands early (maybe before any commit); the later ones
    // after the killed run committed, so the last run resumes.
    let late = kills - kills.div_ceil(3);
    assert!(
        run.mid_run() >= late,
        "q{query}: {} kills cut a run after a commit, {late} planned: {:?}",
        run.mid_run(),
        run.kills
    );
    let report: Report = run.assert_resumed();
    if kills > 1 {
        assert!(
            report.resumed_after.is_some(),
            "q{query} resumed: {:?}",
            report.resumed_after
        );
    }
    let got = replay(&read_rows(&out, true), &cols);
    let want = want(query, &t.events);
    assert!(
        !want.is_empty(),
        "q{query}: the reference is empty, which proves nothing"
    );
    assert_same_rows(&format!("NEXMark q{query}"), got, want);
    let _ = std::fs::remove_dir_all(&dir);
}

fn assert_same_rows(what: &str, mut got: Vec<Row>, mut want: Vec<Row>) {
    got.sort();
    want.sort();
    if got == want {
        return;
    }
    fn count(rows: &[Row]) -> BTreeMap<&Row, i64> {
        let mut m: BTreeMap<&Row, i64> = BTreeMap::new();
        for r in rows {
            *m.entry(r).or_default() += 1;
        }
        m
    }
    let (g, w) = (count(&got), count(&want));
    let missing: Vec<_> = w
        .iter()
        .filter(|(r, n)| g.get(*r) < Some(n))
        .take(5)
        .collect();
    let extra: Vec<_> = g
        .iter()
        .filter(|(r, n)| w.get(*r) < Some(n))
        .take(5)
        .collect();
    panic!(
        "{what}: {} rows, expected {}\nfirst missing: {missing:?}\nfirst unexpected: {extra:?}",
        got.len(),
        want.len()
    );
}

#[test]
fn q0_passes_every_bid_through() {
    check(0, 2);
}

#[test]
fn q1_converts_prices() {
    check(1, 2);
}

#[test]
fn q2_selects_auctions() {
    check(2, 2);
}

#[test]
fn q5_hot_items_in_sliding_windows() {
    check(5, 3);
}

#[test]
fn q7_highest_bids_per_tumbling_window() {
    check(7, 2);
}

#[test]
fn q8_new_sellers_in_a_window_join() {
    check(8, 2);
}

#[test]
fn q11_sessions_per_bidder() {
    check(11, 3);
}

#[test]
fn q12_bids_per_bidder_per_window() {
    check(12, 2);
}

#[test]
fn q13_bids_joined_with_a_side_input() {
    check(13, 2);
}

#[test]
fn q3_join_without_a_window() {
    check(3, 3);
}

#[test]
fn q4_average_of_maxima_takes_retractions() {
    check(4, 3);
}

#[test]
fn q6_window_function_over_a_partition() {
    check(6, 2);
}

#[test]
fn q9_winning_bids() {
    check(9, 2);
}

#[test]
fn q14_calculation() {
    check(14, 2);
}

#[test]
fn q15_daily_counts_with_distinct_and_filter() {
    check(15, 2);
}

#[test]
fn q16_channel_counts() {
    check(16, 2);
}

#[test]
fn q17_auction_statistics() {
    check(17, 3);
}

#[test]
fn q18_last_bid_per_key() {
    check(18, 2);
}

#[test]
fn q19_top_10_per_auction() {
    check(19, 3);
}

#[test]
fn q20_stream_join() {
    check(20, 2);
}

#[test]
fn q21_channel_ids() {
    check(21, 2);
}

#[test]
fn q22_url_directories() {
    check(22, 2);
}

#[test]
fn reference_helpers_by_hand() {
    assert_eq!(reference::day(0), "1970-01-01");
    assert_eq!(reference::day(1_700_000_000_000), "2023-11-14");
    assert_eq!(reference::day(951_782_400_000), "2000-02-29");
    assert_eq!(reference::minute(1_700_000_000_000), "22:13");
    assert_eq!(
        reference::channel_id_param("https://x/a/b/c/item.htm?query=1&channel_id=42"),
        Some("42".into())
    );
    assert_eq!(
        reference::channel_id_param("https://x/?query=1&xchannel_id=4"),
        None
    );
    assert_eq!(float(2.0 / 3.0), "0.667");
    let _: PathBuf = common::repo_path("queries");
}
