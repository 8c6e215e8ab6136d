//! Checks against yahoo/streaming-benchmarks' definitions, plus determinism, splitting,
//! the JSON form and the ground truth.

use std::collections::{BTreeMap, HashSet};

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::TimestampMillisecondType;

use super::*;

fn config(max_events: u64) -> YsbConfig {
    YsbConfig {
        seed: 7,
        max_events: Some(max_events),
        ..YsbConfig::default()
    }
}

fn owned(mut generator: YsbGenerator) -> Vec<(u64, YsbEvent)> {
    let mut out = Vec::new();
    while let Some(n) = generator.next_event_number() {
        out.push((n, generator.next_event().unwrap().to_owned_event()));
    }
    out
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("skein-generators-{}-{name}", std::process::id()))
}

#[test]
fn campaigns_are_100_of_10_distinct_deterministic_uuids() {
    let campaigns = YsbCampaigns::generate(1, NUM_CAMPAIGNS, ADS_PER_CAMPAIGN);
    assert_eq!(campaigns.campaign_ids().len(), 100);
    assert_eq!(campaigns.ad_ids().len(), 1000);
    let distinct: HashSet<&String> = campaigns
        .campaign_ids()
        .iter()
        .chain(campaigns.ad_ids())
        .collect();
    assert_eq!(distinct.len(), 1100);
    assert!(
        distinct
            .iter()
            .all(|id| id.len() == 36 && id.matches('-').count() == 4)
    );
    let again = YsbCampaigns::generate(1, NUM_CAMPAIGNS, ADS_PER_CAMPAIGN);
    assert_eq!(again.ad_ids(), campaigns.ad_ids());
    assert_eq!(again.campaign_ids(), campaigns.campaign_ids());
    assert_ne!(
        YsbCampaigns::generate(2, 100, 10).ad_ids(),
        campaigns.ad_ids()
    );
    // Ads are dealt to campaigns in consecutive tens.
    for (j, (ad, campaign)) in campaigns.ad_campaign_pairs().enumerate() {
        assert_eq!(ad, campaigns.ad_ids()[j]);
        assert_eq!(campaign, campaigns.campaign_ids()[j / 10]);
        assert_eq!(campaigns.campaign_of(ad), Some(campaign));
    }
    assert_eq!(campaigns.campaign_of("not-an-ad"), None);
}

#[test]
fn mapping_file_round_trips_in_the_reference_format() {
    let campaigns = YsbCampaigns::generate(3, 100, 10);
    let path = temp_path("ad-to-campaign-ids.txt");
    campaigns.write_mapping(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let first = text.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "{{ \"{}\": \"{}\"}}",
            campaigns.ad_ids()[0],
            campaigns.campaign_ids()[0]
        )
    );
    let pairs = YsbCampaigns::read_mapping(&path).unwrap();
    let expected: Vec<(String, String)> = campaigns
        .ad_campaign_pairs()
        .map(|(a, c)| (a.to_owned(), c.to_owned()))
        .collect();
    assert_eq!(pairs, expected);
    std::fs::write(&path, "{\"a\": \"b\", \"c\": \"d\"}\n").unwrap();
    assert!(YsbCampaigns::read_mapping(&path).is_err());
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        YsbCampaigns::read_mapping(&path),
        Err(GeneratorError::Io { .. })
    ));
}

#[test]
fn events_are_deterministic_and_in_their_domains() {
    let a = owned(YsbGenerator::new(config(20_000)).unwrap());
    assert_eq!(a, owned(YsbGenerator::new(config(20_000)).unwrap()));
    let other = owned(
        YsbGenerator::new(YsbConfig {
            seed: 8,
            ..config(20_000)
        })
        .unwrap(),
    );
    assert_ne!(a, other);

    let generator = YsbGenerator::new(config(1)).unwrap();
    let ads: HashSet<&str> = generator
        .campaigns()
        .ad_ids()
        .iter()
        .map(String::as_str)
        .collect();
    let mut users = HashSet::new();
    let mut kinds = BTreeMap::new();
    for (n, e) in &a {
        assert!(ads.contains(e.ad_id.as_str()));
        assert!(AD_TYPES.contains(&e.ad_type.as_str()));
        assert!(EVENT_TYPES.contains(&e.event_type.as_str()));
        assert_eq!(e.ip_address, "1.2.3.4");
        // 100 000 events/s: a period of 10 000 ns, so event n is at n / 100 ms.
        assert_eq!(
            e.event_time,
            (DEFAULT_BASE_TIME_MS + (*n / 100) as i64).to_string()
        );
        users.insert(e.user_id.clone());
        *kinds.entry(e.event_type.clone()).or_insert(0u64) += 1;
    }
    assert_eq!(users.len(), 100);
    for count in kinds.values() {
        let share = *count as f64 / a.len() as f64;
        assert!((0.31..0.36).contains(&share), "{kinds:?}");
    }
}

#[test]
fn skew_moves_times_within_the_reference_bounds() {
    let c = YsbConfig {
        with_skew: true,
        ..config(50_000)
    };
    let mut generator = YsbGenerator::new(c).unwrap();
    let mut moved = 0;
    while let Some(n) = generator.next_event_number() {
        let scheduled = generator.scheduled_time_ms(n);
        let e = generator.next_event().unwrap();
        let shift = e.event_time - scheduled;
        assert!((-60_049..=50).contains(&shift), "shift {shift}");
        moved += usize::from(shift != 0);
    }
    assert!(moved > 45_000);
}

#[test]
fn slices_are_disjoint_and_complete() {
    let whole = owned(YsbGenerator::new(config(9_999)).unwrap());
    for count in [2, 3, 8] {
        let mut union = BTreeMap::new();
        for generator in YsbGenerator::split(config(9_999), count).unwrap() {
            for (n, e) in owned(generator) {
                assert!(union.insert(n, e).is_none(), "event {n} twice");
            }
        }
        assert_eq!(union.into_iter().collect::<Vec<_>>(), whole);
    }
}

#[test]
fn json_has_the_reference_layout_and_round_trips() {
    let mut generator = YsbGenerator::new(config(500)).unwrap();
    let mut out = Vec::new();
    while let Some(event) = generator.next_json(&mut out) {
        let expected = event.to_owned_event();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.starts_with("{\"user_id\": \""), "{text}");
        assert!(text.ends_with("\", \"ip_address\": \"1.2.3.4\"}"), "{text}");
        let parsed: YsbEvent = serde_json::from_slice(&out).unwrap();
        assert_eq!(parsed, expected);
        out.clear();
    }
}

#[test]
fn batches_match_events() {
    let events = owned(YsbGenerator::new(config(2_500)).unwrap());
    let mut generator = YsbGenerator::new(config(2_500)).unwrap();
    let mut row = 0;
    while let Some(batch) = generator.next_batch(1_000, None).unwrap() {
        assert_eq!(batch.schema(), ysb_schema());
        let ad = batch.column_by_name("ad_id").unwrap().as_string::<i32>();
        let user = batch.column_by_name("user_id").unwrap().as_string::<i32>();
        let kind = batch
            .column_by_name("event_type")
            .unwrap()
            .as_string::<i32>();
        let time = batch
            .column_by_name("event_time")
            .unwrap()
            .as_primitive::<TimestampMillisecondType>();
        for i in 0..batch.num_rows() {
            let (_, e) = &events[row];
            assert_eq!(ad.value(i), e.ad_id);
            assert_eq!(user.value(i), e.user_id);
            assert_eq!(kind.value(i), e.event_type);
            assert_eq!(time.value(i).to_string(), e.event_time);
            row += 1;
        }
    }
    assert_eq!(row, 2_500);
}

#[test]
fn ground_truth_counts_every_view_once() {
    let c = YsbConfig {
        with_skew: true,
        events_per_second: 2_000,
        ..config(60_000)
    };
    let mut generator = YsbGenerator::new(c.clone()).unwrap();
    let campaigns = generator.campaigns().clone();

    // Count by hand from the owned events.
    let mut by_hand: BTreeMap<(usize, i64), u64> = BTreeMap::new();
    for (_, e) in owned(generator.clone()) {
        if e.event_type == "view" {
            let campaign = campaigns.campaign_index_of_ad(&e.ad_id).unwrap();
            let time: i64 = e.event_time.parse().unwrap();
            *by_hand
                .entry((campaign, time.div_euclid(10_000) * 10_000))
                .or_default() += 1;
        }
    }

    let mut truth = YsbGroundTruth::default();
    let mut from_batches = YsbGroundTruth::default();
    while let Some(batch) = generator.next_batch(7_000, Some(&mut truth)).unwrap() {
        from_batches.record_batch(&batch, &campaigns).unwrap();
    }
    assert_eq!(truth, from_batches);
    let listed: BTreeMap<(usize, i64), u64> = truth.iter().map(|(c, w, v)| ((c, w), v)).collect();
    assert_eq!(listed, by_hand);
    assert_eq!(truth.total_views(), by_hand.values().sum::<u64>());
    // 60 000 events at 2 000/s span 30 s: three or four windows (skew), 100 campaigns.
    let windows: HashSet<i64> = truth.iter().map(|(_, w, _)| w).collect();
    assert!((3..=10).contains(&windows.len()), "{windows:?}");
    assert!(windows.iter().all(|w| w % 10_000 == 0));

    // Slices each keep a truth; merged, they equal the single-instance truth.
    let mut merged = YsbGroundTruth::default();
    for mut part in YsbGenerator::split(c, 3).unwrap() {
        let mut partial = YsbGroundTruth::default();
        while part
            .next_batch(5_000, Some(&mut partial))
            .unwrap()
            .is_some()
        {}
        merged.merge(&partial);
    }
    assert_eq!(merged, truth);

    let path = temp_path("ground-truth.csv");
    truth.write_csv(&path, &campaigns).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("campaign_id,window_start_ms,views"));
    let mut sum = 0;
    for line in lines {
        let fields: Vec<&str> = line.split(',').collect();
        assert!(campaigns.campaign_ids().contains(&fields[0].to_owned()));
        sum += fields[2].parse::<u64>().unwrap();
    }
    assert_eq!(sum, truth.total_views());
}

#[test]
fn bad_configurations_are_rejected() {
    assert!(
        YsbGenerator::new(YsbConfig {
            events_per_second: 0,
            ..YsbConfig::default()
        })
        .is_err()
    );
    assert!(
        YsbGenerator::new(YsbConfig {
            num_campaigns: 0,
            ..YsbConfig::default()
        })
        .is_err()
    );
    assert!(YsbGenerator::with_slice(YsbConfig::default(), Slice { index: 1, count: 1 }).is_err());
    let mut unbounded = YsbGenerator::new(YsbConfig::default()).unwrap();
    assert_eq!(unbounded.remaining(), None);
    assert!(unbounded.next_event().is_some());
}
