//! The Arrow and JSON outputs agree with the events, and name every reference field.

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{Int64Type, TimestampMillisecondType};

use super::*;

fn ints(batch: &RecordBatch, name: &str) -> Vec<i64> {
    batch
        .column_by_name(name)
        .unwrap()
        .as_primitive::<Int64Type>()
        .values()
        .to_vec()
}

fn times(batch: &RecordBatch, name: &str) -> Vec<i64> {
    batch
        .column_by_name(name)
        .unwrap()
        .as_primitive::<TimestampMillisecondType>()
        .values()
        .to_vec()
}

fn strs(batch: &RecordBatch, name: &str) -> Vec<String> {
    let col = batch.column_by_name(name).unwrap().as_string::<i32>();
    (0..col.len()).map(|i| col.value(i).to_owned()).collect()
}

#[test]
fn batches_hold_exactly_the_events() {
    let all = events(5_003);
    let mut generator = NexmarkGenerator::new(config(5_003)).unwrap();
    let (mut persons, mut auctions, mut bids) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(batches) = generator.next_batches(1_000).unwrap() {
        assert!(batches.num_rows() <= 1_000);
        assert_eq!(batches.person.schema(), person_schema());
        assert_eq!(batches.auction.schema(), auction_schema());
        assert_eq!(batches.bid.schema(), bid_schema());
        persons.push(batches.person);
        auctions.push(batches.auction);
        bids.push(batches.bid);
    }
    let person = concat_batches(&person_schema(), &persons).unwrap();
    let auction = concat_batches(&auction_schema(), &auctions).unwrap();
    let bid = concat_batches(&bid_schema(), &bids).unwrap();

    let expected_bids: Vec<&Bid> = all
        .iter()
        .filter_map(|e| if let Event::Bid(b) = e { Some(b) } else { None })
        .collect();
    assert_eq!(bid.num_rows(), expected_bids.len());
    assert_eq!(
        ints(&bid, "auction"),
        expected_bids.iter().map(|b| b.auction).collect::<Vec<_>>()
    );
    assert_eq!(
        ints(&bid, "bidder"),
        expected_bids.iter().map(|b| b.bidder).collect::<Vec<_>>()
    );
    assert_eq!(
        ints(&bid, "price"),
        expected_bids.iter().map(|b| b.price).collect::<Vec<_>>()
    );
    assert_eq!(
        strs(&bid, "channel"),
        expected_bids
            .iter()
            .map(|b| b.channel.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        strs(&bid, "url"),
        expected_bids
            .iter()
            .map(|b| b.url.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        times(&bid, "date_time"),
        expected_bids
            .iter()
            .map(|b| b.date_time)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        strs(&bid, "extra"),
        expected_bids
            .iter()
            .map(|b| b.extra.clone())
            .collect::<Vec<_>>()
    );

    let expected_auctions: Vec<&Auction> = all
        .iter()
        .filter_map(|e| {
            if let Event::Auction(a) = e {
                Some(a)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        ints(&auction, "id"),
        expected_auctions.iter().map(|a| a.id).collect::<Vec<_>>()
    );
    assert_eq!(
        strs(&auction, "item_name"),
        expected_auctions
            .iter()
            .map(|a| a.item_name.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        strs(&auction, "description"),
        expected_auctions
            .iter()
            .map(|a| a.description.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        ints(&auction, "initial_bid"),
        expected_auctions
            .iter()
            .map(|a| a.initial_bid)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        ints(&auction, "reserve"),
        expected_auctions
            .iter()
            .map(|a| a.reserve)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        times(&auction, "expires"),
        expected_auctions
            .iter()
            .map(|a| a.expires)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        ints(&auction, "seller"),
        expected_auctions
            .iter()
            .map(|a| a.seller)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        ints(&auction, "category"),
        expected_auctions
            .iter()
            .map(|a| a.category)
            .collect::<Vec<_>>()
    );

    let expected_persons: Vec<&Person> = all
        .iter()
        .filter_map(|e| {
            if let Event::Person(p) = e {
                Some(p)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        ints(&person, "id"),
        expected_persons.iter().map(|p| p.id).collect::<Vec<_>>()
    );
    assert_eq!(
        strs(&person, "email_address"),
        expected_persons
            .iter()
            .map(|p| p.email_address.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        strs(&person, "credit_card"),
        expected_persons
            .iter()
            .map(|p| p.credit_card.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        strs(&person, "state"),
        expected_persons
            .iter()
            .map(|p| p.state.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        times(&person, "date_time"),
        expected_persons
            .iter()
            .map(|p| p.date_time)
            .collect::<Vec<_>>()
    );
}

#[test]
fn schemas_name_every_reference_field() {
    let names = |s: datafusion::arrow::datatypes::SchemaRef| {
        s.fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(person_schema()),
        [
            "id",
            "name",
            "email_address",
            "credit_card",
            "city",
            "state",
            "date_time",
            "extra"
        ]
    );
    assert_eq!(
        names(auction_schema()),
        [
            "id",
            "item_name",
            "description",
            "initial_bid",
            "reserve",
            "date_time",
            "expires",
            "seller",
            "category",
            "extra"
        ]
    );
    assert_eq!(
        names(bid_schema()),
        [
            "auction",
            "bidder",
            "price",
            "channel",
            "url",
            "date_time",
            "extra"
        ]
    );
}

#[test]
fn json_round_trips_in_both_layouts() {
    let mut generator = NexmarkGenerator::new(config(1_000)).unwrap();
    let expected = events(1_000);
    let mut flat = Vec::new();
    let mut tagged = Vec::new();
    for want in &expected {
        let event = generator.next_event().unwrap();
        flat.clear();
        event.write_json(JsonLayout::Flat, &mut flat);
        let got = match event.kind() {
            EventKind::Person => Event::Person(serde_json::from_slice(&flat).unwrap()),
            EventKind::Auction => Event::Auction(serde_json::from_slice(&flat).unwrap()),
            EventKind::Bid => Event::Bid(serde_json::from_slice(&flat).unwrap()),
        };
        assert_eq!(&got, want);
        tagged.clear();
        event.write_json(JsonLayout::Tagged, &mut tagged);
        assert_eq!(&parse_tagged_json(&tagged).unwrap(), want);
    }
    assert!(generator.next_json(JsonLayout::Flat, &mut flat).is_none());
    assert!(parse_tagged_json(br#"{"event_type":2,"person":null}"#).is_err());
}

#[test]
fn arrow_json_reader_decodes_flat_records_into_the_same_batches() {
    // What a Kafka source would do with the published records.
    let mut generator = NexmarkGenerator::new(config(2_000)).unwrap();
    let mut lines = [Vec::new(), Vec::new(), Vec::new()];
    while let Some(event) = generator.next_event() {
        let out = &mut lines[event.kind() as usize];
        event.write_json(JsonLayout::Flat, out);
        out.push(b'\n');
    }
    let direct = NexmarkGenerator::new(config(2_000))
        .unwrap()
        .next_batches(2_000)
        .unwrap()
        .unwrap();
    for kind in [EventKind::Person, EventKind::Auction, EventKind::Bid] {
        let reader = datafusion::arrow::json::ReaderBuilder::new(schema_for(kind))
            .build(std::io::Cursor::new(lines[kind as usize].clone()))
            .unwrap();
        let decoded: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
        let decoded = concat_batches(&schema_for(kind), &decoded).unwrap();
        assert_eq!(&decoded, direct.get(kind), "{kind:?}");
    }
}

#[test]
fn builder_is_reusable_across_chunks() {
    let mut generator = NexmarkGenerator::new(config(3_000)).unwrap();
    let mut builder = NexmarkBatchBuilder::for_events(1_000, generator.config());
    let mut rows = 0;
    loop {
        let produced = generator.fill(&mut builder, 1_000);
        assert_eq!(builder.len(), produced);
        if produced == 0 {
            break;
        }
        rows += builder.finish().unwrap().num_rows();
        assert!(builder.is_empty());
    }
    assert_eq!(rows, 3_000);
}
