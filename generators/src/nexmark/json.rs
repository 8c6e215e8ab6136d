//! NEXMark events as JSON records, for publishing to Kafka or Kinesis.
//!
//! Field names are those of the Arrow schemas; times (`date_time`, `expires`) are
//! integers of ms since the epoch, which Arrow's JSON reader decodes straight into
//! `Timestamp(Millisecond)` columns.

use serde::Deserialize;

use super::model::{Auction, AuctionRef, Bid, BidRef, Event, EventRef, Person, PersonRef};
use crate::error::{GeneratorError, Result};
use crate::text::{push_int, push_json_str, push_key};

/// How an event is laid out as JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JsonLayout {
    /// The record alone (`{"auction":1000,...}`): one topic or stream per table.
    #[default]
    Flat,
    /// One topic for all three tables, in the shape of the Flink NEXMark source:
    /// `{"event_type":2,"bid":{...}}` with 0 person, 1 auction, 2 bid; the other two
    /// members are absent (read as null).
    Tagged,
}

impl EventRef<'_> {
    /// Appends this event as one JSON object (no trailing newline).
    pub fn write_json(&self, layout: JsonLayout, out: &mut Vec<u8>) {
        if layout == JsonLayout::Tagged {
            out.extend_from_slice(b"{\"event_type\":");
            push_int(out, self.kind() as i64);
            out.push(b',');
            push_key(out, self.kind().table_name());
        }
        match self {
            EventRef::Person(p) => p.write_json(out),
            EventRef::Auction(a) => a.write_json(out),
            EventRef::Bid(b) => b.write_json(out),
        }
        if layout == JsonLayout::Tagged {
            out.push(b'}');
        }
    }
}

/// Writes `{"k":v,...}` from (key, value) pairs without building a map.
struct ObjectWriter<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> ObjectWriter<'o> {
    fn new(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        ObjectWriter { out, first: true }
    }

    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        push_key(self.out, key);
    }

    fn int(&mut self, key: &str, v: i64) -> &mut Self {
        self.key(key);
        push_int(self.out, v);
        self
    }

    fn str(&mut self, key: &str, v: &str) -> &mut Self {
        self.key(key);
        push_json_str(self.out, v);
        self
    }

    fn end(&mut self) {
        self.out.push(b'}');
    }
}

impl PersonRef<'_> {
    /// Appends the flat JSON record.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        ObjectWriter::new(out)
            .int("id", self.id)
            .str("name", self.name)
            .str("email_address", self.email_address)
            .str("credit_card", self.credit_card)
            .str("city", self.city)
            .str("state", self.state)
            .int("date_time", self.date_time)
            .str("extra", self.extra)
            .end();
    }
}

impl AuctionRef<'_> {
    /// Appends the flat JSON record.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        ObjectWriter::new(out)
            .int("id", self.id)
            .str("item_name", self.item_name)
            .str("description", self.description)
            .int("initial_bid", self.initial_bid)
            .int("reserve", self.reserve)
            .int("date_time", self.date_time)
            .int("expires", self.expires)
            .int("seller", self.seller)
            .int("category", self.category)
            .str("extra", self.extra)
            .end();
    }
}

impl BidRef<'_> {
    /// Appends the flat JSON record.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        ObjectWriter::new(out)
            .int("auction", self.auction)
            .int("bidder", self.bidder)
            .int("price", self.price)
            .str("channel", self.channel)
            .str("url", self.url)
            .int("date_time", self.date_time)
            .str("extra", self.extra)
            .end();
    }
}

#[derive(Deserialize)]
struct TaggedEvent {
    event_type: u8,
    person: Option<Person>,
    auction: Option<Auction>,
    bid: Option<Bid>,
}

/// Reads back one record written with [`JsonLayout::Tagged`].
pub fn parse_tagged_json(bytes: &[u8]) -> Result<Event> {
    let malformed = |detail: String| GeneratorError::Malformed {
        what: "tagged NEXMark JSON",
        detail,
    };
    let tagged: TaggedEvent =
        serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
    match (tagged.event_type, tagged.person, tagged.auction, tagged.bid) {
        (0, Some(p), None, None) => Ok(Event::Person(p)),
        (1, None, Some(a), None) => Ok(Event::Auction(a)),
        (2, None, None, Some(b)) => Ok(Event::Bid(b)),
        (t, ..) => Err(malformed(format!(
            "event_type {t} does not match its one member"
        ))),
    }
}
