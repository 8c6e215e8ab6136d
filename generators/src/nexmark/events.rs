//! One event from its number: a person, an auction or a bid, written into
//! reused buffers.

use super::config::*;
use super::model::{AuctionRef, BidRef, PersonRef};
use super::stream::{BlockPosition, Model};
use crate::rng::ItemRng;
use crate::text;

/// Reused string buffers for the event being generated.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    pub(super) name: String,
    pub(super) email: String,
    pub(super) credit_card: String,
    pub(super) item_name: String,
    pub(super) description: String,
    pub(super) channel: String,
    pub(super) extra: String,
}

pub(super) fn generate_person<'a>(
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

pub(super) fn generate_auction<'a>(
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

pub(super) fn generate_bid<'a>(
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
