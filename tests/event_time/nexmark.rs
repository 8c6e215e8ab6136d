//! NEXMark q5, q7 and q8 published with `skein gen`, read from Kafka with
//! event time, checked against references computed here from the same
//! generated events (no engine code). Results go to a files sink.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::common::nexmark_topics::NexmarkTopics;
use crate::common::rows::{int, millis, read_rows, text};
use skein_generators::nexmark::Event;

use crate::common::event_time::*;

// ---------------------------------------------------------------------------
// NEXMark q5, q7 and q8 from Kafka.

/// 40 s of event time at the generator's 10,000 events/s.
const NEXMARK_EVENTS: u64 = 400_000;

/// The NEXMark topics every test here reads, published once.
fn nexmark_topics() -> &'static NexmarkTopics {
    static TOPICS: OnceLock<NexmarkTopics> = OnceLock::new();
    TOPICS
        .get_or_init(|| common::nexmark_topics::publish("event-time-nexmark", NEXMARK_EVENTS, None))
}

fn bids(events: &[Event]) -> impl Iterator<Item = (i64, i64, i64, i64)> + '_ {
    events.iter().filter_map(|e| match e {
        Event::Bid(b) => Some((b.auction, b.bidder, b.price, b.date_time)),
        _ => None,
    })
}

/// q5: per 10 s window sliding every 5 s, the auction(s) with the most
/// bids: (auction, bids, window start).
fn q5_reference(events: &[Event]) -> Vec<(i64, i64, i64)> {
    let mut counts: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    for (auction, _, _, t) in bids(events) {
        for w in hop_starts(t, 5_000, 10_000) {
            *counts.entry((w, auction)).or_default() += 1;
        }
    }
    let mut top: BTreeMap<i64, i64> = BTreeMap::new();
    for ((w, _), n) in &counts {
        let m = top.entry(*w).or_default();
        *m = (*m).max(*n);
    }
    counts
        .into_iter()
        .filter(|((w, _), n)| top[w] == *n)
        .map(|((w, auction), n)| (auction, n, w))
        .collect()
}

/// q7: per 10 s tumbling window, the bid(s) with the top price:
/// (auction, price, bidder, date_time, window start).
fn q7_reference(events: &[Event]) -> Vec<(i64, i64, i64, i64, i64)> {
    let mut top: BTreeMap<i64, i64> = BTreeMap::new();
    for (_, _, price, t) in bids(events) {
        let m = top.entry(tumble_start(t, 10_000)).or_insert(price);
        *m = (*m).max(price);
    }
    bids(events)
        .filter(|(_, _, price, t)| top[&tumble_start(*t, 10_000)] == *price)
        .map(|(auction, bidder, price, t)| (auction, price, bidder, t, tumble_start(t, 10_000)))
        .collect()
}

/// q8: people who registered and opened an auction in the same 10 s
/// tumbling window: (id, name, window start), once each.
fn q8_reference(events: &[Event]) -> Vec<(i64, String, i64)> {
    let mut people: BTreeSet<(i64, i64, String)> = BTreeSet::new();
    let mut sellers: BTreeSet<(i64, i64)> = BTreeSet::new();
    for e in events {
        match e {
            Event::Person(p) => {
                people.insert((tumble_start(p.date_time, 10_000), p.id, p.name.clone()));
            }
            Event::Auction(a) => {
                sellers.insert((tumble_start(a.date_time, 10_000), a.seller));
            }
            Event::Bid(_) => {}
        }
    }
    people
        .into_iter()
        .filter(|(w, id, _)| sellers.contains(&(*w, *id)))
        .map(|(w, id, name)| (id, name, w))
        .collect()
}

/// The text of queries/nexmark/qN.sql over Kafka tables of the NEXMark
/// topics, into a files table with `out_columns`; returns the output
/// directory.
fn run_nexmark(query: u32, out_columns: &str, group_size: usize) -> PathBuf {
    let topics = nexmark_topics();
    let p = &topics.prefix;
    let event_time = [("event_time", "date_time".to_string())];
    let tables = match query {
        8 => [
            kafka_table(
                "person",
                "id BIGINT, name VARCHAR, date_time TIMESTAMP",
                &format!("{p}-person"),
                &event_time,
            ),
            kafka_table(
                "auction",
                "id BIGINT, seller BIGINT, date_time TIMESTAMP",
                &format!("{p}-auction"),
                &event_time,
            ),
        ]
        .concat(),
        _ => kafka_table(
            "bid",
            "auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP",
            &format!("{p}-bid"),
            &event_time,
        ),
    };
    let path = common::repo_path(&format!("queries/nexmark/q{query}.sql"));
    let body = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let (dir, sink) = files_table(out_columns);
    run_drained(
        &format!("nexmark-q{query}"),
        &format!("{tables}{sink}INSERT INTO out\n{body}"),
        group_size,
    );
    dir
}

fn check_q5(group_size: usize) {
    let dir = run_nexmark(
        5,
        "auction BIGINT, num BIGINT, window_start TIMESTAMP",
        group_size,
    );
    let got: Vec<_> = read_rows(&dir, true)
        .iter()
        .map(|r| (int(r, "auction"), int(r, "num"), millis(r, "window_start")))
        .collect();
    let want = q5_reference(&nexmark_topics().events);
    assert_same_rows(&format!("NEXMark q5, group size {group_size}"), &got, &want);
}

fn check_q7(group_size: usize) {
    let dir = run_nexmark(
        7,
        "auction BIGINT, price BIGINT, bidder BIGINT, date_time TIMESTAMP, window_start TIMESTAMP",
        group_size,
    );
    let got: Vec<_> = read_rows(&dir, true)
        .iter()
        .map(|r| {
            (
                int(r, "auction"),
                int(r, "price"),
                int(r, "bidder"),
                millis(r, "date_time"),
                millis(r, "window_start"),
            )
        })
        .collect();
    let want = q7_reference(&nexmark_topics().events);
    assert_same_rows(&format!("NEXMark q7, group size {group_size}"), &got, &want);
}

fn check_q8(group_size: usize) {
    let dir = run_nexmark(
        8,
        "id BIGINT, name VARCHAR, window_start TIMESTAMP",
        group_size,
    );
    let got: Vec<_> = read_rows(&dir, true)
        .iter()
        .map(|r| (int(r, "id"), text(r, "name"), millis(r, "window_start")))
        .collect();
    let want = q8_reference(&nexmark_topics().events);
    assert_same_rows(&format!("NEXMark q8, group size {group_size}"), &got, &want);
}

// The default group size (8) is what the issue asks for; group size 1 is
// the configuration known to be right and checks the references.

#[test]
fn nexmark_q5_from_kafka_default_group_size() {
    check_q5(8);
}

#[test]
fn nexmark_q7_from_kafka_default_group_size() {
    check_q7(8);
}

#[test]
fn nexmark_q8_from_kafka_default_group_size() {
    check_q8(8);
}

#[test]
fn nexmark_q5_from_kafka_group_size_1() {
    check_q5(1);
}

#[test]
fn nexmark_q7_from_kafka_group_size_1() {
    check_q7(1);
}

#[test]
fn nexmark_q8_from_kafka_group_size_1() {
    check_q8(1);
}
