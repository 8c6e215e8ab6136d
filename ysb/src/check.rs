//! `ysb check`: Redis against the ground truth, against the topic recounted
//! up to the offsets the counts cover, and the dead letters against the
//! topic's undecodable records; and YSB's window latency ([`crate::latency`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use skein_sinks::epoch_markers::parse_marker_field;
use skein_sinks::redis::{epochs_key, offsets_key};

use crate::error::{Context, Result, YsbError, fail};
use crate::latency::latencies;
use crate::recount::{Counts, read_dead_letters, recount_topic};
use crate::setup::Generated;
use crate::{
    Windows, Workload, campaigns, checkpoint, default_dead_letter_topic, redis_connection, run_key,
};
/// The result of comparing Redis with the ground truth and with the topic.
#[derive(Debug, Serialize, Deserialize)]
pub struct CheckReport {
    /// Redis matches the ground truth and the topic, and every undecodable
    /// record of the topic is in the dead-letter topic.
    pub exact: bool,
    /// Redis matches the ground truth file of `ysb generate`; `null` without
    /// one (a live topic), when only the topic's recount is compared.
    pub truth_exact: Option<bool>,
    /// Redis matches the counts recomputed from the topic.
    pub topic_exact: bool,
    /// Every undecodable record has a dead letter (with a reason), and no
    /// dead letter names a record that decodes.
    pub dead_letters_exact: bool,
    /// Windows and views counted in Redis.
    pub windows: usize,
    pub views: u64,
    /// Views in the ground truth, if there is one.
    pub expected_views: Option<u64>,
    /// Windows of the ground truth that Redis lacks, has but does not
    /// expect, or counts differently.
    pub missing: usize,
    pub extra: usize,
    pub wrong: usize,
    /// Records the counts in Redis cover (the committed offsets); the topic
    /// is recounted up to there.
    pub committed_records: i64,
    /// Records read back from the topic, the undecodable ones among them.
    pub topic_records: u64,
    pub topic_malformed: u64,
    /// Windows and views recomputed from the topic.
    pub topic_windows: usize,
    pub topic_views: u64,
    /// Views in the topic whose ad has no campaign.
    pub topic_unknown_ad_views: u64,
    /// Windows of the topic's counts that Redis lacks, has but the topic does
    /// not give, or counts differently.
    pub topic_missing: usize,
    pub topic_extra: usize,
    pub topic_wrong: usize,
    pub topic_read_s: f64,
    pub dead_letter_topic: String,
    /// Distinct records of this topic found in the dead-letter topic.
    pub dead_letters: u64,
    /// Letters beyond the first for a record (a crash replay sends again).
    pub dead_letter_duplicates: u64,
    /// Undecodable records without a letter; letters for records that decode.
    pub dead_letters_missing: usize,
    pub dead_letters_extra: usize,
    pub dead_letters_without_reason: u64,
    /// Views of ads without a campaign that the lookup join sent as dead
    /// letters (committed epochs only);
    /// `topic_exact` needs them to equal `topic_unknown_ad_views`.
    pub dead_letter_unknown_ad_views: u64,
    pub latency_ms_p50: i64,
    pub latency_ms_p90: i64,
    pub latency_ms_p99: i64,
    pub latency_ms_max: i64,
}

fn read_truth(dir: &Path) -> Result<Counts> {
    let path = dir.join("truth.csv");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (run `skein ysb generate` first)",
            path.display()
        )
    })?;
    let mut out = BTreeMap::new();
    for line in text.lines().skip(1) {
        let mut f = line.split(',');
        let (Some(c), Some(w), Some(v)) = (f.next(), f.next(), f.next()) else {
            fail!("{}: bad line {line:?}", path.display());
        };
        let (Ok(w), Ok(v)) = (w.parse(), v.parse()) else {
            fail!("{}: bad line {line:?}", path.display());
        };
        out.insert((c.to_string(), w), v);
    }
    Ok(out)
}

/// (missing, extra, wrong) windows of `found` against `expected`.
fn compare(expected: &Counts, found: &Windows) -> (usize, usize, usize) {
    let missing = expected.keys().filter(|k| !found.contains_key(*k)).count();
    let extra = found.keys().filter(|k| !expected.contains_key(*k)).count();
    let wrong = expected
        .iter()
        .filter(|(k, v)| found.get(*k).is_some_and(|(n, _)| n != *v))
        .count();
    (missing, extra, wrong)
}

/// What Redis holds, read in one script so that it is one snapshot while a
/// run is still writing: the offsets the sink's writes cover for `topic`
/// and, for the campaigns of `seed`, (campaign, window start) ->
/// (seen_count, time_updated).
struct RedisSnapshot {
    offsets: BTreeMap<i32, i64>,
    windows: Windows,
}

/// Returns `{offsets hash, run hash, epoch markers hash}` then, per
/// campaign, `{window start, seen_count, time_updated}` triples.
const SNAPSHOT_SCRIPT: &str = r"
local out = {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]),
             redis.call('HGETALL', KEYS[3])}
for _, c in ipairs(ARGV) do
  local h = redis.call('HGETALL', c)
  local rows = {}
  for j = 1, #h, 2 do
    if h[j] ~= 'windows' then
      local v = redis.call('HMGET', h[j + 1], 'seen_count', 'time_updated')
      table.insert(rows, {h[j], v[1] or '0', v[2] or '0'})
    end
  end
  table.insert(out, rows)
end
return out";

/// How long the check waits for a snapshot in which every sink member has
/// written the same epoch.
const CONSISTENT_WAIT: Duration = Duration::from_secs(60);

/// A snapshot in which the counts are exactly those of the records below
/// the offsets: every sink member of the run `ysb run` announced has
/// written the same epoch (each member's write of an epoch carries the
/// same offsets, in the MULTI/EXEC of its counts). Mid-epoch, some members
/// are one ahead: read again.
async fn read_redis(redis: &str, topic: &str, seed: u64) -> Result<RedisSnapshot> {
    let started = Instant::now();
    loop {
        let (snapshot, members) = read_redis_once(redis, topic, seed).await?;
        match members {
            Ok(()) => return Ok(snapshot),
            Err(why) if started.elapsed() >= CONSISTENT_WAIT => fail!(
                "Redis never held one epoch of every sink member in {CONSISTENT_WAIT:?}: {why} \
                 (a run killed mid-epoch completes it when it is run again)"
            ),
            Err(why) => {
                tracing::debug!(topic, "snapshot between epochs: {why}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// One snapshot, and whether its members agree (or why not).
async fn read_redis_once(
    redis: &str,
    topic: &str,
    seed: u64,
) -> Result<(RedisSnapshot, std::result::Result<(), String>)> {
    let mut con = redis_connection(redis).await?;
    let campaigns = campaigns(seed);
    let name = checkpoint(topic);
    let mut all: Vec<redis::Value> = redis::cmd("EVAL")
        .arg(SNAPSHOT_SCRIPT)
        .arg(3)
        .arg(offsets_key(&name))
        .arg(run_key(topic))
        .arg(epochs_key(&name))
        .arg(campaigns.campaign_ids())
        .query_async(&mut con)
        .await
        .context("reading the results from Redis")?;
    // Three hashes, then one element per campaign.
    let rest = all.split_off(3);
    let mut hashes = all
        .into_iter()
        .map(redis::from_redis_value::<BTreeMap<String, String>>);
    let mut next = || hashes.next().unwrap_or_else(|| Ok(BTreeMap::new()));
    let (stored, run, markers) = (next()?, next()?, next()?);
    let offsets = stored
        .iter()
        .filter_map(|(f, o)| {
            let (t, p) = f.rsplit_once(':')?;
            (t == topic).then(|| Some((p.parse().ok()?, o.parse().ok()?)))?
        })
        .collect();
    let mut windows = BTreeMap::new();
    for (campaign, rows) in campaigns.campaign_ids().iter().zip(rest) {
        let rows: Vec<(String, i64, i64)> = redis::from_redis_value(rows)?;
        for (field, seen, updated) in rows {
            let window: i64 = field.parse().map_err(|e| {
                YsbError::Failed(format!("campaign {campaign}: field {field:?}: {e}"))
            })?;
            windows.insert((campaign.clone(), window), (seen.max(0) as u64, updated));
        }
    }
    let agree = members_agree(&run, &markers);
    Ok((RedisSnapshot { offsets, windows }, agree))
}

/// Whether every member of the announced run has written the same epoch.
/// Nothing announced (no run yet): nothing to agree on.
fn members_agree(
    run: &BTreeMap<String, String>,
    markers: &BTreeMap<String, String>,
) -> std::result::Result<(), String> {
    let (Some(lineage), Some(members)) = (run.get("run"), run.get("members")) else {
        return Ok(());
    };
    let members: usize = members.parse().unwrap_or(1);
    let epochs: BTreeMap<u32, &String> = markers
        .iter()
        .filter_map(|(field, epoch)| {
            let (r, member) = parse_marker_field(field)?;
            (r == lineage).then_some((member, epoch))
        })
        .collect();
    let distinct: BTreeSet<&&String> = epochs.values().collect();
    match (epochs.len(), distinct.len()) {
        (0, _) => Ok(()),
        (n, 1) if n == members => Ok(()),
        (n, _) if n < members => Err(format!("{n} of {members} members have written")),
        _ => Err(format!("members at epochs {distinct:?}")),
    }
}

/// The check against the default dead-letter topic.
pub async fn check_report(a: &Workload) -> Result<CheckReport> {
    Ok(check_windows(a, &default_dead_letter_topic(&a.topic))
        .await?
        .0)
}

/// The ground truth of `generate`, if the one in `a.dir` is of this topic
/// and seed (a live topic has none).
fn truth_of(a: &Workload) -> Result<Option<Counts>> {
    let Ok(text) = std::fs::read(a.dir.join("generated.json")) else {
        return Ok(None);
    };
    let generated: Generated = serde_json::from_slice(&text)
        .with_context(|| format!("reading {}", a.dir.join("generated.json").display()))?;
    if generated.topic != a.topic || generated.seed != a.seed {
        return Ok(None);
    }
    read_truth(&a.dir).map(Some)
}

/// The check, and the windows read from Redis: (campaign, window start) ->
/// (seen_count, time_updated).
pub async fn check_windows(
    a: &Workload,
    dead_letter_topic: &str,
) -> Result<(CheckReport, Windows)> {
    let truth = truth_of(a)?;
    // Redis first: the topic is recounted up to the offsets committed with
    // these counts, so a run (or a producer) may still be going.
    let RedisSnapshot {
        offsets,
        windows: found,
    } = read_redis(&a.redis, &a.topic, a.seed).await?;
    let (brokers, topic, seed) = (a.brokers.clone(), a.topic.clone(), a.seed);
    let until = offsets.clone();
    let recount =
        tokio::task::spawn_blocking(move || recount_topic(&brokers, &topic, seed, &until));
    let (brokers, topic, dlt) = (
        a.brokers.clone(),
        a.topic.clone(),
        dead_letter_topic.to_string(),
    );
    let letters = tokio::task::spawn_blocking(move || read_dead_letters(&brokers, &dlt, &topic));
    let recount = recount
        .await
        .map_err(|e| YsbError::Failed(format!("recount task: {e}")))??;
    let mut letters = letters
        .await
        .map_err(|e| YsbError::Failed(format!("dead-letter task: {e}")))??;
    // Letters are sent before their offsets are committed: those beyond the
    // committed offsets belong to a write still to come (or to be replayed).
    let committed = |p: i32, o: i64| offsets.get(&p).is_some_and(|c| o < *c);
    letters.keys.retain(|(p, o)| committed(*p, *o));
    let field = |f: &str| -> Option<i32> {
        let (t, p) = f.rsplit_once(':')?;
        (t == a.topic).then(|| p.parse().ok())?
    };
    let unknown_ad_letter_views: u64 = letters
        .unknown_ads
        .values()
        .filter(|(_, to)| {
            to.iter()
                .all(|(f, o)| field(f).is_some_and(|p| committed(p, *o - 1)))
        })
        .map(|(n, _)| n)
        .sum();

    let (missing, extra, wrong) = match &truth {
        Some(t) => compare(t, &found),
        None => (0, 0, 0),
    };
    let truth_exact = truth
        .as_ref()
        .map(|_| missing == 0 && extra == 0 && wrong == 0);
    let (topic_missing, topic_extra, topic_wrong) = compare(&recount.counts, &found);
    let topic_exact = topic_missing == 0
        && topic_extra == 0
        && topic_wrong == 0
        && recount.unknown_ad_views == unknown_ad_letter_views;
    let dead_letters_missing = recount.malformed.difference(&letters.keys).count();
    let dead_letters_extra = letters.keys.difference(&recount.malformed).count();
    let dead_letters_exact =
        dead_letters_missing == 0 && dead_letters_extra == 0 && letters.without_reason == 0;

    let latency = latencies(&found, None);
    let report = CheckReport {
        exact: truth_exact.unwrap_or(true) && topic_exact && dead_letters_exact,
        truth_exact,
        topic_exact,
        dead_letters_exact,
        windows: found.len(),
        views: found.values().map(|(n, _)| n).sum(),
        expected_views: truth.as_ref().map(|t| t.values().sum()),
        missing,
        extra,
        wrong,
        committed_records: offsets.values().sum(),
        topic_records: recount.records,
        topic_malformed: recount.malformed.len() as u64,
        topic_windows: recount.counts.len(),
        topic_views: recount.counts.values().sum(),
        topic_unknown_ad_views: recount.unknown_ad_views,
        topic_missing,
        topic_extra,
        topic_wrong,
        topic_read_s: recount.elapsed_s,
        dead_letter_topic: dead_letter_topic.to_string(),
        dead_letters: letters.keys.len() as u64,
        dead_letter_duplicates: letters.records.saturating_sub(letters.keys.len() as u64),
        dead_letters_missing,
        dead_letters_extra,
        dead_letters_without_reason: letters.without_reason,
        dead_letter_unknown_ad_views: unknown_ad_letter_views,
        latency_ms_p50: latency.p50,
        latency_ms_p90: latency.p90,
        latency_ms_p99: latency.p99,
        latency_ms_max: latency.max,
    };
    Ok((report, found))
}

impl CheckReport {
    /// What Redis differs from, if anything: the ground truth, the topic
    /// recounted, the dead letters the topic calls for.
    pub fn differences(&self) -> Vec<&'static str> {
        let mut out = vec![];
        if self.truth_exact == Some(false) {
            out.push("the ground truth");
        }
        if !self.topic_exact {
            out.push("the counts recomputed from the topic");
        }
        if !self.dead_letters_exact {
            out.push("the dead letters the topic calls for");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn compare_counts_missing_extra_and_wrong_windows() {
        let expected: Counts = [
            (("a".into(), 0), 3),
            (("a".into(), 10), 4),
            (("b".into(), 0), 5),
        ]
        .into_iter()
        .collect();
        let found: Windows = [
            (("a".into(), 0), (3, 1)),
            (("a".into(), 10), (9, 1)),
            (("c".into(), 0), (1, 1)),
        ]
        .into_iter()
        .collect();
        assert_eq!(compare(&expected, &found), (1, 1, 1));
        let same: Windows = expected.iter().map(|(k, v)| (k.clone(), (*v, 0))).collect();
        assert_eq!(compare(&expected, &same), (0, 0, 0));
    }

    #[test]
    fn members_agree_once_all_wrote_one_epoch() {
        let run = map(&[("run", "r1"), ("members", "2")]);
        assert!(members_agree(&map(&[]), &map(&[])).is_ok(), "no run yet");
        assert!(
            members_agree(&run, &map(&[])).is_ok(),
            "nothing written yet"
        );
        let one = map(&[("r1/0", "4")]);
        assert!(members_agree(&run, &one).unwrap_err().contains("1 of 2"));
        let apart = map(&[("r1/0", "4"), ("r1/1", "5")]);
        assert!(members_agree(&run, &apart).is_err());
        // Markers of another run do not count.
        let both = map(&[("r1/0", "5"), ("r1/1", "5"), ("r0/0", "9")]);
        assert!(members_agree(&run, &both).is_ok());
    }
}
