//! NEXMark's queries (q0–q9 and q11–q22; q10 writes files and is checked
//! where it runs) computed here, in plain Rust over the generated events: no
//! engine, no DataFusion, none of our functions. Each reference gives the query's final table as rows of
//! text, one string per column in the query's column order: integers in
//! decimal, timestamps as epoch milliseconds, floats rounded to three
//! decimals (see [`float`]). q14–q22 are in extended.rs.

use std::collections::{BTreeMap, BTreeSet};

use skein_generators::nexmark::{Auction, Bid, Event, Person};

/// A row of a query's result, as text.
pub type Row = Vec<String>;

/// How a float column compares: three decimals (prices are integers, so
/// their averages are exact to far more).
pub fn float(x: f64) -> String {
    format!("{:.3}", x)
}

fn persons(events: &[Event]) -> impl Iterator<Item = &Person> {
    events.iter().filter_map(|e| match e {
        Event::Person(p) => Some(p),
        _ => None,
    })
}

fn auctions(events: &[Event]) -> impl Iterator<Item = &Auction> {
    events.iter().filter_map(|e| match e {
        Event::Auction(a) => Some(a),
        _ => None,
    })
}

fn bids(events: &[Event]) -> impl Iterator<Item = &Bid> {
    events.iter().filter_map(|e| match e {
        Event::Bid(b) => Some(b),
        _ => None,
    })
}

/// The UTC calendar date of epoch milliseconds as `YYYY-MM-DD`
/// (days-from-civil inverted, proleptic Gregorian).
pub fn day(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `HH:MM` (UTC) of epoch milliseconds.
pub fn minute(ms: i64) -> String {
    let of_day = ms.rem_euclid(86_400_000);
    format!("{:02}:{:02}", of_day / 3_600_000, (of_day / 60_000) % 60)
}

/// The start of the tumbling window of `size` ms holding `t`.
fn window_of(t: i64, size: i64) -> i64 {
    t - t.rem_euclid(size)
}

/// A bid's auction, bidder, price and time, then `last`.
fn bid_with(b: &Bid, last: String) -> Row {
    vec![
        b.auction.to_string(),
        b.bidder.to_string(),
        b.price.to_string(),
        b.date_time.to_string(),
        last,
    ]
}

/// q0: every bid, passed through.
pub fn q0(events: &[Event]) -> Vec<Row> {
    bids(events).map(|b| bid_with(b, b.extra.clone())).collect()
}

/// q1: every bid with its price in euros (0.908 per dollar).
pub fn q1(events: &[Event]) -> Vec<Row> {
    bids(events)
        .map(|b| {
            vec![
                b.auction.to_string(),
                b.bidder.to_string(),
                float(0.908 * b.price as f64),
                b.date_time.to_string(),
                b.extra.clone(),
            ]
        })
        .collect()
}

/// q2: the bids on every 123rd auction.
pub fn q2(events: &[Event]) -> Vec<Row> {
    bids(events)
        .filter(|b| b.auction % 123 == 0)
        .map(|b| vec![b.auction.to_string(), b.price.to_string()])
        .collect()
}

/// q5: per 10 s window sliding by 5 s, the auctions with the most bids.
pub fn q5(events: &[Event]) -> Vec<Row> {
    let mut counts: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    for b in bids(events) {
        // The two windows [s, s + 10 s) with s a multiple of 5 s holding t.
        let last = window_of(b.date_time, 5_000);
        for start in [last - 5_000, last] {
            *counts.entry((start, b.auction)).or_default() += 1;
        }
    }
    let mut most: BTreeMap<i64, i64> = BTreeMap::new();
    for (&(start, _), &n) in &counts {
        let m = most.entry(start).or_default();
        *m = (*m).max(n);
    }
    counts
        .into_iter()
        .filter(|((start, _), n)| most[start] == *n)
        .map(|((start, auction), n)| vec![auction.to_string(), n.to_string(), start.to_string()])
        .collect()
}

/// q7: per 10 s window, the bids at the window's highest price.
pub fn q7(events: &[Event]) -> Vec<Row> {
    let mut highest: BTreeMap<i64, i64> = BTreeMap::new();
    for b in bids(events) {
        let m = highest
            .entry(window_of(b.date_time, 10_000))
            .or_insert(i64::MIN);
        *m = (*m).max(b.price);
    }
    bids(events)
        .filter(|b| highest[&window_of(b.date_time, 10_000)] == b.price)
        .map(|b| {
            vec![
                b.auction.to_string(),
                b.price.to_string(),
                b.bidder.to_string(),
                b.date_time.to_string(),
                window_of(b.date_time, 10_000).to_string(),
            ]
        })
        .collect()
}

/// q8: people who opened an auction in the 10 s window they registered in.
pub fn q8(events: &[Event]) -> Vec<Row> {
    let sellers: BTreeSet<(i64, i64)> = auctions(events)
        .map(|a| (window_of(a.date_time, 10_000), a.seller))
        .collect();
    let people: BTreeSet<(i64, i64, &str)> = persons(events)
        .map(|p| (window_of(p.date_time, 10_000), p.id, p.name.as_str()))
        .collect();
    people
        .into_iter()
        .filter(|(w, id, _)| sellers.contains(&(*w, *id)))
        .map(|(w, id, name)| vec![id.to_string(), name.to_string(), w.to_string()])
        .collect()
}

/// q11: each bidder's sessions (a gap over 10 s ends one): bids, start, end.
pub fn q11(events: &[Event]) -> Vec<Row> {
    let mut times: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for b in bids(events) {
        times.entry(b.bidder).or_default().push(b.date_time);
    }
    let mut rows = vec![];
    for (bidder, mut ts) in times {
        ts.sort_unstable();
        let mut session: Vec<i64> = vec![];
        let mut flush = |session: &mut Vec<i64>| {
            if let (Some(first), Some(last)) = (session.first(), session.last()) {
                rows.push(vec![
                    bidder.to_string(),
                    session.len().to_string(),
                    first.to_string(),
                    (last + 10_000).to_string(),
                ]);
            }
            session.clear();
        };
        for t in ts {
            if session.last().is_some_and(|&prev| t - prev > 10_000) {
                flush(&mut session);
            }
            session.push(t);
        }
        flush(&mut session);
    }
    rows
}

/// q12: bids per bidder per 10 s window.
pub fn q12(events: &[Event]) -> Vec<Row> {
    let mut counts: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    for b in bids(events) {
        *counts
            .entry((b.bidder, window_of(b.date_time, 10_000)))
            .or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((bidder, w), n)| vec![bidder.to_string(), n.to_string(), w.to_string()])
        .collect()
}

/// q13: every bid joined with the side input `side-<auction mod 10000>`.
pub fn q13(events: &[Event]) -> Vec<Row> {
    bids(events)
        .map(|b| bid_with(b, format!("side-{}", b.auction.rem_euclid(10_000))))
        .collect()
}

/// q3: sellers in Oregon, Idaho or California with auctions in category 10.
pub fn q3(events: &[Event]) -> Vec<Row> {
    let people: BTreeMap<i64, &Person> = persons(events)
        .filter(|p| ["OR", "ID", "CA"].contains(&p.state.as_str()))
        .map(|p| (p.id, p))
        .collect();
    auctions(events)
        .filter(|a| a.category == 10)
        .filter_map(|a| {
            let p = people.get(&a.seller)?;
            Some(vec![
                p.name.clone(),
                p.city.clone(),
                p.state.clone(),
                a.id.to_string(),
            ])
        })
        .collect()
}

/// The highest price bid on each auction during its lifetime (inclusive).
fn winning_prices(events: &[Event]) -> BTreeMap<i64, i64> {
    let lifetimes: BTreeMap<i64, (i64, i64)> = auctions(events)
        .map(|a| (a.id, (a.date_time, a.expires)))
        .collect();
    let mut best: BTreeMap<i64, i64> = BTreeMap::new();
    for b in bids(events) {
        let Some((from, to)) = lifetimes.get(&b.auction) else {
            continue;
        };
        if b.date_time >= *from && b.date_time <= *to {
            let e = best.entry(b.auction).or_insert(b.price);
            *e = (*e).max(b.price);
        }
    }
    best
}

/// q4: the average winning price per category.
pub fn q4(events: &[Event]) -> Vec<Row> {
    let best = winning_prices(events);
    let mut per: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for a in auctions(events) {
        if let Some(price) = best.get(&a.id) {
            let e = per.entry(a.category).or_default();
            e.0 += price;
            e.1 += 1;
        }
    }
    per.into_iter()
        .map(|(c, (sum, n))| vec![c.to_string(), float(sum as f64 / n as f64)])
        .collect()
}

/// q6: per seller, each winning price with the average of that seller's
/// last (up to) 10 winning prices, auctions ordered by expiry then id.
pub fn q6(events: &[Event]) -> Vec<Row> {
    let best = winning_prices(events);
    let mut per_seller: BTreeMap<i64, Vec<(i64, i64, i64)>> = BTreeMap::new();
    for a in auctions(events) {
        if let Some(price) = best.get(&a.id) {
            per_seller
                .entry(a.seller)
                .or_default()
                .push((a.expires, a.id, *price));
        }
    }
    let mut out = vec![];
    for (seller, mut list) in per_seller {
        list.sort();
        for i in 0..list.len() {
            let window = &list[i.saturating_sub(9)..=i];
            let avg = window.iter().map(|x| x.2).sum::<i64>() as f64 / window.len() as f64;
            out.push(vec![
                seller.to_string(),
                list[i].1.to_string(),
                list[i].2.to_string(),
                float(avg),
            ]);
        }
    }
    out
}

/// q9: each auction with its winning bid (highest price; then earliest,
/// then bidder, channel and url).
pub fn q9(events: &[Event]) -> Vec<Row> {
    let mut winner: BTreeMap<i64, &Bid> = BTreeMap::new();
    let lifetimes: BTreeMap<i64, &Auction> = auctions(events).map(|a| (a.id, a)).collect();
    let rank = |b: &Bid| {
        (
            std::cmp::Reverse(b.price),
            b.date_time,
            b.bidder,
            b.channel.clone(),
            b.url.clone(),
        )
    };
    for b in bids(events) {
        let Some(a) = lifetimes.get(&b.auction) else {
            continue;
        };
        if b.date_time < a.date_time || b.date_time > a.expires {
            continue;
        }
        match winner.get(&a.id) {
            Some(w) if rank(w) <= rank(b) => {}
            _ => {
                winner.insert(a.id, b);
            }
        }
    }
    winner
        .into_iter()
        .map(|(id, b)| {
            let a = lifetimes[&id];
            vec![
                a.id.to_string(),
                a.item_name.clone(),
                a.description.clone(),
                a.initial_bid.to_string(),
                a.reserve.to_string(),
                a.date_time.to_string(),
                a.expires.to_string(),
                a.seller.to_string(),
                a.category.to_string(),
                a.extra.clone(),
                b.auction.to_string(),
                b.bidder.to_string(),
                b.price.to_string(),
                b.date_time.to_string(),
                b.extra.clone(),
            ]
        })
        .collect()
}

mod extended;
// Only the test files that check q14–q22 use these.
#[allow(unused_imports)]
pub use extended::*;
