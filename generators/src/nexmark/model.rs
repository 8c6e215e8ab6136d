//! The three NEXMark record types, borrowed (as the generator produces them) and owned.
//!
//! Field names follow the snake_case spelling of the Flink/Beam schemas
//! (`emailAddress` -> `email_address`, `dateTime` -> `date_time`, ...). Times are
//! milliseconds since the Unix epoch; prices are in cents.

use serde::{Deserialize, Serialize};

/// Which of the three tables an event belongs to. The discriminant is the `event_type`
/// value of the Flink NEXMark source (0 person, 1 auction, 2 bid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Person = 0,
    Auction = 1,
    Bid = 2,
}

impl EventKind {
    /// The table name used for this kind: `person`, `auction` or `bid`.
    pub fn table_name(self) -> &'static str {
        match self {
            EventKind::Person => "person",
            EventKind::Auction => "auction",
            EventKind::Bid => "bid",
        }
    }
}

/// A new person registering with the auction site, borrowing the generator's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersonRef<'a> {
    pub id: i64,
    pub name: &'a str,
    pub email_address: &'a str,
    pub credit_card: &'a str,
    pub city: &'a str,
    pub state: &'a str,
    pub date_time: i64,
    pub extra: &'a str,
}

/// A new auction, borrowing the generator's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuctionRef<'a> {
    pub id: i64,
    pub item_name: &'a str,
    pub description: &'a str,
    pub initial_bid: i64,
    pub reserve: i64,
    pub date_time: i64,
    pub expires: i64,
    pub seller: i64,
    pub category: i64,
    pub extra: &'a str,
}

/// A bid on an auction, borrowing the generator's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BidRef<'a> {
    pub auction: i64,
    pub bidder: i64,
    pub price: i64,
    pub channel: &'a str,
    pub url: &'a str,
    pub date_time: i64,
    pub extra: &'a str,
}

/// One generated event; valid until the generator produces the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRef<'a> {
    Person(PersonRef<'a>),
    Auction(AuctionRef<'a>),
    Bid(BidRef<'a>),
}

impl EventRef<'_> {
    pub fn kind(&self) -> EventKind {
        match self {
            EventRef::Person(_) => EventKind::Person,
            EventRef::Auction(_) => EventKind::Auction,
            EventRef::Bid(_) => EventKind::Bid,
        }
    }

    /// The event time in ms since the epoch.
    pub fn date_time(&self) -> i64 {
        match self {
            EventRef::Person(p) => p.date_time,
            EventRef::Auction(a) => a.date_time,
            EventRef::Bid(b) => b.date_time,
        }
    }

    /// An owned copy (allocates; for tests and slow paths).
    pub fn to_owned_event(&self) -> Event {
        match *self {
            EventRef::Person(p) => Event::Person(Person {
                id: p.id,
                name: p.name.to_owned(),
                email_address: p.email_address.to_owned(),
                credit_card: p.credit_card.to_owned(),
                city: p.city.to_owned(),
                state: p.state.to_owned(),
                date_time: p.date_time,
                extra: p.extra.to_owned(),
            }),
            EventRef::Auction(a) => Event::Auction(Auction {
                id: a.id,
                item_name: a.item_name.to_owned(),
                description: a.description.to_owned(),
                initial_bid: a.initial_bid,
                reserve: a.reserve,
                date_time: a.date_time,
                expires: a.expires,
                seller: a.seller,
                category: a.category,
                extra: a.extra.to_owned(),
            }),
            EventRef::Bid(b) => Event::Bid(Bid {
                auction: b.auction,
                bidder: b.bidder,
                price: b.price,
                channel: b.channel.to_owned(),
                url: b.url.to_owned(),
                date_time: b.date_time,
                extra: b.extra.to_owned(),
            }),
        }
    }
}

/// Owned person record; its serde form is the flat JSON record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    pub id: i64,
    pub name: String,
    pub email_address: String,
    pub credit_card: String,
    pub city: String,
    pub state: String,
    pub date_time: i64,
    pub extra: String,
}

/// Owned auction record; its serde form is the flat JSON record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auction {
    pub id: i64,
    pub item_name: String,
    pub description: String,
    pub initial_bid: i64,
    pub reserve: i64,
    pub date_time: i64,
    pub expires: i64,
    pub seller: i64,
    pub category: i64,
    pub extra: String,
}

/// Owned bid record; its serde form is the flat JSON record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bid {
    pub auction: i64,
    pub bidder: i64,
    pub price: i64,
    pub channel: String,
    pub url: String,
    pub date_time: i64,
    pub extra: String,
}

/// An owned event of any kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Person(Person),
    Auction(Auction),
    Bid(Bid),
}

impl Event {
    pub fn kind(&self) -> EventKind {
        match self {
            Event::Person(_) => EventKind::Person,
            Event::Auction(_) => EventKind::Auction,
            Event::Bid(_) => EventKind::Bid,
        }
    }

    pub fn date_time(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }
}
