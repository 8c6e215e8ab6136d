//! NEXMark events as Arrow record batches: one batch per table.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{
    ArrayRef, Int64Builder, StringBuilder, TimestampMillisecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;

use super::config::NexmarkConfig;
use super::model::{AuctionRef, BidRef, EventKind, EventRef, PersonRef};
use crate::error::Result;

fn timestamp_ms() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, None)
}

static PERSON_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("email_address", DataType::Utf8, false),
        Field::new("credit_card", DataType::Utf8, false),
        Field::new("city", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("date_time", timestamp_ms(), false),
        Field::new("extra", DataType::Utf8, false),
    ]))
});

static AUCTION_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("item_name", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
        Field::new("initial_bid", DataType::Int64, false),
        Field::new("reserve", DataType::Int64, false),
        Field::new("date_time", timestamp_ms(), false),
        Field::new("expires", timestamp_ms(), false),
        Field::new("seller", DataType::Int64, false),
        Field::new("category", DataType::Int64, false),
        Field::new("extra", DataType::Utf8, false),
    ]))
});

static BID_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("bidder", DataType::Int64, false),
        Field::new("price", DataType::Int64, false),
        Field::new("channel", DataType::Utf8, false),
        Field::new("url", DataType::Utf8, false),
        Field::new("date_time", timestamp_ms(), false),
        Field::new("extra", DataType::Utf8, false),
    ]))
});

/// `person(id BIGINT, name, email_address, credit_card, city, state VARCHAR,
/// date_time TIMESTAMP(ms), extra VARCHAR)`, all non-null.
pub fn person_schema() -> SchemaRef {
    Arc::clone(&PERSON_SCHEMA)
}

/// `auction(id BIGINT, item_name, description VARCHAR, initial_bid, reserve BIGINT,
/// date_time, expires TIMESTAMP(ms), seller, category BIGINT, extra VARCHAR)`, all non-null.
pub fn auction_schema() -> SchemaRef {
    Arc::clone(&AUCTION_SCHEMA)
}

/// `bid(auction, bidder, price BIGINT, channel, url VARCHAR, date_time TIMESTAMP(ms),
/// extra VARCHAR)`, all non-null.
pub fn bid_schema() -> SchemaRef {
    Arc::clone(&BID_SCHEMA)
}

/// The schema of one table.
pub fn schema_for(kind: EventKind) -> SchemaRef {
    match kind {
        EventKind::Person => person_schema(),
        EventKind::Auction => auction_schema(),
        EventKind::Bid => bid_schema(),
    }
}

/// One chunk of events, split by table. Rows keep event-number order within a table.
#[derive(Debug, Clone)]
pub struct NexmarkBatches {
    pub person: RecordBatch,
    pub auction: RecordBatch,
    pub bid: RecordBatch,
}

impl NexmarkBatches {
    pub fn get(&self, kind: EventKind) -> &RecordBatch {
        match kind {
            EventKind::Person => &self.person,
            EventKind::Auction => &self.auction,
            EventKind::Bid => &self.bid,
        }
    }

    /// Rows over the three batches.
    pub fn num_rows(&self) -> usize {
        self.person.num_rows() + self.auction.num_rows() + self.bid.num_rows()
    }
}

/// Column builders for the three tables. Reuse one across chunks: `finish` hands the
/// rows out and re-reserves room for a chunk of the same size.
#[derive(Debug)]
pub struct NexmarkBatchBuilder {
    person: PersonColumns,
    auction: AuctionColumns,
    bid: BidColumns,
    avg_sizes: [usize; 3],
}

impl NexmarkBatchBuilder {
    /// Builders sized for a chunk of `events` events with `config`'s proportions.
    pub fn for_events(events: usize, config: &NexmarkConfig) -> Self {
        let total = config.total_proportion().max(1) as usize;
        // +1 so a chunk that straddles blocks still fits without growing.
        let share = |p: u32| events * p as usize / total + 1;
        let avg_sizes = [
            config.avg_person_byte_size as usize,
            config.avg_auction_byte_size as usize,
            config.avg_bid_byte_size as usize,
        ];
        NexmarkBatchBuilder {
            person: PersonColumns::with_capacity(share(config.person_proportion), avg_sizes[0]),
            auction: AuctionColumns::with_capacity(share(config.auction_proportion), avg_sizes[1]),
            bid: BidColumns::with_capacity(share(config.bid_proportion), avg_sizes[2]),
            avg_sizes,
        }
    }

    pub fn append(&mut self, event: &EventRef<'_>) {
        match event {
            EventRef::Person(p) => self.person.append(p),
            EventRef::Auction(a) => self.auction.append(a),
            EventRef::Bid(b) => self.bid.append(b),
        }
    }

    /// Rows appended since the last `finish`.
    pub fn len(&self) -> usize {
        self.person.rows + self.auction.rows + self.bid.rows
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rows appended so far as three batches; the builder starts over empty.
    pub fn finish(&mut self) -> Result<NexmarkBatches> {
        let rows = [self.person.rows, self.auction.rows, self.bid.rows];
        let batches = NexmarkBatches {
            person: self.person.finish()?,
            auction: self.auction.finish()?,
            bid: self.bid.finish()?,
        };
        self.person = PersonColumns::with_capacity(rows[0], self.avg_sizes[0]);
        self.auction = AuctionColumns::with_capacity(rows[1], self.avg_sizes[1]);
        self.bid = BidColumns::with_capacity(rows[2], self.avg_sizes[2]);
        Ok(batches)
    }
}

fn strings(rows: usize, bytes_per_row: usize) -> StringBuilder {
    StringBuilder::with_capacity(rows, rows * bytes_per_row)
}

#[derive(Debug)]
struct PersonColumns {
    rows: usize,
    id: Int64Builder,
    name: StringBuilder,
    email_address: StringBuilder,
    credit_card: StringBuilder,
    city: StringBuilder,
    state: StringBuilder,
    date_time: TimestampMillisecondBuilder,
    extra: StringBuilder,
}

impl PersonColumns {
    fn with_capacity(rows: usize, avg_size: usize) -> Self {
        PersonColumns {
            rows: 0,
            id: Int64Builder::with_capacity(rows),
            name: strings(rows, 12),
            email_address: strings(rows, 14),
            credit_card: strings(rows, 19),
            city: strings(rows, 8),
            state: strings(rows, 2),
            date_time: TimestampMillisecondBuilder::with_capacity(rows),
            extra: strings(rows, avg_size),
        }
    }

    fn append(&mut self, p: &PersonRef<'_>) {
        self.rows += 1;
        self.id.append_value(p.id);
        self.name.append_value(p.name);
        self.email_address.append_value(p.email_address);
        self.credit_card.append_value(p.credit_card);
        self.city.append_value(p.city);
        self.state.append_value(p.state);
        self.date_time.append_value(p.date_time);
        self.extra.append_value(p.extra);
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.id.finish()),
            Arc::new(self.name.finish()),
            Arc::new(self.email_address.finish()),
            Arc::new(self.credit_card.finish()),
            Arc::new(self.city.finish()),
            Arc::new(self.state.finish()),
            Arc::new(self.date_time.finish()),
            Arc::new(self.extra.finish()),
        ];
        self.rows = 0;
        Ok(RecordBatch::try_new(person_schema(), columns)?)
    }
}

#[derive(Debug)]
struct AuctionColumns {
    rows: usize,
    id: Int64Builder,
    item_name: StringBuilder,
    description: StringBuilder,
    initial_bid: Int64Builder,
    reserve: Int64Builder,
    date_time: TimestampMillisecondBuilder,
    expires: TimestampMillisecondBuilder,
    seller: Int64Builder,
    category: Int64Builder,
    extra: StringBuilder,
}

impl AuctionColumns {
    fn with_capacity(rows: usize, avg_size: usize) -> Self {
        AuctionColumns {
            rows: 0,
            id: Int64Builder::with_capacity(rows),
            item_name: strings(rows, 11),
            description: strings(rows, 51),
            initial_bid: Int64Builder::with_capacity(rows),
            reserve: Int64Builder::with_capacity(rows),
            date_time: TimestampMillisecondBuilder::with_capacity(rows),
            expires: TimestampMillisecondBuilder::with_capacity(rows),
            seller: Int64Builder::with_capacity(rows),
            category: Int64Builder::with_capacity(rows),
            extra: strings(rows, avg_size),
        }
    }

    fn append(&mut self, a: &AuctionRef<'_>) {
        self.rows += 1;
        self.id.append_value(a.id);
        self.item_name.append_value(a.item_name);
        self.description.append_value(a.description);
        self.initial_bid.append_value(a.initial_bid);
        self.reserve.append_value(a.reserve);
        self.date_time.append_value(a.date_time);
        self.expires.append_value(a.expires);
        self.seller.append_value(a.seller);
        self.category.append_value(a.category);
        self.extra.append_value(a.extra);
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.id.finish()),
            Arc::new(self.item_name.finish()),
            Arc::new(self.description.finish()),
            Arc::new(self.initial_bid.finish()),
            Arc::new(self.reserve.finish()),
            Arc::new(self.date_time.finish()),
            Arc::new(self.expires.finish()),
            Arc::new(self.seller.finish()),
            Arc::new(self.category.finish()),
            Arc::new(self.extra.finish()),
        ];
        self.rows = 0;
        Ok(RecordBatch::try_new(auction_schema(), columns)?)
    }
}

#[derive(Debug)]
struct BidColumns {
    rows: usize,
    auction: Int64Builder,
    bidder: Int64Builder,
    price: Int64Builder,
    channel: StringBuilder,
    url: StringBuilder,
    date_time: TimestampMillisecondBuilder,
    extra: StringBuilder,
}

impl BidColumns {
    fn with_capacity(rows: usize, avg_size: usize) -> Self {
        BidColumns {
            rows: 0,
            auction: Int64Builder::with_capacity(rows),
            bidder: Int64Builder::with_capacity(rows),
            price: Int64Builder::with_capacity(rows),
            channel: strings(rows, 10),
            url: strings(rows, 64),
            date_time: TimestampMillisecondBuilder::with_capacity(rows),
            extra: strings(rows, avg_size),
        }
    }

    fn append(&mut self, b: &BidRef<'_>) {
        self.rows += 1;
        self.auction.append_value(b.auction);
        self.bidder.append_value(b.bidder);
        self.price.append_value(b.price);
        self.channel.append_value(b.channel);
        self.url.append_value(b.url);
        self.date_time.append_value(b.date_time);
        self.extra.append_value(b.extra);
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.auction.finish()),
            Arc::new(self.bidder.finish()),
            Arc::new(self.price.finish()),
            Arc::new(self.channel.finish()),
            Arc::new(self.url.finish()),
            Arc::new(self.date_time.finish()),
            Arc::new(self.extra.finish()),
        ];
        self.rows = 0;
        Ok(RecordBatch::try_new(bid_schema(), columns)?)
    }
}
