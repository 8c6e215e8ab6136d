//! `skein cost`: a standing query priced from a run on generated input.
//! No external service.

mod common;
use common::skein;

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
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(v["rate"].as_f64(), Some(20000.0), "{v}");
    // 4 s at 20,000 events/s, in 4 epochs, checkpointed every epoch.
    assert_eq!(v["measured"]["events"].as_u64(), Some(80_000), "{v}");
    assert!(v["measured"]["invocations"].as_u64() > Some(0), "{v}");
    assert_eq!(v["epochs"].as_u64(), Some(4), "{v}");
    assert!(v["measured"]["checkpoint_puts"].as_u64() > Some(0), "{v}");
    assert!(v["measured"]["billed_ms"].as_u64() > Some(0), "{v}");
    let lambda = v["lambda"].as_array().expect("lambda columns");
    assert_eq!(lambda.len(), 2, "{v}");
    assert_eq!(lambda[0]["arch"], "x86_64");
    assert_eq!(lambda[1]["arch"], "arm64");
    // Each Lambda figure is the measured requests, GB-s and checkpoint
    // requests at the published prices.
    let prices = skein_cost::Prices::default();
    assert_eq!(v["prices"].as_str(), Some(prices.date.as_str()), "{v}");
    common::cost::assert_lambda_priced(&v, &prices);
    // arm64 is cheaper per GB-s, the rest is the same.
    assert!(lambda[1]["usd_per_month"].as_f64() < lambda[0]["usd_per_month"].as_f64());
    assert!(v["vm"]["units"].as_u64() >= Some(1), "{v}");
    assert!(v["flink"]["units"].as_u64() >= Some(2), "{v}");
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
        serde_json::from_str::<serde_json::Value>(stdout.trim()).expect("one JSON object")
    };
    let sized = run(&[]);
    let from = &sized["group_sized_from"];
    let busy = from["busy_ms_per_epoch_at_one_member"]
        .as_f64()
        .expect("the probe's busy time");
    let interval = from["interval_ms"].as_f64().unwrap();
    assert_eq!(interval, 1000.0, "{sized}");
    // No member busy over half an epoch, at least one member.
    let expected = ((busy / (interval * 0.5)).ceil() as u64).max(1);
    assert_eq!(sized["group_size"].as_u64(), Some(expected), "{sized}");
    let fixed = run(&["--group-size", "3"]);
    assert_eq!(fixed["group_size"].as_u64(), Some(3), "{fixed}");
    assert!(fixed["group_sized_from"].is_null(), "{fixed}");
    // Each of YSB's two source members invokes every member of the group
    // each epoch: per epoch its two triggers and two payloads per member.
    let per_epoch = |v: &serde_json::Value| {
        v["measured"]["invocations"].as_u64().unwrap() / v["epochs"].as_u64().unwrap()
    };
    assert_eq!(per_epoch(&fixed), 2 + 2 * 3, "{fixed}");
    assert_eq!(per_epoch(&sized), 2 + 2 * expected, "{sized}");
}
