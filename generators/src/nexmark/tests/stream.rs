//! The stream against the reference definitions: proportions, id spaces, value
//! domains, timing; determinism, splitting, resuming, bad configurations.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::*;
use crate::error::GeneratorError;
use crate::text::extra_len_range;

#[test]
fn defaults_match_the_reference_configuration() {
    let c = NexmarkConfig::default();
    assert_eq!(
        (c.person_proportion, c.auction_proportion, c.bid_proportion),
        (1, 3, 46)
    );
    assert_eq!(
        (
            c.hot_auction_ratio,
            c.hot_sellers_ratio,
            c.hot_bidders_ratio
        ),
        (2, 4, 4)
    );
    assert_eq!((c.num_in_flight_auctions, c.num_active_people), (100, 1000));
    assert_eq!(
        (
            c.avg_person_byte_size,
            c.avg_auction_byte_size,
            c.avg_bid_byte_size
        ),
        (200, 500, 100)
    );
    assert_eq!(c.first_event_rate, 10_000);
    assert_eq!(
        (FIRST_PERSON_ID, FIRST_AUCTION_ID, FIRST_CATEGORY_ID),
        (1000, 1000, 10)
    );
}

#[test]
fn same_seed_same_stream_other_seed_other_stream() {
    let a = events(5_000);
    let b = events(5_000);
    assert_eq!(a, b);
    let other: Vec<Event> = NexmarkGenerator::new(NexmarkConfig {
        seed: 43,
        ..config(5_000)
    })
    .unwrap()
    .into_events()
    .collect();
    assert_eq!(other.len(), a.len());
    assert_ne!(other, a);
}

#[test]
fn slices_are_disjoint_and_complete() {
    let whole = numbered(NexmarkGenerator::new(config(10_007)).unwrap());
    assert_eq!(whole.len(), 10_007);
    for count in [1, 3, 4, 7] {
        let mut union = BTreeMap::new();
        for generator in NexmarkGenerator::split(config(10_007), count).unwrap() {
            let slice = generator.slice();
            assert_eq!(generator.remaining(), Some(slice.len_of(10_007)));
            let part = numbered(generator);
            assert_eq!(part.len() as u64, slice.len_of(10_007));
            for (n, event) in part {
                assert!(slice.contains(n));
                assert!(union.insert(n, event).is_none(), "event {n} produced twice");
            }
        }
        let union: Vec<(u64, Event)> = union.into_iter().collect();
        assert_eq!(union, whole, "{count} slices differ from the whole stream");
    }
}

#[test]
fn seek_resumes_where_a_checkpoint_left_off() {
    let mut first = NexmarkGenerator::with_slice(config(2_000), Slice::new(1, 2).unwrap()).unwrap();
    for _ in 0..300 {
        first.next_event();
    }
    let mut resumed =
        NexmarkGenerator::with_slice(config(2_000), Slice::new(1, 2).unwrap()).unwrap();
    resumed.seek(first.position());
    assert_eq!(numbered(first), numbered(resumed));
}

#[test]
fn proportions_are_1_3_46_in_every_block_of_50() {
    let all = events(50 * 40);
    for (block, chunk) in all.chunks(50).enumerate() {
        let kinds: Vec<EventKind> = chunk.iter().map(Event::kind).collect();
        assert_eq!(kinds[0], EventKind::Person, "block {block}");
        assert!(
            kinds[1..4].iter().all(|k| *k == EventKind::Auction),
            "block {block}"
        );
        assert!(
            kinds[4..].iter().all(|k| *k == EventKind::Bid),
            "block {block}"
        );
    }
    let generator = NexmarkGenerator::new(config(1)).unwrap();
    assert_eq!(generator.kind_of(50), EventKind::Person);
    assert_eq!(generator.kind_of(53), EventKind::Auction);
    assert_eq!(generator.kind_of(54), EventKind::Bid);
}

#[test]
fn event_times_follow_the_inter_event_delay() {
    let c = NexmarkConfig {
        first_event_rate: 10_000,
        ..config(1_000)
    };
    let mut generator = NexmarkGenerator::new(c.clone()).unwrap();
    let mut n = 0u64;
    while let Some(event) = generator.next_event() {
        // 10 000 events/s: 100 us apart, so event n is at n / 10 ms.
        assert_eq!(event.date_time(), c.base_time_ms + (n / 10) as i64);
        n += 1;
    }
    let fast = NexmarkGenerator::new(NexmarkConfig {
        first_event_rate: 3_000_000,
        ..config(1)
    })
    .unwrap();
    assert_eq!(fast.event_time_ms(3_000_000), DEFAULT_BASE_TIME_MS + 1000);
    assert_eq!(fast.event_time_ms(2_999), DEFAULT_BASE_TIME_MS);
    assert_eq!(fast.event_time_ms(3_000), DEFAULT_BASE_TIME_MS + 1);
}

#[test]
fn ids_are_dense_and_references_stay_in_their_windows() {
    let c = config(50 * 2_000);
    let mut next_person = FIRST_PERSON_ID;
    let mut next_auction = FIRST_AUCTION_ID;
    let (mut bids, mut hot_auction_bids, mut hot_bidder_bids) = (0u64, 0u64, 0u64);
    let (mut auctions, mut hot_seller_auctions) = (0u64, 0u64);
    for event in events(c.max_events.unwrap()) {
        let newest_person = next_person - 1;
        let newest_auction = next_auction - 1;
        let hot_person_batch = (newest_person - FIRST_PERSON_ID) / HOT_ID_BATCH * HOT_ID_BATCH;
        match event {
            Event::Person(p) => {
                assert_eq!(p.id, next_person);
                next_person += 1;
            }
            Event::Auction(a) => {
                assert_eq!(a.id, next_auction);
                next_auction += 1;
                auctions += 1;
                assert!(
                    (FIRST_CATEGORY_ID..FIRST_CATEGORY_ID + NUM_CATEGORIES).contains(&a.category)
                );
                let active_floor =
                    (newest_person + 1 - i64::from(c.num_active_people)).max(FIRST_PERSON_ID);
                assert!(a.seller >= active_floor && a.seller <= newest_person + PERSON_ID_LEAD);
                if a.seller == hot_person_batch + FIRST_PERSON_ID {
                    hot_seller_auctions += 1;
                }
            }
            Event::Bid(b) => {
                bids += 1;
                let floor =
                    (newest_auction - i64::from(c.num_in_flight_auctions)).max(FIRST_AUCTION_ID);
                assert!(
                    b.auction >= floor && b.auction <= newest_auction + AUCTION_ID_LEAD,
                    "{b:?}"
                );
                let active_floor =
                    (newest_person + 1 - i64::from(c.num_active_people)).max(FIRST_PERSON_ID);
                assert!(
                    b.bidder >= active_floor && b.bidder <= newest_person + PERSON_ID_LEAD,
                    "{b:?}"
                );
                let hot_auction = (newest_auction - FIRST_AUCTION_ID) / HOT_ID_BATCH * HOT_ID_BATCH;
                if b.auction == hot_auction + FIRST_AUCTION_ID {
                    hot_auction_bids += 1;
                }
                if b.bidder == hot_person_batch + 1 + FIRST_PERSON_ID {
                    hot_bidder_bids += 1;
                }
            }
        }
    }
    assert_eq!(next_person - FIRST_PERSON_ID, 2_000);
    assert_eq!(next_auction - FIRST_AUCTION_ID, 6_000);
    // Hot choices happen with probability 1 - 1/ratio (a random pick can also land on
    // the hot id, hence the slightly wider upper bounds).
    let share = |hits: u64, of: u64| hits as f64 / of as f64;
    let hot_auctions = share(hot_auction_bids, bids);
    assert!(
        (0.49..0.53).contains(&hot_auctions),
        "hot auction share {hot_auctions}"
    );
    let hot_bidders = share(hot_bidder_bids, bids);
    assert!(
        (0.74..0.77).contains(&hot_bidders),
        "hot bidder share {hot_bidders}"
    );
    let hot_sellers = share(hot_seller_auctions, auctions);
    assert!(
        (0.73..0.78).contains(&hot_sellers),
        "hot seller share {hot_sellers}"
    );
}

#[test]
fn field_values_are_in_the_reference_domains() {
    let c = config(50 * 1_000);
    let (mut bids, mut hot_channel_bids, mut with_channel_id) = (0u64, 0u64, 0u64);
    for event in events(c.max_events.unwrap()) {
        match event {
            Event::Person(p) => {
                let (first, last) = p.name.split_once(' ').unwrap();
                assert!(
                    FIRST_NAMES.contains(&first) && LAST_NAMES.contains(&last),
                    "{}",
                    p.name
                );
                let (user, domain) = p.email_address.split_once('@').unwrap();
                assert!(
                    user.len() <= 6 && domain.ends_with(".com") && domain.len() <= 8,
                    "{}",
                    p.email_address
                );
                let groups: Vec<&str> = p.credit_card.split(' ').collect();
                assert_eq!(groups.len(), 4);
                assert!(
                    groups
                        .iter()
                        .all(|g| g.len() == 4 && g.bytes().all(|b| b.is_ascii_digit()))
                );
                assert!(
                    US_CITIES.contains(&p.city.as_str()) && US_STATES.contains(&p.state.as_str())
                );
                let size = 8
                    + p.name.len()
                    + p.email_address.len()
                    + p.credit_card.len()
                    + p.city.len()
                    + p.state.len();
                assert!(extra_len_range(size, 200).contains(&p.extra.len()));
            }
            Event::Auction(a) => {
                assert!(a.item_name.len() <= 19 && a.description.len() <= 99);
                assert!((100..=100_000_000).contains(&a.initial_bid));
                assert!(a.reserve > a.initial_bid && a.reserve - a.initial_bid <= 100_000_000);
                assert!(a.expires > a.date_time);
                let size = 8 + a.item_name.len() + a.description.len() + 40;
                assert!(extra_len_range(size, 500).contains(&a.extra.len()));
            }
            Event::Bid(b) => {
                bids += 1;
                assert!((100..=100_000_000).contains(&b.price));
                // 100 - 32 bytes to fill, +-20 %: 54 ..= 81 letters.
                assert!((54..82).contains(&b.extra.len()), "{}", b.extra.len());
                assert!(b.extra.bytes().all(|c| c.is_ascii_lowercase()));
                assert!(b.url.starts_with("https://www.nexmark.com/"));
                assert!(b.url.contains("/item.htm?query=1"));
                if HOT_CHANNELS.contains(&b.channel.as_str()) {
                    hot_channel_bids += 1;
                    assert!(!b.url.contains("channel_id"));
                } else {
                    let k: u64 = b.channel.strip_prefix("channel-").unwrap().parse().unwrap();
                    assert!(k < CHANNELS_NUMBER);
                    if let Some((_, id)) = b.url.split_once("&channel_id=") {
                        with_channel_id += 1;
                        let expected = (k as u32).reverse_bits().cast_signed().wrapping_abs();
                        assert_eq!(id, expected.to_string());
                    }
                }
            }
        }
    }
    let hot = hot_channel_bids as f64 / bids as f64;
    assert!((0.48..0.52).contains(&hot), "hot channel share {hot}");
    let tagged = with_channel_id as f64 / (bids - hot_channel_bids) as f64;
    assert!((0.87..0.93).contains(&tagged), "channel_id share {tagged}");
}

#[test]
fn auctions_last_about_the_in_flight_horizon() {
    // With 10 000 events/s, 100 auctions in flight span 100 * 50 / 3 events = 166.6 ms;
    // lengths are uniform in 1 ..= 2 * horizon, averaging about the horizon.
    let lengths: Vec<i64> = events(50 * 2_000)
        .into_iter()
        .filter_map(|e| match e {
            Event::Auction(a) => Some(a.expires - a.date_time),
            _ => None,
        })
        .collect();
    assert!(lengths.iter().all(|l| (1..=2 * 167).contains(l)));
    let mean = lengths.iter().sum::<i64>() as f64 / lengths.len() as f64;
    assert!((150.0..185.0).contains(&mean), "mean auction length {mean}");
}

#[test]
fn prices_are_log_uniform_over_six_decades() {
    let prices: Vec<i64> = events(50 * 400)
        .into_iter()
        .filter_map(|e| {
            if let Event::Bid(b) = e {
                Some(b.price)
            } else {
                None
            }
        })
        .collect();
    let below_10_dollars =
        prices.iter().filter(|p| **p < 1_000).count() as f64 / prices.len() as f64;
    assert!(
        (0.15..0.185).contains(&below_10_dollars),
        "share under $10: {below_10_dollars}"
    );
}

#[test]
fn bad_configurations_are_rejected() {
    for bad in [
        NexmarkConfig {
            first_event_rate: 0,
            ..NexmarkConfig::default()
        },
        NexmarkConfig {
            person_proportion: 0,
            ..NexmarkConfig::default()
        },
        NexmarkConfig {
            hot_bidders_ratio: 0,
            ..NexmarkConfig::default()
        },
    ] {
        assert!(matches!(
            NexmarkGenerator::new(bad),
            Err(GeneratorError::InvalidConfig(_))
        ));
    }
    assert!(Slice::new(3, 3).is_err());
    assert!(Slice::new(0, 0).is_err());
    assert!(
        NexmarkGenerator::with_slice(NexmarkConfig::default(), Slice { index: 2, count: 1 })
            .is_err()
    );
    let parsed: NexmarkConfig =
        serde_json::from_str(r#"{"seed": 9, "first_event_rate": 5}"#).unwrap();
    assert_eq!(
        parsed,
        NexmarkConfig {
            seed: 9,
            first_event_rate: 5,
            ..NexmarkConfig::default()
        }
    );
    assert!(serde_json::from_str::<NexmarkConfig>(r#"{"sed": 9}"#).is_err());
}

#[test]
fn unbounded_generators_keep_going() {
    let mut generator = NexmarkGenerator::new(NexmarkConfig::default()).unwrap();
    assert_eq!(generator.remaining(), None);
    generator.seek(1 << 40);
    let event = generator.next_event().unwrap().to_owned_event();
    assert!(event.date_time() > DEFAULT_BASE_TIME_MS);
    let shared = Arc::strong_count(&generator.model);
    let clones = NexmarkGenerator::split(NexmarkConfig::default(), 4).unwrap();
    assert_eq!(shared, 1);
    assert_eq!(Arc::strong_count(&clones[0].model), 4);
    let distinct: HashSet<Slice> = clones.iter().map(|g| g.slice()).collect();
    assert_eq!(distinct.len(), 4);
}
