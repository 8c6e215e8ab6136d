//! The messages of a write: one per row, or, for an updating query's
//! changelog (see `skein_engine::changelog`), what a topic reader needs to
//! rebuild the result:
//!
//! * upserts (`'key'` given, `json` or `raw` values): a new row is its
//!   value under its key; a retracted row is a tombstone (a null value)
//!   under its key, unless the same write has a new row for that key (an
//!   update), so a compacted topic keeps the latest row per key;
//! * `'format' 'debezium-json'`: a retraction and a new row of the same key
//!   in one write are one update (`u`, before and after); a retraction
//!   alone is a deletion (`d`), a new row alone a creation (`c`).

use std::collections::{HashMap, HashSet};

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::record_batch::RecordBatch;
use skein_engine::changelog;
use skein_engine::sink::SinkRows;

use crate::encode::{RowEncoder, ValueFormat, debezium_event, json_rows};
use crate::error::{ConnectorError, Result};

/// One message: its key, and its value (`None`: a tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
}

/// Whether a Kafka sink so configured takes a changelog.
pub fn takes_updates(encoder: &RowEncoder) -> std::result::Result<(), String> {
    match (encoder.format(), encoder.key_column()) {
        (ValueFormat::DebeziumJson, _) | (_, Some(_)) => Ok(()),
        _ => Err(
            "a KAFKA table takes updates as upserts by 'key' (a tombstone on delete, \
                  for a compacted topic) or as 'format' 'debezium-json'; it has neither"
                .into(),
        ),
    }
}

/// The messages of a write, in order: appended rows one each; changes as
/// upserts by key or as Debezium events.
pub fn messages(encoder: &RowEncoder, rows: &SinkRows) -> Result<Vec<Message>> {
    let (retract, insert) = rows.by_kind();
    let nonempty = |bs: &[RecordBatch]| -> Vec<RecordBatch> {
        bs.iter().filter(|b| b.num_rows() > 0).cloned().collect()
    };
    let (retract, insert) = (nonempty(retract), nonempty(insert));
    if matches!(encoder.format(), ValueFormat::DebeziumJson) {
        // A key's retraction and its new row may come in different batches
        // of one write: the events pair them across the whole write.
        return debezium(encoder, &retract, &insert);
    }
    if !rows.updates() {
        let mut out = vec![];
        for batch in &insert {
            out.extend(encoder.encode(batch)?.into_iter().map(|r| Message {
                key: r.key,
                value: Some(r.value),
            }));
        }
        return Ok(out);
    }
    let schema = match insert.first().or(retract.first()) {
        Some(b) => b.schema(),
        None => return Ok(vec![]),
    };
    let retract = concat_batches(&schema, &retract)?;
    let insert = concat_batches(&schema, &insert)?;
    upserts(encoder, &retract, &insert)
}

fn upserts(
    encoder: &RowEncoder,
    retract: &RecordBatch,
    insert: &RecordBatch,
) -> Result<Vec<Message>> {
    if encoder.key_column().is_none() {
        return Err(ConnectorError::Config(
            "an updating result needs 'key' (or 'format' 'debezium-json') on a KAFKA table".into(),
        ));
    }
    let rows = encoder.encode(insert)?;
    let updated: HashSet<&Option<Vec<u8>>> = rows.iter().map(|r| &r.key).collect();
    let mut out: Vec<Message> = encoder
        .keys(retract)?
        .into_iter()
        .filter(|k| !updated.contains(k))
        .map(|key| Message { key, value: None })
        .collect();
    out.extend(rows.into_iter().map(|r| Message {
        key: r.key,
        value: Some(r.value),
    }));
    Ok(out)
}

fn debezium(
    encoder: &RowEncoder,
    retract: &[RecordBatch],
    insert: &[RecordBatch],
) -> Result<Vec<Message>> {
    let keyed = encoder.key_column().is_some();
    // Each event at the place of its first row; a retraction's place stays
    // empty until its key's new row (an update) or the write's end (a delete).
    let mut out: Vec<Option<Message>> = vec![];
    let mut retracted: HashMap<Vec<u8>, (usize, Vec<u8>)> = HashMap::new();
    let event = |key: Option<Vec<u8>>, before: Option<&[u8]>, after: Option<&[u8]>, op| {
        Some(Message {
            key,
            value: Some(debezium_event(before, after, op)),
        })
    };
    let kinds = retract
        .iter()
        .map(|b| (changelog::RETRACT, b))
        .chain(insert.iter().map(|b| (changelog::INSERT, b)));
    for (op, batch) in kinds {
        let rows = json_rows(batch)?;
        let keys = encoder.keys(batch)?;
        for (row, key) in rows.into_iter().zip(keys) {
            match (op, key) {
                (changelog::RETRACT, Some(k)) if keyed => {
                    if let Some((at, before)) = retracted.insert(k.clone(), (out.len(), row)) {
                        out[at] = event(Some(k.clone()), Some(&before), None, "d");
                    }
                    out.push(None);
                }
                (changelog::RETRACT, key) => out.push(event(key, Some(&row), None, "d")),
                (_, key) => match key.as_ref().and_then(|k| retracted.remove(k)) {
                    Some((at, before)) => out[at] = event(key, Some(&before), Some(&row), "u"),
                    None => out.push(event(key, None, Some(&row), "c")),
                },
            }
        }
    }
    for (key, (at, before)) in retracted {
        out[at] = event(Some(key), Some(&before), None, "d");
    }
    Ok(out.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int8Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn changes(keys: &[&str], values: &[i64], ops: &[i8]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(values.to_vec())),
            ],
        )
        .unwrap();
        changelog::tag_each(&b, Int8Array::from(ops.to_vec())).unwrap()
    }

    /// Tagged batches as the engine hands them to a sink.
    fn rows(batches: Vec<RecordBatch>) -> SinkRows {
        SinkRows::from_stage(&batches[0].schema(), batches)
            .unwrap()
            .1
    }

    fn encoder(format: &str, key: Option<&str>) -> RowEncoder {
        let mut o = std::collections::BTreeMap::new();
        o.insert("format".to_string(), format.to_string());
        if let Some(k) = key {
            o.insert("key".to_string(), k.to_string());
        }
        RowEncoder::from_options(&o, "t").unwrap()
    }

    #[test]
    fn upserts_write_the_new_row_and_a_tombstone_only_for_a_deleted_key() {
        // a: 1 -> 2 (an update); b deleted; c created.
        let batch = changes(&["a", "b", "a", "c"], &[1, 5, 2, 3], &[-1, -1, 1, 1]);
        let m = messages(&encoder("json", Some("k")), &rows(vec![batch])).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[0],
            Message {
                key: Some(b"b".to_vec()),
                value: None
            }
        );
        assert_eq!(m[1].key.as_deref(), Some(&b"a"[..]));
        assert_eq!(m[1].value.as_deref(), Some(&br#"{"k":"a","n":2}"#[..]));
        assert!(takes_updates(&encoder("json", None)).is_err());
    }

    #[test]
    fn debezium_events_pair_an_update_by_key() {
        let batch = changes(&["a", "b", "a", "c"], &[1, 5, 2, 3], &[-1, -1, 1, 1]);
        let m = messages(&encoder("debezium-json", Some("k")), &rows(vec![batch])).unwrap();
        let ops: Vec<serde_json::Value> = m
            .iter()
            .map(|m| serde_json::from_slice(m.value.as_ref().unwrap()).unwrap())
            .collect();
        assert_eq!(ops[0]["op"], "u");
        assert_eq!(ops[0]["before"]["n"], 1);
        assert_eq!(ops[0]["after"]["n"], 2);
        assert_eq!(ops[1]["op"], "d");
        assert_eq!(ops[1]["before"]["k"], "b");
        assert!(ops[1]["after"].is_null());
        assert_eq!(ops[2]["op"], "c");
        assert_eq!(ops[2]["after"]["k"], "c");
        assert!(takes_updates(&encoder("debezium-json", None)).is_ok());
    }

    #[test]
    fn debezium_pairs_a_retraction_and_its_new_row_across_the_batches_of_a_write() {
        let retract = changes(&["a", "b"], &[1, 5], &[-1, -1]);
        let insert = changes(&["b", "a"], &[6, 2], &[1, 1]);
        let m = messages(
            &encoder("debezium-json", Some("k")),
            &rows(vec![retract, insert]),
        )
        .unwrap();
        let events: Vec<serde_json::Value> = m
            .iter()
            .map(|m| serde_json::from_slice(m.value.as_ref().unwrap()).unwrap())
            .collect();
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(events.iter().all(|e| e["op"] == "u"), "{events:?}");
        assert_eq!(events[0]["before"]["k"], "a");
        assert_eq!(events[0]["after"]["n"], 2);
        assert_eq!(m[1].key.as_deref(), Some(&b"b"[..]));
    }
}
