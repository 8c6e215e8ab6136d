//! The Yahoo Streaming Benchmark on Skein, as a library: everything YSB is
//! beyond the engine and the generic connectors. The `skein ysb` commands
//! (in the `skein` package) parse arguments, call in here and print.
//!
//! * [`sink`]: `STORED AS YSB_REDIS`, YSB's result layout as a sink kind;
//! * [`setup`]: the campaigns into Redis as YSB's setup writes them, and
//!   events into the topic with their ground truth ([`setup::generate`]);
//! * [`query`]: queries/ysb.sql filled in, what a run announces, and when a
//!   run has drained ([`drained`]);
//! * [`check`]: Redis against the ground truth and the topic recounted
//!   ([`recount`]); [`latency`]: YSB's window latency;
//! * [`bench`]: what `ysb bench` measures besides the query; [`plot`]: its
//!   latency over time.

pub mod bench;
pub mod check;
pub mod drained;
pub mod error;
pub mod latency;
pub mod plot;
pub mod query;
pub mod recount;
pub mod setup;
pub mod sink;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use skein_generators::ysb::{ADS_PER_CAMPAIGN, NUM_CAMPAIGNS, YsbCampaigns};

pub use error::{Result, YsbError};
pub use sink::{KIND, register_sinks};

use crate::error::Context;

/// (campaign, window start ms) -> (seen_count, time_updated ms): the
/// windows as Redis holds them.
pub type Windows = std::collections::BTreeMap<(String, i64), (u64, i64)>;

/// Where one YSB workload lives: its events, its campaigns and results,
/// the seed of both, and the directory of its ground truth.
#[derive(Debug, Clone)]
pub struct Workload {
    pub brokers: String,
    pub redis: String,
    pub topic: String,
    /// Seed of the campaign and ad UUIDs and of the events.
    pub seed: u64,
    /// Where the ground truth and the campaign mapping are kept.
    pub dir: PathBuf,
}

/// The sink's `checkpoint` name: its epoch markers are
/// `skein:epochs:ysb:<topic>`, the offsets its writes cover
/// `skein:offsets:ysb:<topic>`.
pub fn checkpoint(topic: &str) -> String {
    format!("ysb:{topic}")
}

/// The hash where `ysb run` says which run lineage writes the topic's
/// results and with how many sink members, for `ysb check`.
pub fn run_key(topic: &str) -> String {
    format!("skein:ysb-run:{topic}")
}

/// Where `ysb run` sends undecodable records unless told otherwise.
pub fn default_dead_letter_topic(topic: &str) -> String {
    format!("{topic}-dead-letters")
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// YSB's campaigns and ads of `seed`.
pub fn campaigns(seed: u64) -> YsbCampaigns {
    YsbCampaigns::generate(seed, NUM_CAMPAIGNS, ADS_PER_CAMPAIGN)
}

async fn redis_connection(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).with_context(|| format!("Redis URL {url}"))?;
    // The client's default of 500 ms per reply is short on a loaded machine
    // (a debug build reading a large hash, CI running tests side by side).
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(30)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .with_context(|| format!("connecting to Redis at {url} (scripts/services.sh start redis)"))
}
