//! `skein cost`: a standing query priced from a run on generated input.
//! No external service.

mod common;
use common::skein;
use skein_cost::{Arch, CostReport};

#[test]
fn cost_of_nexmark_q5_prints_json_with_every_column() {
    let (ok, stdout, stderr) = skein(&[
        "cost",
        "--nexmark",
        "5",
        "--rate",
        "20000",
        "--seconds",
        "4",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let (c, v) = common::cost::cost_json(&stdout);
    assert_eq!(c.rate, Some(20000.0), "{c:?}");
    // 4 s at 20,000 events/s, in 4 epochs, checkpointed every epoch.
    assert_eq!(c.measured.events, 80_000, "{c:?}");
    assert!(c.measured.invocations > 0, "{c:?}");
    assert_eq!(v["epochs"].as_u64(), Some(4), "{v}");
    assert!(c.measured.checkpoint_puts > 0, "{c:?}");
    assert!(c.measured.billed_ms > 0, "{c:?}");
    let lambda = &c.lambda;
    assert_eq!(lambda.len(), 2, "{c:?}");
    assert_eq!(lambda[0].arch, Arch::X86_64);
    assert_eq!(lambda[1].arch, Arch::Arm64);
    // Each Lambda figure is the measured requests, GB-s and checkpoint
    // requests at the published prices.
    let prices = skein_cost::Prices::default();
    assert_eq!(c.prices, prices.date, "{c:?}");
    common::cost::assert_lambda_priced(&c, &prices);
    // arm64 is cheaper per GB-s, the rest is the same.
    assert!(lambda[1].usd_per_month < lambda[0].usd_per_month);
    assert!(c.vm.units >= Some(1), "{c:?}");
    assert!(c.flink.units >= Some(2), "{c:?}");
}

#[test]
fn bad_cost_input_is_a_one_line_error() {
    let missing = skein(&["cost", "no/such/file.sql", "--rate", "1000"]);
    let live = std::env::temp_dir().join(format!("{}.sql", common::unique_name("cost-live")));
    std::fs::write(
        &live,
        "CREATE EXTERNAL TABLE t (a BIGINT, ts TIMESTAMP) STORED AS KAFKA LOCATION 'x' \
           OPTIONS ('bootstrap.servers' '127.0.0.1:9', 'format' 'json', 'event_time' 'ts');
         SELECT tumble(ts, INTERVAL '1' SECOND) AS w, count(*) FROM t GROUP BY 1",
    )
    .unwrap();
    let kafka = skein(&["cost", live.to_str().unwrap(), "--rate", "1000"]);
    let prices = std::env::temp_dir().join(format!("{}.json", common::unique_name("prices")));
    std::fs::write(&prices, r#"{"lambda_per_million": 1}"#).unwrap();
    let bad_prices = skein(&[
        "cost",
        "queries/cost/ysb.sql",
        "--rate",
        "1000",
        "--prices",
        prices.to_str().unwrap(),
    ]);
    for (what, (ok, _, stderr), expect) in [
        ("a missing file", missing, "no/such/file.sql"),
        ("a Kafka table", kafka, "generated input"),
        ("an unknown price", bad_prices, "lambda_per_million"),
    ] {
        assert!(!ok, "{what} succeeded");
        assert_eq!(stderr.trim().lines().count(), 1, "{what}: {stderr}");
        assert!(stderr.contains(expect), "{what}: {stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    }
    for bad in [["--rate", "0"], ["--rate", "fast"], ["--rates", "10"]] {
        let (ok, _, stderr) = skein(&["cost", "queries/cost/ysb.sql", bad[0], bad[1]]);
        assert!(!ok && stderr.contains("error"), "{bad:?}: {stderr}");
    }
    let _ = std::fs::remove_file(live);
    let _ = std::fs::remove_file(prices);
}

#[test]
fn without_group_size_the_group_is_sized_from_the_measured_work() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "cost",
            "queries/cost/ysb.sql",
            "--rate",
            "20000",
            "--seconds",
            "4",
            "--sweep-intervals",
            "",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = skein(&args);
        assert!(ok, "{stderr}");
        common::cost::cost_json(&stdout)
    };
    let (sized_cost, sized) = run(&[]);
    let from = &sized["group_sized_from"];
    let busy = from["busy_ms_per_epoch_at_one_member"]
        .as_f64()
        .expect("the probe's busy time");
    let interval = from["interval_ms"].as_f64().unwrap();
    assert_eq!(interval, 1000.0, "{sized}");
    // No member busy over half an epoch, at least one member.
    let expected = ((busy / (interval * 0.5)).ceil() as u64).max(1);
    assert_eq!(sized["group_size"].as_u64(), Some(expected), "{sized}");
    let (fixed_cost, fixed) = run(&["--group-size", "3"]);
    assert_eq!(fixed["group_size"].as_u64(), Some(3), "{fixed}");
    assert!(fixed["group_sized_from"].is_null(), "{fixed}");
    // Each of YSB's two source members invokes every member of the group
    // each epoch: per epoch its two triggers and two payloads per member.
    let per_epoch = |c: &CostReport, v: &serde_json::Value| {
        c.measured.invocations / v["epochs"].as_u64().unwrap()
    };
    assert_eq!(per_epoch(&fixed_cost, &fixed), 2 + 2 * 3, "{fixed}");
    assert_eq!(per_epoch(&sized_cost, &sized), 2 + 2 * expected, "{sized}");
}

#[test]
fn a_day_with_a_peak_is_priced_under_a_fixed_and_an_elastic_group() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "cost",
            "queries/cost/ysb.sql",
            "--rate",
            "5000",
            "--seconds",
            "4",
        ];
        args.extend_from_slice(extra);
        skein(&args)
    };
    // The fixed group is the deployment's --group-size, all day.
    let (ok, stdout, stderr) = run(&[
        "--peak",
        "4",
        "--peak-hours",
        "6",
        "--group-size",
        "3",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let day: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let (fixed, elastic) = (&day["fixed"], &day["elastic"]);
    let sizes = |p: &serde_json::Value| {
        (
            p["trough_group_size"].as_u64(),
            p["peak_group_size"].as_u64(),
        )
    };
    assert_eq!(sizes(fixed), (Some(3), Some(3)), "{day}");
    // 5,000 events/s and 20,000 are a few milliseconds of work an epoch:
    // one member each, so the elastic group never changes size.
    assert_eq!(sizes(elastic), (Some(1), Some(1)), "{day}");
    assert_eq!(fixed["rescales_per_day"].as_u64(), Some(0), "{day}");
    assert_eq!(elastic["rescales_per_day"].as_u64(), Some(0), "{day}");
    // A day is 18 hours of the trough and 6 of the peak, each at its hour's price.
    for p in [fixed, elastic] {
        let f = |k: &str| p[k].as_f64().unwrap();
        let day_usd = 18.0 * f("trough_usd_per_hour") + 6.0 * f("peak_usd_per_hour");
        assert!((f("usd_per_day") - day_usd).abs() < 1e-9 * day_usd, "{day}");
        let events = 3600.0 * (18.0 * 5000.0 + 6.0 * 20_000.0);
        assert!(
            (f("usd_per_million_events") - day_usd / events * 1e6).abs() < 1e-12,
            "{day}"
        );
    }
    // The fixed group pays two members more all day (their invocations
    // every epoch).
    let usd = |p: &serde_json::Value, k: &str| p[k].as_f64().unwrap();
    for hour in ["trough_usd_per_hour", "peak_usd_per_hour"] {
        assert!(usd(elastic, hour) < usd(fixed, hour), "{hour}: {day}");
    }
    let ratio = usd(elastic, "usd_per_day") / usd(fixed, "usd_per_day");
    assert!(
        (day["elastic_over_fixed"].as_f64().unwrap() - ratio).abs() < 1e-9,
        "{day}"
    );
    assert!(ratio < 1.0, "{day}");

    for (bad, expect) in [
        (vec!["--peak", "0.5"], "--peak must be at least 1"),
        (vec!["--peak", "4", "--peak-hours", "24"], "--peak-hours"),
        (vec!["--peak-hours", "3"], "--peak"),
    ] {
        let (ok, _, stderr) = run(&bad);
        assert!(!ok, "{bad:?} succeeded");
        assert!(stderr.contains(expect), "{bad:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{bad:?}: {stderr}");
    }
}
