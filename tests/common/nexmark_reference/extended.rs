//! NEXMark's extended queries (q14–q22) computed in plain Rust over the
//! generated events, as the references of mod.rs.

use std::collections::{BTreeMap, BTreeSet};

use skein_generators::nexmark::{Bid, Event};

use super::*;

/// q14: bids priced between 1 M and 50 M once scaled by 0.908, with the
/// part of the day they were made in and the count of 'c' in `extra`.
pub fn q14(events: &[Event]) -> Vec<Row> {
    bids(events)
        .filter_map(|b| {
            let price = 0.908 * b.price as f64;
            if !(price > 1_000_000.0 && price < 50_000_000.0) {
                return None;
            }
            let hour = b.date_time.rem_euclid(86_400_000) / 3_600_000;
            let kind = if (8..=18).contains(&hour) {
                "dayTime"
            } else if hour <= 6 || hour >= 20 {
                "nightTime"
            } else {
                "otherTime"
            };
            Some(vec![
                b.auction.to_string(),
                b.bidder.to_string(),
                float(price),
                kind.to_string(),
                b.date_time.to_string(),
                b.extra.clone(),
                b.extra.chars().filter(|c| *c == 'c').count().to_string(),
            ])
        })
        .collect()
}

/// Bids, bidders and auctions at three price levels (q15, q16).
#[derive(Default)]
struct Levels {
    bids: [i64; 4],
    bidders: [BTreeSet<i64>; 4],
    auctions: [BTreeSet<i64>; 4],
}

impl Levels {
    fn add(&mut self, b: &Bid) {
        let level = if b.price < 10_000 {
            1
        } else if b.price < 1_000_000 {
            2
        } else {
            3
        };
        for i in [0, level] {
            self.bids[i] += 1;
            self.bidders[i].insert(b.bidder);
            self.auctions[i].insert(b.auction);
        }
    }

    fn columns(&self) -> Vec<String> {
        let mut out: Vec<String> = self.bids.iter().map(i64::to_string).collect();
        out.extend(self.bidders.iter().map(|s| s.len().to_string()));
        out.extend(self.auctions.iter().map(|s| s.len().to_string()));
        out
    }
}

/// q15: per day, bids, distinct bidders and distinct auctions at three
/// price levels.
pub fn q15(events: &[Event]) -> Vec<Row> {
    let mut per: BTreeMap<String, Levels> = BTreeMap::new();
    for b in bids(events) {
        per.entry(day(b.date_time)).or_default().add(b);
    }
    per.into_iter()
        .map(|(d, l)| {
            let mut row = vec![d];
            row.extend(l.columns());
            row
        })
        .collect()
}

/// q16: q15 per channel and day, with the day's latest minute.
pub fn q16(events: &[Event]) -> Vec<Row> {
    let mut per: BTreeMap<(String, String), (String, Levels)> = BTreeMap::new();
    for b in bids(events) {
        let e = per
            .entry((b.channel.clone(), day(b.date_time)))
            .or_insert_with(|| (String::new(), Levels::default()));
        e.0 = e.0.clone().max(minute(b.date_time));
        e.1.add(b);
    }
    per.into_iter()
        .map(|((channel, d), (m, l))| {
            let mut row = vec![channel, d, m];
            row.extend(l.columns());
            row
        })
        .collect()
}

/// q17: per auction and day, bids at three price levels and the lowest,
/// highest, average and total price.
pub fn q17(events: &[Event]) -> Vec<Row> {
    #[derive(Default)]
    struct Stats {
        n: [i64; 4],
        min: Option<i64>,
        max: Option<i64>,
        sum: i64,
    }
    let mut per: BTreeMap<(i64, String), Stats> = BTreeMap::new();
    for b in bids(events) {
        let s = per.entry((b.auction, day(b.date_time))).or_default();
        let level = if b.price < 10_000 {
            1
        } else if b.price < 1_000_000 {
            2
        } else {
            3
        };
        s.n[0] += 1;
        s.n[level] += 1;
        s.min = Some(s.min.map_or(b.price, |m| m.min(b.price)));
        s.max = Some(s.max.map_or(b.price, |m| m.max(b.price)));
        s.sum += b.price;
    }
    per.into_iter()
        .map(|((auction, d), s)| {
            let mut row = vec![auction.to_string(), d];
            row.extend(s.n.iter().map(i64::to_string));
            row.push(s.min.unwrap_or_default().to_string());
            row.push(s.max.unwrap_or_default().to_string());
            row.push(float(s.sum as f64 / s.n[0] as f64));
            row.push(s.sum.to_string());
            row
        })
        .collect()
}

fn bid_row(b: &Bid) -> Row {
    vec![
        b.auction.to_string(),
        b.bidder.to_string(),
        b.price.to_string(),
        b.channel.clone(),
        b.url.clone(),
        b.date_time.to_string(),
        b.extra.clone(),
    ]
}

/// q18: each bidder's last bid on each auction (latest; then highest
/// price; then url).
pub fn q18(events: &[Event]) -> Vec<Row> {
    let mut last: BTreeMap<(i64, i64), &Bid> = BTreeMap::new();
    let rank = |b: &Bid| {
        (
            std::cmp::Reverse(b.date_time),
            std::cmp::Reverse(b.price),
            b.url.clone(),
        )
    };
    for b in bids(events) {
        match last.get(&(b.bidder, b.auction)) {
            Some(l) if rank(l) <= rank(b) => {}
            _ => {
                last.insert((b.bidder, b.auction), b);
            }
        }
    }
    last.values().map(|b| bid_row(b)).collect()
}

/// q19: the 10 highest bids of each auction with their rank (price; then
/// earliest, bidder, url).
pub fn q19(events: &[Event]) -> Vec<Row> {
    let mut per: BTreeMap<i64, Vec<&Bid>> = BTreeMap::new();
    for b in bids(events) {
        per.entry(b.auction).or_default().push(b);
    }
    let mut out = vec![];
    for list in per.values_mut() {
        list.sort_by_key(|b| {
            (
                std::cmp::Reverse(b.price),
                b.date_time,
                b.bidder,
                b.url.clone(),
            )
        });
        for (i, b) in list.iter().take(10).enumerate() {
            let mut row = bid_row(b);
            row.push((i + 1).to_string());
            out.push(row);
        }
    }
    out
}

/// q20: bids with their auction, for auctions in category 10.
pub fn q20(events: &[Event]) -> Vec<Row> {
    let tens: BTreeMap<i64, Vec<&Auction>> =
        auctions(events)
            .filter(|a| a.category == 10)
            .fold(BTreeMap::new(), |mut m, a| {
                m.entry(a.id).or_insert_with(Vec::new).push(a);
                m
            });
    let mut out = vec![];
    for b in bids(events) {
        for a in tens.get(&b.auction).into_iter().flatten() {
            out.push(vec![
                b.auction.to_string(),
                b.bidder.to_string(),
                b.price.to_string(),
                b.channel.clone(),
                b.url.clone(),
                b.date_time.to_string(),
                b.extra.clone(),
                a.item_name.clone(),
                a.description.clone(),
                a.initial_bid.to_string(),
                a.reserve.to_string(),
                a.date_time.to_string(),
                a.expires.to_string(),
                a.seller.to_string(),
                a.category.to_string(),
                a.extra.clone(),
            ]);
        }
    }
    out
}

/// The `channel_id` parameter of a url: after `channel_id=` at the start
/// or after `&`, up to the next `&`.
pub fn channel_id_param(url: &str) -> Option<String> {
    let mut from = 0;
    while let Some(at) = url[from..].find("channel_id=") {
        let start = from + at;
        if start == 0 || url.as_bytes()[start - 1] == b'&' {
            let value = &url[start + "channel_id=".len()..];
            return Some(value.split('&').next().unwrap_or_default().to_string());
        }
        from = start + 1;
    }
    None
}

/// q21: a channel id per bid: fixed for the four hot channels, else the
/// url's `channel_id`; bids with neither are left out.
pub fn q21(events: &[Event]) -> Vec<Row> {
    bids(events)
        .filter_map(|b| {
            let fixed = match b.channel.to_lowercase().as_str() {
                "apple" => Some("0"),
                "google" => Some("1"),
                "facebook" => Some("2"),
                "baidu" => Some("3"),
                _ => None,
            };
            let id = match fixed {
                Some(f) => f.to_string(),
                None => channel_id_param(&b.url)?,
            };
            Some(vec![
                b.auction.to_string(),
                b.bidder.to_string(),
                b.price.to_string(),
                b.channel.clone(),
                id,
            ])
        })
        .collect()
}

/// q22: the first three directories of each bid's url.
pub fn q22(events: &[Event]) -> Vec<Row> {
    bids(events)
        .map(|b| {
            let parts: Vec<&str> = b.url.split('/').collect();
            let part = |i: usize| parts.get(i).copied().unwrap_or_default().to_string();
            vec![
                b.auction.to_string(),
                b.bidder.to_string(),
                b.price.to_string(),
                b.channel.clone(),
                part(3),
                part(4),
                part(5),
            ]
        })
        .collect()
}
