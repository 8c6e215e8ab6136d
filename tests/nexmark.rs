//! NEXMark q0–q13 through the payload-chained stage DAG: every query agrees
//! with single-process DataFusion on 100,000 events with groups of 4, and a
//! few agree with results computed here, by hand, from the generator's events.

use std::collections::BTreeMap;

use skein_generators::nexmark::{EventRef, NexmarkConfig, NexmarkGenerator};

mod common;
use common::skein;

/// Run query `n` on 100,000 events, groups of 4, and check it verifies.
fn verifies(query: u32) {
    let q = query.to_string();
    let (ok, stdout, stderr) = skein(&[
        "nexmark",
        "--query",
        &q,
        "--events",
        "100000",
        // 100 s of event time: ten 10 s windows, many sessions.
        "--rate",
        "1000",
        "--group-size",
        "4",
        "--epochs",
        "5",
        "--verify",
        "--json",
    ]);
    assert!(ok, "q{query} failed:\n{stderr}");
    let line = stdout.lines().last().expect("a summary line");
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON summary");
    assert_eq!(v["verified"], true, "q{query}: {line}");
    assert_eq!(v["query"], query, "{line}");
    assert!(v["stages"].as_u64().unwrap() >= 1, "{line}");
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

/// Query `n` on the tiny stream: its result rows as maps column -> text,
/// read from the printed table.
fn tiny_rows(query: u32) -> Vec<BTreeMap<String, String>> {
    let (ok, stdout, stderr) = skein(&[
        "nexmark",
        "--query",
        &query.to_string(),
        "--events",
        &TINY_EVENTS.to_string(),
        "--rate",
        &TINY_RATE.to_string(),
        "--group-size",
        "2",
        "--epochs",
        "4",
        "--show",
        "100000",
    ]);
    assert!(ok, "q{query}: {stderr}");
    let mut lines = stdout.lines().filter(|l| l.starts_with('|')).map(|l| {
        l.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect::<Vec<_>>()
    });
    let Some(header) = lines.next() else {
        return vec![]; // no rows: no table
    };
    lines
        .map(|cells| header.iter().cloned().zip(cells).collect())
        .collect()
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
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(
        v["result_rows"], 18_400,
        "46 of every 50 events are bids: {v}"
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
