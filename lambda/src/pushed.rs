//! A batch a Kinesis event-source mapping pushes to a query's source
//! function: Lambda's event format, parsed into the records the source's
//! `decode_pushed` takes.

use skein_engine::source::PushedRecord;

/// A batch a Lambda Kinesis event-source mapping delivered: `{"Records":
/// [{"eventSource": "aws:kinesis", "eventID": "<shard>:<sequence>",
/// "kinesis": {"data": <base64>, "sequenceNumber", "partitionKey"}}, ...]}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KinesisEventBatch {
    /// Stable for the batch (a retried batch has the same first record):
    /// FNV-1a of its first shard and sequence number.
    pub batch_id: u64,
    pub records: Vec<PushedRecord>,
}

/// Reads an event-source-mapping event; `None` if `event` is not one, an
/// error naming the record and field if it is one but malformed.
pub fn parse_kinesis_event(
    event: &serde_json::Value,
) -> Option<std::result::Result<KinesisEventBatch, String>> {
    use base64::Engine;
    let records = event.get("Records")?.as_array()?;
    let is_kinesis = records
        .first()
        .and_then(|r| r.get("eventSource"))
        .and_then(|s| s.as_str())
        == Some("aws:kinesis");
    if !is_kinesis {
        return None;
    }
    let parse = || -> std::result::Result<KinesisEventBatch, String> {
        let mut out = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let field = |path: &[&str]| -> std::result::Result<&str, String> {
                let mut v = r;
                for p in path {
                    v = v
                        .get(p)
                        .ok_or_else(|| format!("record {i}: no {}", path.join(".")))?;
                }
                v.as_str()
                    .ok_or_else(|| format!("record {i}: {} is not a string", path.join(".")))
            };
            let sequence = field(&["kinesis", "sequenceNumber"])?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(field(&["kinesis", "data"])?)
                .map_err(|e| format!("record {i}: kinesis.data is not base64: {e}"))?;
            // eventID is "<shard id>:<sequence number>".
            let shard = field(&["eventID"])?
                .split_once(':')
                .map(|(shard, _)| shard.to_string())
                .ok_or_else(|| format!("record {i}: eventID is not <shard>:<sequence>"))?;
            out.push(PushedRecord {
                partition: shard,
                position: sequence.to_string(),
                data,
            });
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        if let Some(first) = out.first() {
            for b in first
                .partition
                .bytes()
                .chain([0x1f])
                .chain(first.position.bytes())
            {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        Ok(KinesisEventBatch {
            batch_id: hash,
            records: out,
        })
    };
    Some(parse())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_source_mapping_batches_parse() {
        let event = serde_json::json!({"Records": [
            {"eventSource": "aws:kinesis", "eventID": "shardId-000000000001:4959",
             "kinesis": {"data": "eyJhIjogMX0=", "sequenceNumber": "4959", "partitionKey": "k"}},
            {"eventSource": "aws:kinesis", "eventID": "shardId-000000000001:4960",
             "kinesis": {"data": "", "sequenceNumber": "4960", "partitionKey": "k"}}
        ]});
        let batch = parse_kinesis_event(&event).unwrap().unwrap();
        assert_eq!(batch.records.len(), 2);
        assert_eq!(batch.records[0].data, br#"{"a": 1}"#);
        assert_eq!(batch.records[0].partition, "shardId-000000000001");
        assert_eq!(batch.records[1].position, "4960");
        let again = parse_kinesis_event(&event).unwrap().unwrap();
        assert_eq!(
            batch.batch_id, again.batch_id,
            "a retried batch keeps its id"
        );

        assert!(parse_kinesis_event(&serde_json::json!({"trigger": {}})).is_none());
        let sqs = serde_json::json!({"Records": [{"eventSource": "aws:sqs"}]});
        assert!(parse_kinesis_event(&sqs).is_none());
        let bad = serde_json::json!({"Records": [
            {"eventSource": "aws:kinesis", "eventID": "s:1", "kinesis": {"data": "%%", "sequenceNumber": "1"}}
        ]});
        let err = parse_kinesis_event(&bad).unwrap().unwrap_err();
        assert!(err.contains("record 0") && err.contains("base64"), "{err}");
        let missing =
            serde_json::json!({"Records": [{"eventSource": "aws:kinesis", "eventID": "s:1"}]});
        let err = parse_kinesis_event(&missing).unwrap().unwrap_err();
        assert!(err.contains("kinesis.sequenceNumber"), "{err}");
    }
}
