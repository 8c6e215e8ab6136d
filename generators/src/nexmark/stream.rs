//! The arithmetic of one stream: which event an event number is, its time,
//! the ids it may name, and the bid channels' URLs.

use super::config::{
    AUCTION_ID_LEAD, CHANNEL_STREAM, CHANNELS_NUMBER, HOT_URL_STREAM, NexmarkConfig, PERSON_ID_LEAD,
};
use super::model::EventKind;
use crate::error::Result;
use crate::rng::ItemRng;
use crate::text;

/// The validated configuration with what is derived from it, shared by all slices.
#[derive(Debug)]
pub(super) struct Model {
    pub(super) config: NexmarkConfig,
    pub(super) delay_us: f64,
    pub(super) person: i64,
    pub(super) auction: i64,
    pub(super) total: i64,
    /// Events between an auction and the one `num_in_flight_auctions` later.
    pub(super) events_per_in_flight_window: u64,
    pub(super) channels: ChannelTable,
}

impl Model {
    pub(super) fn new(config: NexmarkConfig) -> Result<Self> {
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

    pub(super) fn timestamp(&self, event_number: u64) -> i64 {
        self.config.base_time_ms + ((event_number as f64 * self.delay_us) as i64) / 1000
    }

    /// Where event `event_id` falls in the repeating block of proportions.
    pub(super) fn locate(&self, event_id: i64) -> BlockPosition {
        BlockPosition {
            block: event_id / self.total,
            offset: event_id % self.total,
        }
    }

    pub(super) fn kind_at(&self, at: BlockPosition) -> EventKind {
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
    pub(super) fn last_person(&self, at: BlockPosition) -> i64 {
        at.block * self.person + at.offset.min(self.person - 1)
    }

    /// The newest auction id (from 0) as of the event at `at`; -1 before the first auction.
    pub(super) fn last_auction(&self, at: BlockPosition) -> i64 {
        if at.offset < self.person {
            // Person events come first in a block: the newest auction is the previous block's last.
            at.block * self.auction - 1
        } else {
            at.block * self.auction + (at.offset - self.person).min(self.auction - 1)
        }
    }

    /// A random person (from 0) among the active ones, or a few not yet created.
    pub(super) fn random_person(&self, at: BlockPosition, rng: &mut ItemRng) -> i64 {
        let created = self.last_person(at) + 1;
        let active = created.min(i64::from(self.config.num_active_people));
        created - active + rng.below((active + PERSON_ID_LEAD) as u64) as i64
    }

    /// A random auction (from 0) among those likely still open, or a few not yet created.
    pub(super) fn random_auction(&self, at: BlockPosition, rng: &mut ItemRng) -> i64 {
        let newest = self.last_auction(at);
        let oldest = (newest - i64::from(self.config.num_in_flight_auctions)).max(0);
        oldest + rng.below((newest - oldest + 1 + AUCTION_ID_LEAD) as u64) as i64
    }

    /// A price in cents, log-uniform over [1, 1e6) dollars: 10^(6u) * 100.
    pub(super) fn price(rng: &mut ItemRng) -> i64 {
        // Adding 0.5 and truncating rounds half up like Java's Math.round (the value is
        // positive), without a call to libm's `round`.
        ((rng.unit_f64() * 6.0 * std::f64::consts::LN_10).exp() * 100.0 + 0.5) as i64
    }

    /// Auction length in ms: uniform up to twice the time until `num_in_flight_auctions`
    /// more auctions exist, so that about that many are open at once.
    pub(super) fn auction_length(&self, event_number: u64, now: i64, rng: &mut ItemRng) -> i64 {
        let horizon = self.timestamp(event_number + self.events_per_in_flight_window) - now;
        1 + rng.below((horizon * 2).max(1) as u64) as i64
    }
}

/// An event's place in the repeating block of person/auction/bid proportions.
#[derive(Debug, Clone, Copy)]
pub(super) struct BlockPosition {
    pub(super) block: i64,
    pub(super) offset: i64,
}

/// URLs of the bid channels. The reference draws them once per process; we draw them
/// once per seed so that a stream is fully determined by its seed.
#[derive(Debug)]
pub(super) struct ChannelTable {
    pub(super) urls: String,
    pub(super) url_ends: Vec<u32>,
    pub(super) hot_urls: [String; 4],
}

impl ChannelTable {
    pub(super) fn new(seed: u64) -> Self {
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

    pub(super) fn url(&self, k: usize) -> &str {
        let start = if k == 0 {
            0
        } else {
            self.url_ends[k - 1] as usize
        };
        &self.urls[start..self.url_ends[k] as usize]
    }
}

/// `https://www.nexmark.com/<w>/<w>/<w>/item.htm?query=1` with short random words.
pub(super) fn push_base_url(rng: &mut ItemRng, out: &mut String) {
    out.push_str("https://www.nexmark.com/");
    for _ in 0..3 {
        text::push_words(rng, out, 5, b'_');
        out.push('/');
    }
    out.push_str("item.htm?query=1");
}
