//! The options of a `STORED AS KAFKA` table, declared once for both
//! directions. A table may be read and written, so it takes the source's,
//! the sink's, the row encoder's and the event-time options; every other
//! option with a dot is a librdkafka property, given to the consumer and the
//! producer alike.

use std::collections::BTreeMap;

use skein_engine::planner::EMIT_OPTION;
use skein_engine::watermark::EVENT_TIME_OPTIONS;

use crate::encode::ENCODER_OPTIONS;

/// The Kafka source's own options.
pub const SOURCE_OPTIONS: &[&str] = &[
    "format",
    "parallelism",
    "startup",
    "offsets",
    "max.records.per.pull",
    "max.bytes.per.pull",
    "max.record.bytes",
    "pull.timeout.ms",
    "dead.letter.topic",
];

/// The Kafka sink's own options, besides the encoder's ([`ENCODER_OPTIONS`]).
pub const SINK_OPTIONS: &[&str] = &[
    "checkpoint",
    "offsets.topic",
    "delivery",
    skein_engine::sink_health::RETRY_OPTION,
];

/// Whether `key` is one of Skein's options rather than librdkafka's.
pub fn is_skein_option(key: &str) -> bool {
    SOURCE_OPTIONS.contains(&key)
        || SINK_OPTIONS.contains(&key)
        || ENCODER_OPTIONS.contains(&key)
        || EVENT_TIME_OPTIONS.contains(&key)
        || key == EMIT_OPTION
        || key == skein_engine::interval::EPOCH_INTERVAL_OPTION
        || crate::formats::is_format_option(key)
}

/// The librdkafka properties among a table's options: the dotted ones that
/// are not Skein's.
pub fn client_properties(options: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    options
        .iter()
        .filter(|(k, _)| k.contains('.') && !is_skein_option(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_and_producer_get_the_same_properties() {
        let options: BTreeMap<String, String> = [
            ("bootstrap.servers", "127.0.0.1:9092"),
            ("offsets.topic", "skein-offsets"),
            ("max.records.per.pull", "10"),
            ("linger.ms", "5"),
            ("format", "json"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let props = client_properties(&options);
        assert_eq!(
            props.keys().map(String::as_str).collect::<Vec<_>>(),
            ["bootstrap.servers", "linger.ms"],
            "a sink option with a dot (offsets.topic) must not reach the consumer"
        );
    }
}
