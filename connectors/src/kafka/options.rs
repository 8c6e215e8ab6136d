//! The options of a `STORED AS KAFKA` table. A table may be read and
//! written: the source and the sink each declare their own options to the
//! catalog, which hands each side its own and every other option with a
//! dot that no one declares: a librdkafka property, given to the consumer
//! and the producer alike.

use std::collections::BTreeMap;

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

/// The Kafka sink's own options, besides the encoder's
/// ([`crate::encode::ENCODER_OPTIONS`]).
pub const SINK_OPTIONS: &[&str] = &["checkpoint", "offsets.topic", "delivery"];

/// The librdkafka properties among the options a side of the table was
/// given: the dotted ones that are not among its `own`.
pub fn client_properties(
    options: &BTreeMap<String, String>,
    own: &[&str],
) -> BTreeMap<String, String> {
    options
        .iter()
        .filter(|(k, _)| k.contains('.') && !own.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sides_own_dotted_options_are_no_client_properties() {
        let options: BTreeMap<String, String> = [
            ("bootstrap.servers", "127.0.0.1:9092"),
            ("max.records.per.pull", "10"),
            ("linger.ms", "5"),
            ("format", "json"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let props = client_properties(&options, SOURCE_OPTIONS);
        assert_eq!(
            props.keys().map(String::as_str).collect::<Vec<_>>(),
            ["bootstrap.servers", "linger.ms"],
        );
    }
}
