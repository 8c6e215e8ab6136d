//! The Yahoo Streaming Benchmark (YSB) generator, compatible with
//! yahoo/streaming-benchmarks.
//!
//! * 100 campaigns of 10 ads each, all identified by UUID strings; ad `j` belongs to
//!   campaign `j / 10` (the reference partitions its ad list in tens, in order).
//! * Events are ad interactions: a user (one of 100 UUIDs) on a page (one of 100 UUIDs)
//!   sees an ad (one of the 1000) of a random `ad_type` with a random `event_type`;
//!   `ip_address` is always `1.2.3.4`.
//! * Event `n` happens at `base_time + floor(n * floor(1e9 / rate) / 1e6)` ms, the
//!   reference's real-time emitter schedule. With `with_skew`, each time is moved by
//!   -49 ..= +50 ms and one event in 100 000 is made up to 60 s late, as the reference's
//!   `--with-skew` does.
//! * The benchmark query counts `view` events per campaign in 10 s tumbling windows;
//!   [`YsbGroundTruth`] accumulates the expected counts for what was generated.
//!
//! UUIDs and events are deterministic for a seed (the reference draws fresh random ones
//! each run), and instance `i` of `N` ([`Slice`]) produces events `i, i + N, ...`.
//! Writing the campaigns to Redis (`SET <ad> <campaign>`, `SADD campaigns <campaign>`)
//! is left to the caller: [`YsbCampaigns`] exposes the mapping.

mod arrow;
mod recount;
#[cfg(test)]
mod tests;
mod truth;

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::Slice;
use crate::error::{GeneratorError, Result};
use crate::rng::ItemRng;
use crate::text::{push_int, push_uuid};

pub use arrow::{YsbBatchBuilder, ysb_schema};
pub use recount::{YsbRecount, malformed_record};
pub use truth::YsbGroundTruth;

/// Campaigns in the benchmark.
pub const NUM_CAMPAIGNS: u32 = 100;
/// Ads per campaign.
pub const ADS_PER_CAMPAIGN: u32 = 10;
/// Distinct users and pages events are drawn from.
pub const NUM_USERS: u32 = 100;
pub const NUM_PAGES: u32 = 100;
/// The values of `ad_type`.
pub const AD_TYPES: [&str; 5] = ["banner", "modal", "sponsored-search", "mail", "mobile"];
/// The values of `event_type`; the query keeps `view`.
pub const EVENT_TYPES: [&str; 3] = ["view", "click", "purchase"];
/// The constant `ip_address` of every event.
pub const IP_ADDRESS: &str = "1.2.3.4";
/// The tumbling window of the benchmark query, 10 s.
pub const WINDOW_MS: i64 = 10_000;
/// Default event time of event 0: 2020-01-01T00:00:00Z (fixed, for repeatable runs).
pub const DEFAULT_BASE_TIME_MS: i64 = 1_577_836_800_000;

const CAMPAIGN_STREAM: u64 = 0x7973_6263_616d_7001; // "ysbcamp"
const AD_STREAM: u64 = 0x7973_6261_6473_0002; // "ysbads"
const USER_STREAM: u64 = 0x7973_6275_7365_7203; // "ysbuser"
const PAGE_STREAM: u64 = 0x7973_6270_6167_6504; // "ysbpage"
const EVENT_STREAM: u64 = 0x7973_6265_7665_6e05; // "ysbeven"

/// The seed every YSB command uses unless told otherwise (`skein gen ysb`,
/// `skein ysb setup|generate|check`), so that the ads of published events
/// are the ads `ysb setup` maps to campaigns.
pub const DEFAULT_SEED: u64 = 0;

/// Generator parameters; defaults are the benchmark's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct YsbConfig {
    /// Seed of the UUIDs and of every event.
    pub seed: u64,
    /// Event time of event 0, ms since the epoch.
    pub base_time_ms: i64,
    /// Events per second of event time (the whole stream, not per slice).
    pub events_per_second: u64,
    /// Total events of the whole stream; `None` for unbounded.
    pub max_events: Option<u64>,
    pub num_campaigns: u32,
    pub ads_per_campaign: u32,
    pub num_users: u32,
    pub num_pages: u32,
    /// Jitter event times and make a few events late, as the reference's `--with-skew`.
    pub with_skew: bool,
}

impl Default for YsbConfig {
    fn default() -> Self {
        YsbConfig {
            seed: DEFAULT_SEED,
            base_time_ms: DEFAULT_BASE_TIME_MS,
            events_per_second: 100_000,
            max_events: None,
            num_campaigns: NUM_CAMPAIGNS,
            ads_per_campaign: ADS_PER_CAMPAIGN,
            num_users: NUM_USERS,
            num_pages: NUM_PAGES,
            with_skew: false,
        }
    }
}

impl YsbConfig {
    pub fn validate(&self) -> Result<()> {
        let invalid = |m: &str| Err(GeneratorError::InvalidConfig(m.to_owned()));
        if self.events_per_second == 0 || self.events_per_second > 1_000_000_000 {
            return invalid("events_per_second must be in 1 ..= 1e9");
        }
        if self.num_campaigns == 0 || self.ads_per_campaign == 0 {
            return invalid("num_campaigns and ads_per_campaign must be at least 1");
        }
        if self.num_users == 0 || self.num_pages == 0 {
            return invalid("num_users and num_pages must be at least 1");
        }
        Ok(())
    }
}

/// The campaigns and their ads, as UUID strings.
#[derive(Debug, Clone)]
pub struct YsbCampaigns {
    campaign_ids: Vec<String>,
    ad_ids: Vec<String>,
    ads_per_campaign: usize,
    campaign_index_of_ad: HashMap<String, u32>,
}

impl YsbCampaigns {
    /// The campaigns and ads for `seed`.
    pub fn generate(seed: u64, num_campaigns: u32, ads_per_campaign: u32) -> Self {
        let campaign_ids = uuids(seed, CAMPAIGN_STREAM, num_campaigns as usize);
        let ad_ids = uuids(seed, AD_STREAM, (num_campaigns * ads_per_campaign) as usize);
        let ads_per_campaign = ads_per_campaign as usize;
        let campaign_index_of_ad = ad_ids
            .iter()
            .enumerate()
            .map(|(j, ad)| (ad.clone(), (j / ads_per_campaign) as u32))
            .collect();
        YsbCampaigns {
            campaign_ids,
            ad_ids,
            ads_per_campaign,
            campaign_index_of_ad,
        }
    }

    pub fn campaign_ids(&self) -> &[String] {
        &self.campaign_ids
    }

    pub fn ad_ids(&self) -> &[String] {
        &self.ad_ids
    }

    /// The campaign (index into [`Self::campaign_ids`]) of ad number `ad_index`.
    pub fn campaign_index_of(&self, ad_index: usize) -> usize {
        ad_index / self.ads_per_campaign
    }

    /// The campaign index of an ad id, if it is one of ours.
    pub fn campaign_index_of_ad(&self, ad_id: &str) -> Option<usize> {
        self.campaign_index_of_ad.get(ad_id).map(|&i| i as usize)
    }

    /// The campaign id of an ad id, if it is one of ours.
    pub fn campaign_of(&self, ad_id: &str) -> Option<&str> {
        self.campaign_index_of_ad(ad_id)
            .map(|i| self.campaign_ids[i].as_str())
    }

    /// Every (ad id, campaign id) pair, in ad order: what goes to Redis as
    /// `SET <ad_id> <campaign_id>`.
    pub fn ad_campaign_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.ad_ids.iter().enumerate().map(|(j, ad)| {
            (
                ad.as_str(),
                self.campaign_ids[j / self.ads_per_campaign].as_str(),
            )
        })
    }

    /// Writes the mapping in the reference's `ad-to-campaign-ids.txt` form: one
    /// `{ "<ad_id>": "<campaign_id>"}` JSON object per line.
    pub fn write_mapping(&self, path: &Path) -> Result<()> {
        let mut text = String::with_capacity(self.ad_ids.len() * 80);
        for (ad, campaign) in self.ad_campaign_pairs() {
            text.push_str("{ \"");
            text.push_str(ad);
            text.push_str("\": \"");
            text.push_str(campaign);
            text.push_str("\"}\n");
        }
        write_file(path, text.as_bytes())
    }

    /// Reads a file written by [`Self::write_mapping`] (or by the reference) back into
    /// (ad id, campaign id) pairs, in file order.
    pub fn read_mapping(path: &Path) -> Result<Vec<(String, String)>> {
        let text = std::fs::read_to_string(path).map_err(|source| GeneratorError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let mut pairs = Vec::new();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let malformed = |detail: String| GeneratorError::Malformed {
                what: "ad-to-campaign mapping",
                detail: format!("line {}: {detail}", i + 1),
            };
            let map: HashMap<String, String> =
                serde_json::from_str(line).map_err(|e| malformed(e.to_string()))?;
            if map.len() != 1 {
                return Err(malformed(format!(
                    "expected one entry, found {}",
                    map.len()
                )));
            }
            pairs.extend(map);
        }
        Ok(pairs)
    }
}

fn uuids(seed: u64, stream: u64, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let mut s = String::with_capacity(36);
            push_uuid(&mut ItemRng::new(seed, stream, i as u64), &mut s);
            s
        })
        .collect()
}

pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| GeneratorError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut file = std::fs::File::create(path).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.flush().map_err(io)
}

/// One generated ad event, borrowing the generator's id tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YsbEventRef<'a> {
    pub user_id: &'a str,
    pub page_id: &'a str,
    pub ad_id: &'a str,
    pub ad_type: &'static str,
    pub event_type: &'static str,
    /// ms since the epoch (a string in the JSON form).
    pub event_time: i64,
    pub ip_address: &'static str,
    /// Index of the ad's campaign in [`YsbCampaigns::campaign_ids`] (not part of the
    /// record; the query finds it by joining with the mapping).
    pub campaign_index: u32,
}

impl YsbEventRef<'_> {
    pub fn is_view(&self) -> bool {
        self.event_type == EVENT_TYPES[0]
    }

    /// Appends the record in the reference's exact JSON layout (no trailing newline):
    /// `{"user_id": "...", "page_id": "...", "ad_id": "...", "ad_type": "...",
    /// "event_type": "...", "event_time": "<ms>", "ip_address": "1.2.3.4"}`.
    /// Every value is a UUID or one of our constants, so none needs escaping.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let fields: [(&[u8], &str); 5] = [
            (b"{\"user_id\": \"", self.user_id),
            (b"\", \"page_id\": \"", self.page_id),
            (b"\", \"ad_id\": \"", self.ad_id),
            (b"\", \"ad_type\": \"", self.ad_type),
            (b"\", \"event_type\": \"", self.event_type),
        ];
        for (prefix, value) in fields {
            out.extend_from_slice(prefix);
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(b"\", \"event_time\": \"");
        push_int(out, self.event_time);
        out.extend_from_slice(b"\", \"ip_address\": \"");
        out.extend_from_slice(self.ip_address.as_bytes());
        out.extend_from_slice(b"\"}");
    }

    pub fn to_owned_event(&self) -> YsbEvent {
        YsbEvent {
            user_id: self.user_id.to_owned(),
            page_id: self.page_id.to_owned(),
            ad_id: self.ad_id.to_owned(),
            ad_type: self.ad_type.to_owned(),
            event_type: self.event_type.to_owned(),
            event_time: self.event_time.to_string(),
            ip_address: self.ip_address.to_owned(),
        }
    }
}

/// An owned ad event in its JSON shape (`event_time` is a string of epoch ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct YsbEvent {
    pub user_id: String,
    pub page_id: String,
    pub ad_id: String,
    pub ad_type: String,
    pub event_type: String,
    pub event_time: String,
    pub ip_address: String,
}

#[derive(Debug)]
struct Shared {
    config: YsbConfig,
    campaigns: YsbCampaigns,
    user_ids: Vec<String>,
    page_ids: Vec<String>,
    period_ns: u64,
}

/// Produces the events of one [`Slice`] of a YSB stream, in event-number order.
#[derive(Debug, Clone)]
pub struct YsbGenerator {
    shared: Arc<Shared>,
    slice: Slice,
    position: u64,
}

impl YsbGenerator {
    /// A generator of the whole stream.
    pub fn new(config: YsbConfig) -> Result<Self> {
        Self::with_slice(config, Slice::WHOLE)
    }

    /// A generator of one slice of the stream.
    pub fn with_slice(config: YsbConfig, slice: Slice) -> Result<Self> {
        config.validate()?;
        Slice::new(slice.index, slice.count)?;
        let shared = Shared {
            campaigns: YsbCampaigns::generate(
                config.seed,
                config.num_campaigns,
                config.ads_per_campaign,
            ),
            user_ids: uuids(config.seed, USER_STREAM, config.num_users as usize),
            page_ids: uuids(config.seed, PAGE_STREAM, config.num_pages as usize),
            period_ns: 1_000_000_000 / config.events_per_second,
            config,
        };
        Ok(YsbGenerator {
            shared: Arc::new(shared),
            slice,
            position: 0,
        })
    }

    /// `count` generators that together produce exactly the stream of `config`.
    pub fn split(config: YsbConfig, count: u32) -> Result<Vec<Self>> {
        let whole = Self::new(config)?;
        (0..count)
            .map(|index| {
                Ok(YsbGenerator {
                    slice: Slice::new(index, count)?,
                    ..whole.clone()
                })
            })
            .collect()
    }

    pub fn config(&self) -> &YsbConfig {
        &self.shared.config
    }

    pub fn campaigns(&self) -> &YsbCampaigns {
        &self.shared.campaigns
    }

    pub fn slice(&self) -> Slice {
        self.slice
    }

    /// Events this generator has produced (its checkpoint).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Resumes after `position` events of this slice.
    pub fn seek(&mut self, position: u64) {
        self.position = position;
    }

    /// Events this slice has left; `None` when unbounded.
    pub fn remaining(&self) -> Option<u64> {
        let total = self.shared.config.max_events?;
        Some(self.slice.len_of(total).saturating_sub(self.position))
    }

    /// The event number the next call will produce, if any is left.
    pub fn next_event_number(&self) -> Option<u64> {
        let n = self.slice.event_number(self.position);
        match self.shared.config.max_events {
            Some(total) if n >= total => None,
            _ => Some(n),
        }
    }

    /// Scheduled event time of event `n` before any skew, ms since the epoch.
    pub fn scheduled_time_ms(&self, n: u64) -> i64 {
        let period_ns = self.shared.period_ns;
        // 64-bit arithmetic while it cannot overflow (centuries of event time); 128 beyond.
        let offset_ms = match n.checked_mul(period_ns) {
            Some(ns) => ns / 1_000_000,
            None => (u128::from(n) * u128::from(period_ns) / 1_000_000) as u64,
        };
        self.shared.config.base_time_ms + offset_ms as i64
    }

    /// The next event of this slice, or `None` when the slice is exhausted.
    pub fn next_event(&mut self) -> Option<YsbEventRef<'_>> {
        let n = self.next_event_number()?;
        self.position += 1;
        Some(self.event_at(n))
    }

    /// Event number `n` of the whole stream (random access; the position stays).
    pub fn event_at(&self, n: u64) -> YsbEventRef<'_> {
        let shared = &*self.shared;
        let config = &shared.config;
        let mut rng = ItemRng::new(config.seed, EVENT_STREAM, n);
        let user = rng.below(shared.user_ids.len() as u64) as usize;
        let page = rng.below(shared.page_ids.len() as u64) as usize;
        let ad = rng.below(shared.campaigns.ad_ids.len() as u64) as usize;
        let ad_type = AD_TYPES[rng.below(AD_TYPES.len() as u64) as usize];
        let event_type = EVENT_TYPES[rng.below(EVENT_TYPES.len() as u64) as usize];
        let mut event_time = self.scheduled_time_ms(n);
        if config.with_skew {
            event_time += 50 - rng.below(100) as i64;
            if rng.one_in(100_000) {
                event_time -= rng.below(60_000) as i64;
            }
        }
        YsbEventRef {
            user_id: &shared.user_ids[user],
            page_id: &shared.page_ids[page],
            ad_id: &shared.campaigns.ad_ids[ad],
            ad_type,
            event_type,
            event_time,
            ip_address: IP_ADDRESS,
            campaign_index: shared.campaigns.campaign_index_of(ad) as u32,
        }
    }

    /// Appends up to `max_events` events to `builder` (and to `truth`); returns how many.
    pub fn fill(
        &mut self,
        builder: &mut YsbBatchBuilder,
        max_events: usize,
        mut truth: Option<&mut YsbGroundTruth>,
    ) -> usize {
        let mut produced = 0;
        while produced < max_events {
            let Some(n) = self.next_event_number() else {
                break;
            };
            self.position += 1;
            let event = self.event_at(n);
            builder.append(&event);
            if let Some(truth) = truth.as_deref_mut() {
                truth.record(&event);
            }
            produced += 1;
        }
        produced
    }

    /// The next `max_events` events as one record batch of [`ysb_schema`], also counted
    /// into `truth` if given; `None` when the slice is exhausted.
    pub fn next_batch(
        &mut self,
        max_events: usize,
        truth: Option<&mut YsbGroundTruth>,
    ) -> Result<Option<datafusion::arrow::record_batch::RecordBatch>> {
        let mut builder = YsbBatchBuilder::with_capacity(max_events);
        if self.fill(&mut builder, max_events, truth) == 0 {
            return Ok(None);
        }
        builder.finish().map(Some)
    }

    /// Appends the next event as one JSON object (no newline) to `out` and returns it,
    /// or `None` when the slice is exhausted.
    pub fn next_json(&mut self, out: &mut Vec<u8>) -> Option<YsbEventRef<'_>> {
        let event = self.next_event()?;
        event.write_json(out);
        Some(event)
    }
}
