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
mod config;
mod events;
mod json;
mod model;
mod stream;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use crate::Slice;
use crate::error::Result;
use crate::rng::ItemRng;

pub use arrow::{
    NexmarkBatchBuilder, NexmarkBatches, auction_schema, bid_schema, person_schema, schema_for,
};
pub use json::{JsonLayout, parse_tagged_json};
pub use model::{Auction, AuctionRef, Bid, BidRef, Event, EventKind, EventRef, Person, PersonRef};

pub use config::*;
use events::{Scratch, generate_auction, generate_bid, generate_person};
use stream::Model;

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
