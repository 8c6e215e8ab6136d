//! The NEXMark auction-site generator: people, auctions and bids.
//!
//! Semantics follow the generators of nexmark/nexmark (Flink) and Apache Beam:
//!
//! * Event ids `e = first_event_id + n` (n = event number, from 0) cycle through blocks
//!   of `person + auction + bid` proportions (1 : 3 : 46 by default): within each block
//!   of 50, the first event is a person, the next 3 are auctions, the remaining 46 bids.
//! * Person and auction ids are dense and start at 1000; ids follow from the event id,
//!   so no state is carried from event to event. Categories are 10 ..= 14.
//! * Auctions pick a "hot" seller (the first person of the latest batch of 100) with
//!   probability `1 - 1/hot_sellers_ratio`, else a random person among the latest
//!   `num_active_people` (plus 10 not yet created). Bids pick a hot auction with
//!   probability `1 - 1/hot_auction_ratio` and a hot bidder (the second person of the
//!   latest batch of 100) with probability `1 - 1/hot_bidders_ratio`; otherwise a random
//!   auction among the latest `num_in_flight_auctions` (plus 10 ahead) or a random active
//!   person.
//! * Event `n` happens at `base_time + trunc(n * inter_event_delay_us) / 1000` ms, with
//!   `inter_event_delay_us = 1e6 / first_event_rate`.
//!
//! What differs on purpose: our random numbers come from our own seeded generator, one
//! per event (as Beam seeds one per event id), so values differ from Java's while their
//! distributions match; bid channel URLs are fixed per seed rather than per JVM; and the
//! bidder id is offset by 1000 once (one Flink version adds the offset twice, which makes
//! bidders miss the person table).
//!
//! **Splitting.** [`Slice`] `i` of `N` produces the event numbers `i, i + N, i + 2N, ...`.
//! Every event is a pure function of (config, event number), so the union of the N
//! slices is exactly the single-instance stream, and all slices advance through event
//! time together (their watermarks stay close).

mod arrow;
mod json;
mod model;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::Slice;
use crate::error::{GeneratorError, Result};
use crate::rng::ItemRng;
use crate::text;

pub use arrow::{
    NexmarkBatchBuilder, NexmarkBatches, auction_schema, bid_schema, person_schema, schema_for,
};
pub use json::{JsonLayout, parse_tagged_json};
pub use model::{Auction, AuctionRef, Bid, BidRef, Event, EventKind, EventRef, Person, PersonRef};

/// The first person id (ids are dense from here).
pub const FIRST_PERSON_ID: i64 = 1000;
/// The first auction id (ids are dense from here).
pub const FIRST_AUCTION_ID: i64 = 1000;
/// The first category id; categories are `FIRST_CATEGORY_ID .. FIRST_CATEGORY_ID + NUM_CATEGORIES`.
pub const FIRST_CATEGORY_ID: i64 = 10;
/// How many categories auctions are spread over.
pub const NUM_CATEGORIES: i64 = 5;
/// How many not-yet-created person ids a random seller or bidder may reference.
pub const PERSON_ID_LEAD: i64 = 10;
/// How many not-yet-created auction ids a random bid may reference.
pub const AUCTION_ID_LEAD: i64 = 10;
/// Hot sellers, bidders and auctions are taken from the latest batch of this many ids.
pub const HOT_ID_BATCH: i64 = 100;
/// The channels that get half of all bids.
pub const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
/// One bid in this many goes to a non-hot channel.
pub const HOT_CHANNELS_RATIO: u64 = 2;
/// Non-hot bids are spread over this many channels, named `channel-<k>`.
pub const CHANNELS_NUMBER: u64 = 10_000;
/// States a person may live in (kept few so that q3 finds matches on small inputs).
pub const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
/// Cities a person may live in.
pub const US_CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
/// First names of people.
pub const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
/// Last names of people.
pub const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
/// Default event time of event 0: 2020-01-01T00:00:00Z. Fixed, so runs are repeatable;
/// set `base_time_ms` to the wall clock for live runs.
pub const DEFAULT_BASE_TIME_MS: i64 = 1_577_836_800_000;

// Names of the independent random streams derived from one seed.
const EVENT_STREAM: u64 = 0x6e78_6576_656e_7401; // "nxevent"
const CHANNEL_STREAM: u64 = 0x6e78_6368_616e_6e02; // "nxchann"
const HOT_URL_STREAM: u64 = 0x6e78_686f_7475_7203; // "nxhotur"

/// Generator parameters. Defaults are those of the reference `NexmarkConfiguration`,
/// except `base_time_ms`, which is fixed for repeatability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NexmarkConfig {
    /// Seed of every random choice; the same seed gives the same stream.
    pub seed: u64,
    /// Event time of event number 0, ms since the epoch.
    pub base_time_ms: i64,
    /// Events per second of event time (the whole stream, not per slice).
    pub first_event_rate: u64,
    /// Id of event number 0; ids (and so the person/auction/bid pattern) start here.
    pub first_event_id: u64,
    /// Total events of the whole stream; `None` for unbounded.
    pub max_events: Option<u64>,
    pub person_proportion: u32,
    pub auction_proportion: u32,
    pub bid_proportion: u32,
    /// Average sizes in bytes that the `extra` padding tops each record up to.
    pub avg_person_byte_size: u32,
    pub avg_auction_byte_size: u32,
    pub avg_bid_byte_size: u32,
    /// A bid goes to a hot auction with probability 1 - 1/this.
    pub hot_auction_ratio: u32,
    /// An auction is by a hot seller with probability 1 - 1/this.
    pub hot_sellers_ratio: u32,
    /// A bid is by a hot bidder with probability 1 - 1/this.
    pub hot_bidders_ratio: u32,
    /// Auctions considered in flight when choosing a random auction for a bid.
    pub num_in_flight_auctions: u32,
    /// People considered active when choosing a random seller or bidder.
    pub num_active_people: u32,
}

impl Default for NexmarkConfig {
    fn default() -> Self {
        NexmarkConfig {
            seed: 0,
            base_time_ms: DEFAULT_BASE_TIME_MS,
            first_event_rate: 10_000,
            first_event_id: 0,
            max_events: None,
            person_proportion: 1,
            auction_proportion: 3,
            bid_proportion: 46,
            avg_person_byte_size: 200,
            avg_auction_byte_size: 500,
            avg_bid_byte_size: 100,
            hot_auction_ratio: 2,
            hot_sellers_ratio: 4,
            hot_bidders_ratio: 4,
            num_in_flight_auctions: 100,
            num_active_people: 1000,
        }
    }
}

impl NexmarkConfig {
    /// Checks every value the generator divides by or indexes with.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("first_event_rate", self.first_event_rate),
            ("person_proportion", u64::from(self.person_proportion)),
            ("auction_proportion", u64::from(self.auction_proportion)),
            ("hot_auction_ratio", u64::from(self.hot_auction_ratio)),
            ("hot_sellers_ratio", u64::from(self.hot_sellers_ratio)),
            ("hot_bidders_ratio", u64::from(self.hot_bidders_ratio)),
            (
                "num_in_flight_auctions",
                u64::from(self.num_in_flight_auctions),
            ),
            ("num_active_people", u64::from(self.num_active_people)),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(GeneratorError::InvalidConfig(format!(
                "{name} must be at least 1"
            )));
        }
        if self.first_event_id > i64::MAX as u64 / 2 {
            return Err(GeneratorError::InvalidConfig(
                "first_event_id is too large".into(),
            ));
        }
        Ok(())
    }

    /// Microseconds of event time between consecutive events of the whole stream.
    pub fn inter_event_delay_us(&self) -> f64 {
        1_000_000.0 / self.first_event_rate as f64
    }

    /// Events per block (50 by default).
    pub fn total_proportion(&self) -> u64 {
        u64::from(self.person_proportion)
            + u64::from(self.auction_proportion)
            + u64::from(self.bid_proportion)
    }
}

/// The validated configuration with what is derived from it, shared by all slices.
#[derive(Debug)]
struct Model {
    config: NexmarkConfig,
    delay_us: f64,
    person: i64,
    auction: i64,
    total: i64,
    /// Events between an auction and the one `num_in_flight_auctions` later.
    events_per_in_flight_window: u64,
    channels: ChannelTable,
}

impl Model {
    fn new(config: NexmarkConfig) -> Result<Self> {
        config.validate()?;
        let total = config.total_proportion();
        Ok(Model {
            delay_us: config.inter_event_delay_us(),
            person: i64::from(config.person_proportion),
            auction: i64::from(config.auction_proportion),
            total: total as i64,
            events_per_in_flight_window: u64::from(config.num_in_flight_auctions) * total
                / u64::from(config.auction_proportion),
            channels: ChannelTable::new(config.seed),
            config,
        })
    }

    fn timestamp(&self, event_number: u64) -> i64 {
        self.config.base_time_ms + ((event_number as f64 * self.delay_us) as i64) / 1000
    }

    /// Where event `event_id` falls in the repeating block of proportions.
    fn locate(&self, event_id: i64) -> BlockPosition {
        BlockPosition {
            block: event_id / self.total,
            offset: event_id % self.total,
        }
    }

    fn kind_at(&self, at: BlockPosition) -> EventKind {
        let offset = at.offset;
        if offset < self.person {
            EventKind::Person
        } else if offset < self.person + self.auction {
            EventKind::Auction
        } else {
            EventKind::Bid
        }
    }

    /// The newest person id (from 0) as of the event at `at`: the person being created
    /// if this is a person event.
    fn last_person(&self, at: BlockPosition) -> i64 {
        at.block * self.person + at.offset.min(self.person - 1)
    }

    /// The newest auction id (from 0) as of the event at `at`; -1 before the first auction.
    fn last_auction(&self, at: BlockPosition) -> i64 {
        if at.offset < self.person {
            // Person events come first in a block: the newest auction is the previous block's last.
            at.block * self.auction - 1
        } else {
            at.block * self.auction + (at.offset - self.person).min(self.auction - 1)
        }
    }

    /// A random person (from 0) among the active ones, or a few not yet created.
    fn random_person(&self, at: BlockPosition, rng: &mut ItemRng) -> i64 {
        let created = self.last_person(at) + 1;
        let active = created.min(i64::from(self.config.num_active_people));
        created - active + rng.below((active + PERSON_ID_LEAD) as u64) as i64
    }

    /// A random auction (from 0) among those likely still open, or a few not yet created.
    fn random_auction(&self, at: BlockPosition, rng: &mut ItemRng) -> i64 {
        let newest = self.last_auction(at);
        let oldest = (newest - i64::from(self.config.num_in_flight_auctions)).max(0);
        oldest + rng.below((newest - oldest + 1 + AUCTION_ID_LEAD) as u64) as i64
    }

    /// A price in cents, log-uniform over [1, 1e6) dollars: 10^(6u) * 100.
    fn price(rng: &mut ItemRng) -> i64 {
        // Adding 0.5 and truncating rounds half up like Java's Math.round (the value is
        // positive), without a call to libm's `round`.
        ((rng.unit_f64() * 6.0 * std::f64::consts::LN_10).exp() * 100.0 + 0.5) as i64
    }

    /// Auction length in ms: uniform up to twice the time until `num_in_flight_auctions`
    /// more auctions exist, so that about that many are open at once.
    fn auction_length(&self, event_number: u64, now: i64, rng: &mut ItemRng) -> i64 {
        let horizon = self.timestamp(event_number + self.events_per_in_flight_window) - now;
        1 + rng.below((horizon * 2).max(1) as u64) as i64
    }
}

/// An event's place in the repeating block of person/auction/bid proportions.
#[derive(Debug, Clone, Copy)]
struct BlockPosition {
    block: i64,
    offset: i64,
}

/// URLs of the bid channels. The reference draws them once per process; we draw them
/// once per seed so that a stream is fully determined by its seed.
#[derive(Debug)]
struct ChannelTable {
    urls: String,
    url_ends: Vec<u32>,
    hot_urls: [String; 4],
}

impl ChannelTable {
    fn new(seed: u64) -> Self {
        let count = CHANNELS_NUMBER as usize;
        let mut table = ChannelTable {
            urls: String::with_capacity(count * 72),
            url_ends: Vec::with_capacity(count),
            hot_urls: Default::default(),
        };
        for (i, url) in table.hot_urls.iter_mut().enumerate() {
            push_base_url(&mut ItemRng::new(seed, HOT_URL_STREAM, i as u64), url);
        }
        for k in 0..count {
            use std::fmt::Write as _;
            let mut rng = ItemRng::new(seed, CHANNEL_STREAM, k as u64);
            push_base_url(&mut rng, &mut table.urls);
            if !rng.one_in(10) {
                // Nine channels in ten carry their id in the URL, spelled as the reference
                // does: the absolute value of the bit-reversed 32-bit channel number
                // (which stays negative for the one value whose reversal is i32::MIN).
                let id = (k as u32).reverse_bits().cast_signed().wrapping_abs();
                let _ = write!(table.urls, "&channel_id={id}");
            }
            table.url_ends.push(table.urls.len() as u32);
        }
        table
    }

    fn url(&self, k: usize) -> &str {
        let start = if k == 0 {
            0
        } else {
            self.url_ends[k - 1] as usize
        };
        &self.urls[start..self.url_ends[k] as usize]
    }
}

/// `https://www.nexmark.com/<w>/<w>/<w>/item.htm?query=1` with short random words.
fn push_base_url(rng: &mut ItemRng, out: &mut String) {
    out.push_str("https://www.nexmark.com/");
    for _ in 0..3 {
        text::push_words(rng, out, 5, b'_');
        out.push('/');
    }
    out.push_str("item.htm?query=1");
}

/// Reused string buffers for the event being generated.
#[derive(Debug, Default)]
struct Scratch {
    name: String,
    email: String,
    credit_card: String,
    item_name: String,
    description: String,
    channel: String,
    extra: String,
}

/// Produces the events of one [`Slice`] of a NEXMark stream, in event-number order.
///
/// Events are returned as [`EventRef`]s borrowing internal buffers, appended to Arrow
/// builders ([`NexmarkGenerator::fill`], [`NexmarkGenerator::next_batches`]) or written
/// as JSON ([`NexmarkGenerator::next_json`]); none of these allocate per event.
#[derive(Debug)]
pub struct NexmarkGenerator {
    model: Arc<Model>,
    slice: Slice,
    /// Events of this slice produced so far.
    position: u64,
    scratch: Scratch,
}

impl Clone for NexmarkGenerator {
    fn clone(&self) -> Self {
        NexmarkGenerator {
            model: Arc::clone(&self.model),
            slice: self.slice,
            position: self.position,
            scratch: Scratch::default(),
        }
    }
}

impl NexmarkGenerator {
    /// A generator of the whole stream.
    pub fn new(config: NexmarkConfig) -> Result<Self> {
        Self::with_slice(config, Slice::WHOLE)
    }

    /// A generator of one slice of the stream.
    pub fn with_slice(config: NexmarkConfig, slice: Slice) -> Result<Self> {
        Slice::new(slice.index, slice.count)?;
        Ok(NexmarkGenerator {
            model: Arc::new(Model::new(config)?),
            slice,
            position: 0,
            scratch: Scratch::default(),
        })
    }

    /// `count` generators that together produce exactly the stream of `config`.
    pub fn split(config: NexmarkConfig, count: u32) -> Result<Vec<Self>> {
        let whole = Self::new(config)?;
        (0..count)
            .map(|index| {
                Ok(NexmarkGenerator {
                    slice: Slice::new(index, count)?,
                    ..whole.clone()
                })
            })
            .collect()
    }

    pub fn config(&self) -> &NexmarkConfig {
        &self.model.config
    }

    pub fn slice(&self) -> Slice {
        self.slice
    }

    /// Events this generator has produced (its checkpoint).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Resumes after `position` events of this slice (from a checkpoint).
    pub fn seek(&mut self, position: u64) {
        self.position = position;
    }

    /// Events this slice has left to produce; `None` when unbounded.
    pub fn remaining(&self) -> Option<u64> {
        self.model
            .config
            .max_events
            .map(|total| self.slice.len_of(total).saturating_sub(self.position))
    }

    /// The event number the next call will produce, if any is left.
    pub fn next_event_number(&self) -> Option<u64> {
        let n = self.slice.event_number(self.position);
        match self.model.config.max_events {
            Some(total) if n >= total => None,
            _ => Some(n),
        }
    }

    /// Event time (ms since the epoch) of event number `n` of the whole stream.
    pub fn event_time_ms(&self, n: u64) -> i64 {
        self.model.timestamp(n)
    }

    /// The kind of event number `n` of the whole stream.
    pub fn kind_of(&self, n: u64) -> EventKind {
        self.model.kind_at(self.model.locate(self.event_id(n)))
    }

    /// The next event of this slice, or `None` when the slice is exhausted.
    pub fn next_event(&mut self) -> Option<EventRef<'_>> {
        let n = self.next_event_number()?;
        self.position += 1;
        Some(self.event_at(n))
    }

    /// Event number `n` of the whole stream, whatever the slice (random access; does
    /// not move the position).
    pub fn event_at(&mut self, n: u64) -> EventRef<'_> {
        let model = &*self.model;
        let s = &mut self.scratch;
        let event_id = (model.config.first_event_id + n) as i64;
        let at = model.locate(event_id);
        let now = model.timestamp(n);
        let mut rng = ItemRng::new(model.config.seed, EVENT_STREAM, event_id as u64);
        match model.kind_at(at) {
            EventKind::Person => EventRef::Person(generate_person(model, s, &mut rng, at, now)),
            EventKind::Auction => {
                EventRef::Auction(generate_auction(model, s, &mut rng, at, n, now))
            }
            EventKind::Bid => EventRef::Bid(generate_bid(model, s, &mut rng, at, now)),
        }
    }

    /// Appends up to `max_events` events of this slice to `builder`; returns how many.
    pub fn fill(&mut self, builder: &mut NexmarkBatchBuilder, max_events: usize) -> usize {
        let mut produced = 0;
        while produced < max_events {
            let Some(event) = self.next_event() else {
                break;
            };
            builder.append(&event);
            produced += 1;
        }
        produced
    }

    /// The next `max_events` events of this slice as three record batches (person,
    /// auction, bid; any may be empty), or `None` when the slice is exhausted.
    pub fn next_batches(&mut self, max_events: usize) -> Result<Option<NexmarkBatches>> {
        let mut builder = NexmarkBatchBuilder::for_events(max_events, self.config());
        if self.fill(&mut builder, max_events) == 0 {
            return Ok(None);
        }
        builder.finish().map(Some)
    }

    /// Appends the next event as one JSON object (no newline) to `out`, returning its
    /// kind, or `None` when the slice is exhausted.
    pub fn next_json(&mut self, layout: JsonLayout, out: &mut Vec<u8>) -> Option<EventKind> {
        let event = self.next_event()?;
        event.write_json(layout, out);
        Some(event.kind())
    }

    /// The rest of this slice as owned events (allocates per event; for tests and tools).
    pub fn into_events(mut self) -> impl Iterator<Item = Event> {
        std::iter::from_fn(move || self.next_event().map(|e| e.to_owned_event()))
    }

    fn event_id(&self, n: u64) -> i64 {
        (self.model.config.first_event_id + n) as i64
    }
}

fn generate_person<'a>(
    model: &'a Model,
    s: &'a mut Scratch,
    rng: &mut ItemRng,
    at: BlockPosition,
    now: i64,
) -> PersonRef<'a> {
    s.name.clear();
    s.name
        .push_str(FIRST_NAMES[rng.below(FIRST_NAMES.len() as u64) as usize]);
    s.name.push(' ');
    s.name
        .push_str(LAST_NAMES[rng.below(LAST_NAMES.len() as u64) as usize]);

    s.email.clear();
    text::push_words(rng, &mut s.email, 7, b' ');
    s.email.push('@');
    text::push_words(rng, &mut s.email, 5, b' ');
    s.email.push_str(".com");

    s.credit_card.clear();
    for group in 0..4 {
        if group > 0 {
            s.credit_card.push(' ');
        }
        text::push_4_digits(&mut s.credit_card, rng.below(10_000) as u16);
    }

    let city = US_CITIES[rng.below(US_CITIES.len() as u64) as usize];
    let state = US_STATES[rng.below(US_STATES.len() as u64) as usize];

    // The reference counts 8 bytes for the id plus the text fields.
    let size = 8 + s.name.len() + s.email.len() + s.credit_card.len() + city.len() + state.len();
    s.extra.clear();
    text::push_extra(
        rng,
        &mut s.extra,
        size,
        model.config.avg_person_byte_size as usize,
    );

    PersonRef {
        id: model.last_person(at) + FIRST_PERSON_ID,
        name: &s.name,
        email_address: &s.email,
        credit_card: &s.credit_card,
        city,
        state,
        date_time: now,
        extra: &s.extra,
    }
}

fn generate_auction<'a>(
    model: &'a Model,
    s: &'a mut Scratch,
    rng: &mut ItemRng,
    at: BlockPosition,
    event_number: u64,
    now: i64,
) -> AuctionRef<'a> {
    let seller = if rng.one_in(u64::from(model.config.hot_sellers_ratio)) {
        model.random_person(at, rng)
    } else {
        model.last_person(at) / HOT_ID_BATCH * HOT_ID_BATCH
    };
    let category = FIRST_CATEGORY_ID + rng.below(NUM_CATEGORIES as u64) as i64;
    let initial_bid = Model::price(rng);
    let expires = now + model.auction_length(event_number, now, rng);

    s.item_name.clear();
    text::push_words(rng, &mut s.item_name, 20, b' ');
    s.description.clear();
    text::push_words(rng, &mut s.description, 100, b' ');
    let reserve = initial_bid + Model::price(rng);

    // The reference counts 8 bytes for each of the five numbers plus the id.
    let size = 8 + s.item_name.len() + s.description.len() + 5 * 8;
    s.extra.clear();
    text::push_extra(
        rng,
        &mut s.extra,
        size,
        model.config.avg_auction_byte_size as usize,
    );

    AuctionRef {
        id: model.last_auction(at) + FIRST_AUCTION_ID,
        item_name: &s.item_name,
        description: &s.description,
        initial_bid,
        reserve,
        date_time: now,
        expires,
        seller: seller + FIRST_PERSON_ID,
        category,
        extra: &s.extra,
    }
}

fn generate_bid<'a>(
    model: &'a Model,
    s: &'a mut Scratch,
    rng: &mut ItemRng,
    at: BlockPosition,
    now: i64,
) -> BidRef<'a> {
    let auction = if rng.one_in(u64::from(model.config.hot_auction_ratio)) {
        model.random_auction(at, rng)
    } else {
        model.last_auction(at) / HOT_ID_BATCH * HOT_ID_BATCH
    };
    let bidder = if rng.one_in(u64::from(model.config.hot_bidders_ratio)) {
        model.random_person(at, rng)
    } else {
        // The second person of the batch, so hot bidders and hot sellers differ.
        model.last_person(at) / HOT_ID_BATCH * HOT_ID_BATCH + 1
    };
    let price = Model::price(rng);
    let (channel, url) = if rng.one_in(HOT_CHANNELS_RATIO) {
        let k = rng.below(CHANNELS_NUMBER);
        s.channel.clear();
        s.channel.push_str("channel-");
        text::push_uint_str(&mut s.channel, k);
        (s.channel.as_str(), model.channels.url(k as usize))
    } else {
        let i = rng.below(HOT_CHANNELS.len() as u64) as usize;
        (HOT_CHANNELS[i], model.channels.hot_urls[i].as_str())
    };

    // The reference counts 8 bytes for each of the four numbers (not channel or url).
    s.extra.clear();
    text::push_extra(
        rng,
        &mut s.extra,
        4 * 8,
        model.config.avg_bid_byte_size as usize,
    );

    BidRef {
        auction: auction + FIRST_AUCTION_ID,
        bidder: bidder + FIRST_PERSON_ID,
        price,
        channel,
        url,
        date_time: now,
        extra: &s.extra,
    }
}
