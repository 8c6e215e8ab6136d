//! NEXMark published to Kafka by `skein gen`, and the same events generated
//! in the test process: the input of the tests that read NEXMark from Kafka
//! and the events their references are computed from.

use serde_json::Value;
use skein_generators::nexmark::{Event, NexmarkConfig, NexmarkGenerator};

use super::kafka::{end_offsets, first_records};

/// Topics `<prefix>-person|auction|bid` and the events written to them.
pub struct NexmarkTopics {
    pub prefix: String,
    pub events: Vec<Event>,
}

/// Publish `events` NEXMark events (at `rate` events/s of event time, else
/// the generator's default) to four-partition topics named after `name`,
/// and generate the same stream here: `skein gen` starts event time at the
/// wall clock, so the first person's time is read back from its topic.
/// Fails unless every table's topic holds as many records as generated.
pub fn publish(name: &str, events: u64, rate: Option<u64>) -> NexmarkTopics {
    let brokers = super::require_kafka();
    let prefix = super::unique_name(name);
    let (to, count) = (format!("kafka://{brokers}/{prefix}"), events.to_string());
    let mut args = vec!["gen", "nexmark", "--to", &to, "--events", &count];
    let rate_text = rate.map(|r| r.to_string());
    if let Some(r) = &rate_text {
        args.extend(["--event-rate", r.as_str()]);
    }
    args.extend(["--partitions", "4", "--json"]);
    let (ok, _, stderr) = super::skein(&args);
    assert!(ok, "skein gen nexmark failed:\n{stderr}");
    let base_time_ms = first_records(&brokers, &format!("{prefix}-person"))
        .iter()
        .map(|payload| {
            let v: Value = serde_json::from_slice(payload).expect("a JSON person");
            v["date_time"].as_i64().expect("date_time in ms")
        })
        .min()
        .expect("the person topic has records");
    let mut config = NexmarkConfig {
        base_time_ms,
        max_events: Some(events),
        ..NexmarkConfig::default()
    };
    if let Some(r) = rate {
        config.first_event_rate = r;
    }
    let events: Vec<Event> = NexmarkGenerator::new(config)
        .expect("a NEXMark generator")
        .into_events()
        .collect();
    for (table, kind) in [("person", 0), ("auction", 1), ("bid", 2)] {
        let generated = events
            .iter()
            .filter(|e| match e {
                Event::Person(_) => kind == 0,
                Event::Auction(_) => kind == 1,
                Event::Bid(_) => kind == 2,
            })
            .count() as i64;
        let published: i64 = end_offsets(&brokers, &format!("{prefix}-{table}"))
            .iter()
            .sum();
        assert_eq!(published, generated, "{prefix}-{table}: records");
    }
    NexmarkTopics { prefix, events }
}
