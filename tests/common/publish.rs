//! Helpers of the publishing tests (tests/publish/).

use skein::r#gen::GenReport;
use skein_generators::nexmark::{Event, NexmarkConfig, NexmarkGenerator};

/// (key, value) of every message of `topic`, partition by partition.
pub fn drain_topic(brokers: &str, topic: &str) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    super::kafka::committed_records(brokers, topic)
        .into_iter()
        .map(|(_, key, value)| (key, value))
        .collect()
}

/// The report of `skein gen --json`: its last stdout line.
pub fn gen_report(stdout: &str) -> GenReport {
    super::json_line(stdout)
}

/// Writes `sql` to a fresh file named after `name`; its path.
pub fn write_sql(name: &str, sql: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}.sql", super::unique_name(name)));
    std::fs::write(&path, sql).unwrap();
    path.display().to_string()
}

/// The bids among the first `events` NEXMark events (seed 0).
pub fn bids(events: u64) -> Vec<(i64, i64)> {
    let generator = NexmarkGenerator::new(NexmarkConfig {
        max_events: Some(events),
        ..NexmarkConfig::default()
    })
    .unwrap();
    generator
        .into_events()
        .filter_map(|e| match e {
            Event::Bid(b) => Some((b.auction, b.price)),
            _ => None,
        })
        .collect()
}
