//! Counting the records of a YSB topic as the query counts them, with a
//! decoder of its own (serde, only the three fields the query uses), so that
//! a fault of the engine's decoder shows up as a difference rather than
//! being repeated; and the undecodable records that test the dead-letter path.

use std::collections::HashMap;

use serde::Deserialize;

use super::{WINDOW_MS, YsbCampaigns};

/// The fields of one event the query reads; serde skips the others.
#[derive(Deserialize)]
struct EventFields<'a> {
    #[serde(borrow)]
    ad_id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    event_type: std::borrow::Cow<'a, str>,
    event_time: EventTime,
}

/// Milliseconds since the epoch, as a JSON integer or a string holding one
/// (YSB writes strings); what the query's `TIMESTAMP` column accepts.
struct EventTime(i64);

impl<'de> Deserialize<'de> for EventTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = EventTime;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("milliseconds as an integer or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<EventTime, E> {
                Ok(EventTime(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<EventTime, E> {
                i64::try_from(v)
                    .map(EventTime)
                    .map_err(|_| E::custom("out of range"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<EventTime, E> {
                v.trim()
                    .parse()
                    .map(EventTime)
                    .map_err(|_| E::custom("not an integer"))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The largest record the query decodes (the Kafka source's default
/// `max.record.bytes`).
const MAX_RECORD_BYTES: usize = 1 << 20;

/// Records counted as the query counts them: views per (campaign index,
/// window start), and where the undecodable ones are.
#[derive(Debug, Default)]
pub struct YsbRecount {
    /// Records seen, decodable or not.
    pub records: u64,
    /// (campaign index, window start ms) -> views.
    pub counts: HashMap<(usize, i64), u64>,
    /// (partition, offset) of every record that does not decode.
    pub malformed: Vec<(i32, i64)>,
    /// Views of ads that belong to no campaign.
    pub unknown_ad_views: u64,
}

impl YsbRecount {
    /// Counts one record read from `partition` at `offset`.
    pub fn add(&mut self, campaigns: &YsbCampaigns, partition: i32, offset: i64, payload: &[u8]) {
        self.records += 1;
        let event = (payload.len() <= MAX_RECORD_BYTES)
            .then(|| serde_json::from_slice::<EventFields<'_>>(payload).ok())
            .flatten()
            // The column is TIMESTAMP (nanoseconds): it must fit.
            .filter(|e| e.event_time.0.checked_mul(1_000_000).is_some());
        let Some(event) = event else {
            self.malformed.push((partition, offset));
            return;
        };
        if event.event_type != "view" {
            return;
        }
        match campaigns.campaign_index_of_ad(&event.ad_id) {
            Some(c) => {
                let window = event.event_time.0.div_euclid(WINDOW_MS) * WINDOW_MS;
                *self.counts.entry((c, window)).or_insert(0) += 1;
            }
            None => self.unknown_ad_views += 1,
        }
    }
}

/// Undecodable record `n` (of five kinds, by `n % 5`: cut JSON, a missing
/// field, a bad time, not JSON, a mistyped field), for the dead-letter path.
pub fn malformed_record(n: u64, ad: &str, now_ms: i64) -> Vec<u8> {
    match n % 5 {
        0 => b"{\"ad_id\": \"".to_vec(),
        1 => format!(
            "{{\"event_type\": \"view\", \"event_time\": \"{}\"}}",
            now_ms
        )
        .into_bytes(),
        2 => format!(
            "{{\"ad_id\": \"{ad}\", \"event_type\": \"view\", \"event_time\": \"yesterday\"}}"
        )
        .into_bytes(),
        3 => b"this is not JSON".to_vec(),
        _ => format!(
            "{{\"ad_id\": 17, \"event_type\": \"view\", \"event_time\": \"{}\"}}",
            now_ms
        )
        .into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ysb::{ADS_PER_CAMPAIGN, NUM_CAMPAIGNS};

    #[test]
    fn recount_decodes_like_the_query_and_rejects_every_malformed_kind() {
        let campaigns = YsbCampaigns::generate(5, NUM_CAMPAIGNS, ADS_PER_CAMPAIGN);
        let ad = campaigns.ad_ids()[13].clone();
        let campaign = campaigns.campaign_of(&ad).unwrap().to_string();
        let mut partial = YsbRecount::default();
        // Both forms of event_time, extra fields of any kind skipped.
        let good = [
            format!(
                r#"{{"user_id": "u", "ad_id": "{ad}", "event_type": "view", "event_time": "12345", "ip_address": "1.2.3.4"}}"#
            ),
            format!(
                r#"{{"ad_id": "{ad}", "nested": {{"a": [1, 2]}}, "event_type": "view", "event_time": 19999}}"#
            ),
            format!(r#"{{"ad_id": "{ad}", "event_type": "click", "event_time": "12345"}}"#),
        ];
        for (i, r) in good.iter().enumerate() {
            partial.add(&campaigns, 0, i as i64, r.as_bytes());
        }
        for n in 0..5 {
            partial.add(
                &campaigns,
                1,
                n as i64,
                &malformed_record(n, &ad, 1_700_000_000_000),
            );
        }
        partial.add(
            &campaigns,
            1,
            5,
            br#"{"ad_id": null, "event_type": "view", "event_time": 1}"#,
        );
        partial.add(
            &campaigns,
            1,
            6,
            br#"{"ad_id": "x", "event_type": "view", "event_time": 1.5}"#,
        );
        partial.add(&campaigns, 1, 7, b"");
        let unknown = br#"{"ad_id": "not-an-ad", "event_type": "view", "event_time": 1}"#;
        partial.add(&campaigns, 2, 0, unknown);

        assert_eq!(partial.records, 12);
        assert_eq!(
            partial.malformed,
            (0..8).map(|o| (1, o)).collect::<Vec<_>>(),
            "every malformed kind is rejected, nothing else"
        );
        assert_eq!(partial.unknown_ad_views, 1);
        let c = campaigns.campaign_index_of_ad(&ad).unwrap();
        assert_eq!(campaigns.campaign_ids()[c], campaign);
        let expected: HashMap<(usize, i64), u64> = [((c, 10_000), 2)].into_iter().collect();
        assert_eq!(
            partial.counts, expected,
            "two views in window 10 000; the click is not one"
        );
    }
}
