//! YSB events as Arrow record batches.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, StringBuilder, TimestampMillisecondBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;

use super::YsbEventRef;
use crate::error::Result;

static YSB_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("user_id", DataType::Utf8, false),
        Field::new("page_id", DataType::Utf8, false),
        Field::new("ad_id", DataType::Utf8, false),
        Field::new("ad_type", DataType::Utf8, false),
        Field::new("event_type", DataType::Utf8, false),
        Field::new(
            "event_time",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
        Field::new("ip_address", DataType::Utf8, false),
    ]))
});

/// `ad_events(user_id, page_id, ad_id, ad_type, event_type VARCHAR,
/// event_time TIMESTAMP(ms), ip_address VARCHAR)`, all non-null. In JSON `event_time`
/// is a string of epoch ms, as in the reference; here it is already a timestamp.
pub fn ysb_schema() -> SchemaRef {
    Arc::clone(&YSB_SCHEMA)
}

/// Column builders for YSB events.
#[derive(Debug)]
pub struct YsbBatchBuilder {
    rows: usize,
    user_id: StringBuilder,
    page_id: StringBuilder,
    ad_id: StringBuilder,
    ad_type: StringBuilder,
    event_type: StringBuilder,
    event_time: TimestampMillisecondBuilder,
    ip_address: StringBuilder,
}

impl YsbBatchBuilder {
    pub fn with_capacity(rows: usize) -> Self {
        let strings = |bytes| StringBuilder::with_capacity(rows, rows * bytes);
        YsbBatchBuilder {
            rows: 0,
            user_id: strings(36),
            page_id: strings(36),
            ad_id: strings(36),
            ad_type: strings(8),
            event_type: strings(5),
            event_time: TimestampMillisecondBuilder::with_capacity(rows),
            ip_address: strings(7),
        }
    }

    pub fn append(&mut self, event: &YsbEventRef<'_>) {
        self.rows += 1;
        self.user_id.append_value(event.user_id);
        self.page_id.append_value(event.page_id);
        self.ad_id.append_value(event.ad_id);
        self.ad_type.append_value(event.ad_type);
        self.event_type.append_value(event.event_type);
        self.event_time.append_value(event.event_time);
        self.ip_address.append_value(event.ip_address);
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The rows appended so far; the builder starts over, sized for as many again.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let rows = self.rows;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.user_id.finish()),
            Arc::new(self.page_id.finish()),
            Arc::new(self.ad_id.finish()),
            Arc::new(self.ad_type.finish()),
            Arc::new(self.event_type.finish()),
            Arc::new(self.event_time.finish()),
            Arc::new(self.ip_address.finish()),
        ];
        *self = YsbBatchBuilder::with_capacity(rows);
        Ok(RecordBatch::try_new(ysb_schema(), columns)?)
    }
}
