//! The generator's parameters and the constants of the NEXMark model.

use serde::{Deserialize, Serialize};

use crate::error::{GeneratorError, Result};

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
pub(super) const EVENT_STREAM: u64 = 0x6e78_6576_656e_7401; // "nxevent"
pub(super) const CHANNEL_STREAM: u64 = 0x6e78_6368_616e_6e02; // "nxchann"
pub(super) const HOT_URL_STREAM: u64 = 0x6e78_686f_7475_7203; // "nxhotur"

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
