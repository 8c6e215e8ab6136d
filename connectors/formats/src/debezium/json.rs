//! `debezium-json`: the envelope is scanned for `before`, `after` and `op`
//! (inside `payload` when the converter writes schemas too); the row
//! objects are decoded by the JSON decoder of the table's columns.

use datafusion::arrow::record_batch::RecordBatch;

use super::{Change, tagged};
use crate::text::json::scan_json;
use crate::text::scanned::Raw;
use crate::text::{TextBuilder, TextDecoder};
use skein_clients::error::Result;

const KEYS: [&[u8]; 4] = [b"before", b"after", b"op", b"payload"];

/// Decodes Debezium JSON events one at a time.
pub struct DebeziumJsonBuilder<'d> {
    rows: TextBuilder<'d>,
    ops: Vec<i8>,
    names: Vec<Vec<u8>>,
    raw: Vec<Option<Raw>>,
}

impl<'d> DebeziumJsonBuilder<'d> {
    pub(crate) fn new(decoder: &'d TextDecoder, capacity: usize) -> Self {
        DebeziumJsonBuilder {
            rows: decoder.builder(capacity),
            ops: Vec::with_capacity(capacity),
            names: KEYS.iter().map(|k| k.to_vec()).collect(),
            raw: vec![None; KEYS.len()],
        }
    }

    pub(crate) fn push(&mut self, record: &[u8]) -> std::result::Result<(), String> {
        if record.is_empty() {
            return Ok(()); // a tombstone
        }
        let mut envelope = record;
        self.scan(envelope)?;
        // With the converter's schemas: {"schema": ..., "payload": {...}}.
        if let (None, Some(Raw::Nested { start, end })) = (self.raw[2], self.raw[3]) {
            envelope = &record[start as usize..end as usize];
            self.scan(envelope)?;
        }
        let op = match self.raw[2] {
            Some(Raw::Str {
                start,
                end,
                escaped: false,
            }) => std::str::from_utf8(&envelope[start as usize..end as usize])
                .map_err(|e| format!("Debezium op: {e}"))?,
            _ => return Err("not a Debezium event: no string 'op'".into()),
        };
        let change = Change::of(op)?;
        let image = |raw: Option<Raw>| -> std::result::Result<Option<&[u8]>, String> {
            match raw {
                None | Some(Raw::Null) => Ok(None),
                Some(Raw::Nested { start, end }) if envelope[start as usize] == b'{' => {
                    Ok(Some(&envelope[start as usize..end as usize]))
                }
                Some(_) => Err("a Debezium 'before' or 'after' that is not an object".into()),
            }
        };
        let (before, after) = (image(self.raw[0])?, image(self.raw[1])?);
        change.check(before.is_some(), after.is_some())?;
        let which = |what: &str, why: String| format!("Debezium '{what}': {why}");
        match (change, before, after) {
            (Change::Insert, _, Some(a)) => self.rows.push(a).map_err(|w| which("after", w))?,
            (Change::Delete, Some(b), _) => self.rows.push(b).map_err(|w| which("before", w))?,
            (Change::Update, Some(b), Some(a)) => self
                .rows
                .push_pair(b, a)
                .map_err(|w| which("before' or 'after", w))?,
            _ => unreachable!("checked above"),
        }
        self.ops.extend_from_slice(change.ops());
        Ok(())
    }

    fn scan(&mut self, envelope: &[u8]) -> std::result::Result<(), String> {
        self.raw.iter_mut().for_each(|r| *r = None);
        scan_json(envelope, &self.names, &mut self.raw)
            .map_err(|why| format!("not a Debezium event: {why}"))
    }

    pub(crate) fn finish(self) -> Result<RecordBatch> {
        let rows = self.rows.finish()?;
        tagged(&rows, self.ops)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{AsArray, Int8Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use crate::decode::RecordDecoder;
    use crate::format::Format;

    #[test]
    fn events_become_changelog_rows_and_bad_ones_are_rejected() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let d = RecordDecoder::new(schema, Format::DebeziumJson, 1 << 20).unwrap();
        assert!(d.changelog());
        let records: Vec<&[u8]> = vec![
            br#"{"before": null, "after": {"id": 1, "name": "a"}, "op": "c", "ts_ms": 1}"#,
            br#"{"schema": {"type": "struct"}, "payload": {"before": {"id": 1, "name": "a"}, "after": {"id": 1, "name": "b"}, "op": "u"}}"#,
            b"",
            br#"{"before": {"id": 1, "name": "b"}, "after": null, "op": "d"}"#,
            br#"{"before": null, "after": {"id": 2}, "op": "r"}"#,
            br#"{"before": null, "after": {"id": 3}, "op": "u"}"#,
            br#"{"before": {"id": 3}, "after": {"id": "x"}, "op": "u"}"#,
            br#"{"after": {"id": 4}, "op": "t"}"#,
            b"not json",
        ];
        let (batch, rejected) = d.decode(records.clone().into_iter()).unwrap();
        let ids: Vec<i64> = batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        // Created, updated and deleted in one batch: netted away; only the
        // snapshot read of 2 is left.
        assert_eq!(ids, [2]);
        let ops = batch
            .column(2)
            .as_any()
            .downcast_ref::<Int8Array>()
            .unwrap();
        assert_eq!(ops.values().to_vec(), [1]);
        // Apart, each event is its rows: an update retracts, then inserts.
        let (update, _) = d.decode([records[1]].into_iter()).unwrap();
        let ops = update
            .column(2)
            .as_any()
            .downcast_ref::<Int8Array>()
            .unwrap();
        assert_eq!(ops.values().to_vec(), [-1, 1]);
        assert_eq!(update.column(1).as_string::<i32>().value(1), "b");
        let why: Vec<(usize, &str)> = rejected
            .iter()
            .map(|r| (r.index, r.reason.as_str()))
            .collect();
        assert_eq!(why.len(), 4, "{why:?}");
        assert!(why[0].1.contains("without 'before'"), "{why:?}");
        assert!(why[1].1.contains("expected a number"), "{why:?}");
        assert!(why[2].1.contains("\"t\""), "{why:?}");
        assert!(why[3].1.starts_with("not a Debezium event"), "{why:?}");
    }
}
