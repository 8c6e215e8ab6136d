//! The result columns of each NEXMark query as the tests declare its
//! files table: names, SQL types, and how a written value compares with
//! the reference's text.

use serde_json::Value;

use super::nexmark_reference::float;
use super::rows::parse_timestamp;

/// How a column of the result is compared.
#[derive(Clone, Copy)]
pub enum Kind {
    Int,
    Text,
    Time,
    Float,
}

impl Kind {
    pub fn sql(self) -> &'static str {
        match self {
            Kind::Int => "BIGINT",
            Kind::Text => "VARCHAR",
            Kind::Time => "TIMESTAMP",
            Kind::Float => "DOUBLE",
        }
    }

    pub fn text(self, v: &Value) -> String {
        match (self, v) {
            (_, Value::Null) => "NULL".into(),
            (Kind::Int, v) => v
                .as_i64()
                .map(|i| i.to_string())
                .unwrap_or_else(|| v.to_string()),
            (Kind::Text, Value::String(s)) => s.clone(),
            (Kind::Time, Value::String(s)) => parse_timestamp(s)
                .map(|t| t.to_string())
                .unwrap_or_else(|| s.clone()),
            (Kind::Time, v) => v.as_i64().map(|i| i.to_string()).unwrap_or_default(),
            (Kind::Float, v) => v.as_f64().map(float).unwrap_or_else(|| v.to_string()),
            (_, v) => v.to_string(),
        }
    }
}

use Kind::{Float as F, Int as I, Text as T, Time as D};

/// The columns of query `query`'s result, in order, and how each compares.
pub fn columns(query: u32) -> Vec<(&'static str, Kind)> {
    let bid = vec![
        ("auction", I),
        ("bidder", I),
        ("price", I),
        ("channel", T),
        ("url", T),
        ("date_time", D),
        ("extra", T),
    ];
    let levels = [
        ("total_bids", I),
        ("rank1_bids", I),
        ("rank2_bids", I),
        ("rank3_bids", I),
        ("total_bidders", I),
        ("rank1_bidders", I),
        ("rank2_bidders", I),
        ("rank3_bidders", I),
        ("total_auctions", I),
        ("rank1_auctions", I),
        ("rank2_auctions", I),
        ("rank3_auctions", I),
    ];
    match query {
        0 => vec![
            ("auction", I),
            ("bidder", I),
            ("price", I),
            ("date_time", D),
            ("extra", T),
        ],
        1 => vec![
            ("auction", I),
            ("bidder", I),
            ("price", F),
            ("date_time", D),
            ("extra", T),
        ],
        2 => vec![("auction", I), ("price", I)],
        5 => vec![("auction", I), ("num", I), ("window_start", D)],
        7 => vec![
            ("auction", I),
            ("price", I),
            ("bidder", I),
            ("date_time", D),
            ("window_start", D),
        ],
        8 => vec![("id", I), ("name", T), ("window_start", D)],
        11 => vec![
            ("bidder", I),
            ("bid_count", I),
            ("session_start", D),
            ("session_end", D),
        ],
        12 => vec![("bidder", I), ("bid_count", I), ("window_start", D)],
        13 => vec![
            ("auction", I),
            ("bidder", I),
            ("price", I),
            ("date_time", D),
            ("value", T),
        ],
        3 => vec![("name", T), ("city", T), ("state", T), ("id", I)],
        4 => vec![("category", I), ("avg_price", F)],
        6 => vec![
            ("seller", I),
            ("auction", I),
            ("final", I),
            ("avg_price", F),
        ],
        9 => vec![
            ("id", I),
            ("item_name", T),
            ("description", T),
            ("initial_bid", I),
            ("reserve", I),
            ("date_time", D),
            ("expires", D),
            ("seller", I),
            ("category", I),
            ("extra", T),
            ("auction", I),
            ("bidder", I),
            ("price", I),
            ("bid_date_time", D),
            ("bid_extra", T),
        ],
        14 => vec![
            ("auction", I),
            ("bidder", I),
            ("price", F),
            ("bid_time_type", T),
            ("date_time", D),
            ("extra", T),
            ("c_counts", I),
        ],
        15 => [vec![("day", T)], levels.to_vec()].concat(),
        16 => [
            vec![("channel", T), ("day", T), ("minute", T)],
            levels.to_vec(),
        ]
        .concat(),
        17 => vec![
            ("auction", I),
            ("day", T),
            ("total_bids", I),
            ("rank1_bids", I),
            ("rank2_bids", I),
            ("rank3_bids", I),
            ("min_price", I),
            ("max_price", I),
            ("avg_price", F),
            ("sum_price", I),
        ],
        18 => bid,
        19 => [bid, vec![("rank_number", I)]].concat(),
        20 => vec![
            ("auction", I),
            ("bidder", I),
            ("price", I),
            ("channel", T),
            ("url", T),
            ("bid_date_time", D),
            ("bid_extra", T),
            ("item_name", T),
            ("description", T),
            ("initial_bid", I),
            ("reserve", I),
            ("auction_date_time", D),
            ("expires", D),
            ("seller", I),
            ("category", I),
            ("auction_extra", T),
        ],
        21 => vec![
            ("auction", I),
            ("bidder", I),
            ("price", I),
            ("channel", T),
            ("channel_id", T),
        ],
        22 => vec![
            ("auction", I),
            ("bidder", I),
            ("price", I),
            ("channel", T),
            ("dir1", T),
            ("dir2", T),
            ("dir3", T),
        ],
        q => panic!("no columns for q{q}"),
    }
}
