//! `ysb check`: `skein_ysb::check`, printed.

use anyhow::{Result, bail};
use skein_ysb::check::check_windows;
use skein_ysb::default_dead_letter_topic;

use super::CheckArgs;

/// `ysb check`: prints the report; exits non-zero on any difference.
pub(super) async fn check(a: &CheckArgs) -> Result<()> {
    let dlt = a
        .dead_letter_topic
        .clone()
        .unwrap_or_else(|| default_dead_letter_topic(&a.common.topic));
    let r = check_windows(&a.common.workload(), &dlt).await?.0;
    if a.common.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let truth = match (r.truth_exact, r.expected_views) {
            (Some(_), Some(expected)) => format!(
                "ground truth: {expected} views expected; {} missing, {} extra, {} wrong windows",
                r.missing, r.extra, r.wrong
            ),
            _ => "no ground truth for this topic and seed: checked against the topic".into(),
        };
        println!(
            "{}\n\
             Redis: {} windows, {} views, covering {} records\n\
             {truth}\n\
             topic: {} records ({} undecodable, {} views of ads without a campaign) read in {:.2} s \
             give {} windows, {} views; {} missing, {} extra, {} wrong\n\
             dead letters in {}: {} records ({} duplicates); {} missing, {} extra, {} without a reason; \
             {} views of ads without a campaign\n\
             latency (time_updated - window end): p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
            if r.exact { "EXACT" } else { "DIFFERENT" },
            r.windows,
            r.views,
            r.committed_records,
            r.topic_records,
            r.topic_malformed,
            r.topic_unknown_ad_views,
            r.topic_read_s,
            r.topic_windows,
            r.topic_views,
            r.topic_missing,
            r.topic_extra,
            r.topic_wrong,
            r.dead_letter_topic,
            r.dead_letters,
            r.dead_letter_duplicates,
            r.dead_letters_missing,
            r.dead_letters_extra,
            r.dead_letters_without_reason,
            r.dead_letter_unknown_ad_views,
            r.latency_ms_p50,
            r.latency_ms_p90,
            r.latency_ms_p99,
            r.latency_ms_max
        );
    }
    let differences = r.differences();
    if !differences.is_empty() {
        bail!("Redis differs from {}", differences.join(" and "));
    }
    Ok(())
}
