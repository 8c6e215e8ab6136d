//! Kafka client setup for both sides of a `STORED AS KAFKA` table. The
//! source and the sink each declare their own options to the catalog,
//! which hands each side its own and every other option with a dot that
//! no one declares: a librdkafka property, given to the consumer and the
//! producer alike. [`client_config`] turns what a side was given into the
//! configuration of a client in its [`KafkaRole`].

use std::collections::BTreeMap;

use rdkafka::ClientConfig;

/// The `STORED AS` name of a Kafka table.
pub const KIND: &str = "KAFKA";

/// Which kind of client a side of a table (or a part of one, such as a
/// source's dead-letter producer) needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaRole {
    /// Reads partitions (a source).
    Consumer,
    /// Writes messages (a sink, a source's dead letters).
    Producer,
}

/// librdkafka fetch settings used unless the table's options set them.
///
/// librdkafka stops fetching a partition once its local queue holds
/// `queued.min.messages` records (default 100 000) or
/// `queued.max.messages.kbytes`, and then waits `fetch.queue.backoff.ms`
/// (default 1000) before it looks again. A consumer that drains a backlog
/// faster than that empties the queue well within the second and then
/// idles: with 16 MiB fetches per partition (one fetch overshoots 100 000
/// records) a drain of YSB events fell to ~0.2 M records/s. A 10 ms backoff
/// and a larger record threshold (the 64 MiB byte limit still bounds memory)
/// keep the fetches flowing.
///
/// `fetch.wait.max.ms` (default 500) is how long the broker holds a fetch
/// that finds nothing new; requests for the high watermark queue behind it
/// on the same connection, so a pull at the end of the topic waited up to
/// that long per partition. 100 ms keeps idle fetches cheap enough.
pub const FETCH_DEFAULTS: &[(&str, &str)] = &[
    ("fetch.queue.backoff.ms", "10"),
    ("queued.min.messages", "1000000"),
    ("fetch.wait.max.ms", "100"),
];

/// What a producer is set to unless the table says otherwise: idempotent,
/// acknowledged by all in-sync replicas, and batched for throughput.
pub const PRODUCER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("linger.ms", "5"),
    ("batch.size", "1000000"),
    ("compression.type", "lz4"),
    ("queue.buffering.max.messages", "1000000"),
    ("queue.buffering.max.kbytes", "1048576"),
    ("message.timeout.ms", "120000"),
];

impl KafkaRole {
    /// The librdkafka settings of the role, unless the table sets them.
    pub fn defaults(self) -> &'static [(&'static str, &'static str)] {
        match self {
            KafkaRole::Consumer => FETCH_DEFAULTS,
            KafkaRole::Producer => PRODUCER_DEFAULTS,
        }
    }
}

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

/// A client in `role` for a side of a table given `options`, whose own
/// options are `own`: the role's defaults, then the table's librdkafka
/// properties over them.
pub fn client_config(
    role: KafkaRole,
    options: &BTreeMap<String, String>,
    own: &[&str],
) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in role.defaults() {
        config.set(*k, *v);
    }
    for (k, v) in client_properties(options, own) {
        config.set(k, v);
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sides_own_dotted_options_are_no_client_properties() {
        let options: BTreeMap<String, String> = [
            ("bootstrap.servers", "127.0.0.1:9092"),
            ("max.records.per.pull", "10"),
            ("linger.ms", "50"),
            ("format", "json"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let own = ["format", "max.records.per.pull"];
        let props = client_properties(&options, &own);
        assert_eq!(
            props.keys().map(String::as_str).collect::<Vec<_>>(),
            ["bootstrap.servers", "linger.ms"],
        );
        let producer = client_config(KafkaRole::Producer, &options, &own);
        assert_eq!(producer.get("linger.ms"), Some("50"), "the table's wins");
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
        assert_eq!(producer.get("max.records.per.pull"), None);
        let consumer = client_config(KafkaRole::Consumer, &options, &own);
        assert_eq!(consumer.get("fetch.wait.max.ms"), Some("100"));
        assert_eq!(consumer.get("enable.idempotence"), None);
    }
}
