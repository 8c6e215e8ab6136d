//! NEXMark q0–q13 through the payload-chained stage DAG: every query agrees
//! with single-process DataFusion on 100,000 events with groups of 4, and a
//! few agree with results computed here, by hand, from the generator's events.
//! The queries run through the library (`skein::run::run_report`, what
//! `skein nexmark` runs) and are checked on its typed report and rows; only
//! q10's file output goes through the CLI.

use std::collections::BTreeMap;

use datafusion::arrow::util::display::array_value_to_string;
use skein::report::Report;
use skein::run::{CommonRunArgs, nexmark_sql, run_report};
use skein_engine::verify::Comparison;
use skein_generators::nexmark::{EventRef, NexmarkConfig, NexmarkGenerator};

use crate::common;
use crate::common::skein;

/// Run NEXMark query `query` in-process through the library (what `skein
/// nexmark` runs), with `flags` as `skein run`'s, and return its report.
fn nexmark_run(query: u32, events: u64, rate: u64, flags: &[&str]) -> (Report, Option<Comparison>) {
    let sql = nexmark_sql(query, events, rate, 2).expect("NEXMark SQL");
    let mut all = vec!["--json"];
    all.extend_from_slice(flags);
    let args = CommonRunArgs::from_flags(all).expect("run flags");
    tokio::runtime::Runtime::new()
        .expect("tokio runtime")
        .block_on(run_report(&sql, &args, Some(query)))
        .unwrap_or_else(|e| panic!("q{query} failed: {e:#}"))
}

/// Run query `n` on 100,000 events, groups of 4, and check it verifies.
fn verifies(query: u32) {
    // 100 s of event time: ten 10 s windows, many sessions.
    let flags = ["--group-size", "4", "--epochs", "5", "--verify"];
    let (report, mismatch) = nexmark_run(query, 100_000, 1_000, &flags);
    assert_eq!(report.verified, Some(true), "q{query}: {mismatch:?}");
    assert!(mismatch.is_none());
    assert_eq!(report.query, Some(query));
    assert!(report.stages >= 1, "{report:?}");
    assert!(report.invocations > 0, "{report:?}");
}

macro_rules! verify_tests {
    ($($name:ident: $q:expr,)*) => {
        $(
            #[test]
            fn $name() {
                verifies($q);
            }
        )*
    };
}

verify_tests! {
    q0_verifies: 0,
    q1_verifies: 1,
    q2_verifies: 2,
    q3_verifies: 3,
    q4_verifies: 4,
    q5_verifies: 5,
    q6_verifies: 6,
    q7_verifies: 7,
    q8_verifies: 8,
    q9_verifies: 9,
    q10_verifies: 10,
    q11_verifies: 11,
    q12_verifies: 12,
    q13_verifies: 13,
}

/// A small stream: 3,000 events at 75 events/s, i.e. 40 s of event time, so
/// windowed queries see several 10 s windows and auction ids pass 1107 (q2).
const TINY_EVENTS: u64 = 3_000;
const TINY_RATE: u64 = 75;

/// The tiny stream's bids, as (auction, bidder, price, date_time ms).
fn tiny_bids() -> Vec<(i64, i64, i64, i64)> {
    let config = NexmarkConfig {
        first_event_rate: TINY_RATE,
        max_events: Some(TINY_EVENTS),
        ..Default::default()
    };
    let mut generator = NexmarkGenerator::new(config).expect("generator");
    let mut bids = vec![];
    while let Some(event) = generator.next_event() {
        if let EventRef::Bid(b) = event {
            bids.push((b.auction, b.bidder, b.price, b.date_time));
        }
    }
    assert!(bids.len() > 2_000, "{} bids", bids.len());
    bids
}

/// Query `n` on the tiny stream: its result rows as maps column -> text.
fn tiny_rows(query: u32) -> Vec<BTreeMap<String, String>> {
    let flags = ["--group-size", "2", "--epochs", "4"];
    let (report, _) = nexmark_run(query, TINY_EVENTS, TINY_RATE, &flags);
    let mut rows = vec![];
    for batch in &report.rows {
        let schema = batch.schema();
        for row in 0..batch.num_rows() {
            let cells = schema.fields().iter().zip(batch.columns()).map(|(f, col)| {
                let text = array_value_to_string(col, row).expect("a printable value");
                (f.name().clone(), text)
            });
            rows.push(cells.collect());
        }
    }
    assert_eq!(rows.len(), report.result_rows);
    rows
}

fn int(row: &BTreeMap<String, String>, column: &str) -> i64 {
    row[column]
        .parse()
        .unwrap_or_else(|_| panic!("{column} in {row:?}"))
}

#[test]
fn q1_converts_every_price_to_euros() {
    let bids = tiny_bids();
    let rows = tiny_rows(1);
    assert_eq!(rows.len(), bids.len());
    let mut expected: Vec<(i64, i64, f64)> = bids
        .iter()
        .map(|&(auction, bidder, price, _)| (auction, bidder, price as f64 * 0.908))
        .collect();
    let mut got: Vec<(i64, i64, f64)> = rows
        .iter()
        .map(|r| {
            let price: f64 = r["price"].parse().expect("price");
            (int(r, "auction"), int(r, "bidder"), price)
        })
        .collect();
    let key = |x: &(i64, i64, f64), y: &(i64, i64, f64)| {
        (x.0, x.1).cmp(&(y.0, y.1)).then(x.2.total_cmp(&y.2))
    };
    expected.sort_by(key);
    got.sort_by(key);
    for (e, g) in expected.iter().zip(&got) {
        assert_eq!((e.0, e.1), (g.0, g.1));
        assert!(
            (e.2 - g.2).abs() < 1e-6 * e.2.abs().max(1.0),
            "{e:?} vs {g:?}"
        );
    }
}

#[test]
fn q2_selects_the_bids_on_every_123rd_auction() {
    let bids = tiny_bids();
    let mut expected: Vec<(i64, i64)> = bids
        .iter()
        .filter(|b| b.0 % 123 == 0)
        .map(|b| (b.0, b.2))
        .collect();
    let mut got: Vec<(i64, i64)> = tiny_rows(2)
        .iter()
        .map(|r| (int(r, "auction"), int(r, "price")))
        .collect();
    expected.sort_unstable();
    got.sort_unstable();
    assert!(!expected.is_empty(), "no bid on a multiple of 123");
    assert_eq!(got, expected);
}

#[test]
fn q7_finds_the_highest_bids_of_each_ten_second_window() {
    let bids = tiny_bids();
    let window = |t: i64| t - t.rem_euclid(10_000);
    let mut max_price: BTreeMap<i64, i64> = BTreeMap::new();
    for b in &bids {
        let m = max_price.entry(window(b.3)).or_insert(i64::MIN);
        *m = (*m).max(b.2);
    }
    assert!(max_price.len() >= 3, "{} windows", max_price.len());
    let mut expected: Vec<(i64, i64, i64)> = bids
        .iter()
        .filter(|b| max_price[&window(b.3)] == b.2)
        .map(|b| (b.0, b.1, b.2))
        .collect();
    let mut got: Vec<(i64, i64, i64)> = tiny_rows(7)
        .iter()
        .map(|r| (int(r, "auction"), int(r, "bidder"), int(r, "price")))
        .collect();
    expected.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, expected);
}

#[test]
fn q10_logs_bids_to_files_partitioned_by_day_and_minute() {
    let dir = std::env::temp_dir().join(common::unique_name("q10-files"));
    let output = format!("file://{}", dir.display());
    // 20,000 events at 100/s: 200 s of event time, so four minutes of files.
    let (ok, stdout, stderr) = skein(&[
        "nexmark", "--query", "10", "--events", "20000", "--rate", "100", "--epochs", "4",
        "--output", &output, "--verify", "--json",
    ]);
    assert!(ok, "q10 failed:\n{stderr}");
    let r = common::run_report(&stdout);
    assert_eq!(r.verified, Some(true), "{r:?}");
    assert_eq!(
        r.result_rows, 18_400,
        "46 of every 50 events are bids: {r:?}"
    );
    let day = dir.join("dt=2020-01-01");
    let mut minutes: Vec<String> = std::fs::read_dir(&day)
        .unwrap_or_else(|e| panic!("{}: {e}", day.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    minutes.sort();
    assert_eq!(minutes, ["hm=00:00", "hm=00:01", "hm=00:02", "hm=00:03"]);
    let _ = std::fs::remove_dir_all(dir);
}
