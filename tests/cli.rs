//! The `skein` command line on the embedded default: no external service.

mod common;
use common::{run_report, skein};
use skein_engine::epochs::Stopped;
use skein_generators::nexmark::{Event, NexmarkConfig, NexmarkGenerator};

#[test]
fn nexmark_q5_runs_staged_and_verifies_with_a_json_summary() {
    let (ok, stdout, stderr) = skein(&[
        "nexmark",
        "--query",
        "5",
        "--events",
        "60000",
        "--group-size",
        "4",
        "--epochs",
        "6",
        "--verify",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let line = stdout.lines().last().expect("a summary line");
    // The names as printed; the figures are read from the typed report.
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON summary");
    for key in [
        "stages",
        "functions",
        "invocations",
        "payload_bytes",
        "events",
        "events_per_s",
        "result_rows",
        "verified",
        "query",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {line}");
    }
    let r = run_report(&stdout);
    assert_eq!(r.verified, Some(true));
    assert_eq!(r.query, Some(5));
    assert!(r.stages > 1, "{line}");
    assert!(r.invocations > 0 && r.payload_bytes > 0);
}

/// Writes `sql` to `<temp>/skein-cli-<test>-<pid>/query.sql`: (dir, file).
fn query_file(test: &str, sql: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("skein-cli-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("query.sql");
    std::fs::write(&file, sql).unwrap();
    (dir, file)
}

#[test]
fn run_a_sql_file_and_explain_it() {
    let (_, file) = query_file(
        "top",
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' \
           OPTIONS ('events' '20000', 'partitions' '2', 'event_time' 'date_time');\n\
         -- the ten highest bids\n\
         SELECT auction, bidder, price FROM bid ORDER BY price DESC, auction, bidder LIMIT 10;\n",
    );
    let path = file.to_str().unwrap();
    let (ok, stdout, stderr) = skein(&["run", path, "--epochs", "4", "--verify"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("verified: equal"), "{stdout}");
    assert!(stdout.contains("10 result rows"), "{stdout}");

    let (ok, stdout, stderr) = skein(&["explain", path, "--json"]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let stages = v["stages"].as_array().unwrap();
    assert!(stages.len() >= 2, "{stdout}");
    let code = v["query_code"].as_str().unwrap();
    assert!(
        stages[0]["functions"][0]
            .as_str()
            .unwrap()
            .starts_with(&format!("{code}-"))
    );
}

#[test]
fn a_bad_query_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("skein-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.sql");
    std::fs::write(
        &file,
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bids';\nSELECT * FROM bid;",
    )
    .unwrap();
    let (ok, _, stderr) = skein(&["run", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("LOCATION must be 'person', 'auction' or 'bid'"),
        "{stderr}"
    );
}

#[test]
fn a_ysb_generator_table_runs_the_ysb_aggregate_and_verifies() {
    let dir = std::env::temp_dir().join(format!("skein-cli-ysb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ysb.sql");
    // 50,000 events at 10,000/s: five seconds of event time in 10 s windows.
    std::fs::write(
        &file,
        "CREATE EXTERNAL TABLE ad_events STORED AS YSB LOCATION 'ad_events' \
           OPTIONS ('events' '50000', 'rate' '10000', 'partitions' '2');\n\
         SELECT ad_id, tumble(event_time, INTERVAL '10' SECOND) AS w, COUNT(*) AS views \
         FROM ad_events WHERE event_type = 'view' \
         GROUP BY ad_id, tumble(event_time, INTERVAL '10' SECOND);\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = skein(&[
        "run",
        file.to_str().unwrap(),
        "--epochs",
        "3",
        "--group-size",
        "4",
        "--verify",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let r = run_report(&stdout);
    assert_eq!(r.verified, Some(true), "{r:?}");
    assert_eq!(r.events, 50_000, "{r:?}");
    // 1,000 ads, each seen in the one window.
    assert_eq!(r.result_rows, 1000, "{r:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_generator_query_without_a_bound_runs_ten_epochs_and_exits() {
    let (dir, file) = query_file(
        "unbounded",
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' \
           OPTIONS ('events' '20000', 'partitions' '2');\n\
         SELECT count(*) AS bids FROM bid;\n",
    );
    // Bounded sources are no standing query: no bound means --epochs 10.
    let (ok, stdout, stderr) = skein(&["run", file.to_str().unwrap(), "--json"]);
    assert!(ok, "{stderr}");
    let r = run_report(&stdout);
    assert_eq!(r.epochs, 10, "{r:?}");
    assert_eq!(r.stopped, Stopped::Bound, "{r:?}");
    assert_eq!(r.result_rows, 1, "{r:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_blackhole_sink_counts_the_rows_it_drops() {
    let dir = std::env::temp_dir().join(format!("skein-cli-blackhole-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, sink_options: &str| {
        let file = dir.join(name);
        std::fs::write(
            &file,
            format!(
                "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' \
                   OPTIONS ('events' '20000', 'partitions' '2');\n\
                 CREATE EXTERNAL TABLE void (auction BIGINT, price BIGINT) \
                   STORED AS BLACKHOLE LOCATION 'void' {sink_options};\n\
                 INSERT INTO void SELECT auction, price FROM bid WHERE auction % 3 = 0;\n"
            ),
        )
        .unwrap();
        file.to_str().unwrap().to_string()
    };
    let expected = NexmarkGenerator::new(NexmarkConfig {
        max_events: Some(20_000),
        ..NexmarkConfig::default()
    })
    .unwrap()
    .into_events()
    .filter(|e| matches!(e, Event::Bid(b) if b.auction % 3 == 0))
    .count();
    assert!(expected > 0);

    let query = write("blackhole.sql", "");
    let (ok, stdout, stderr) = skein(&["run", &query, "--epochs", "4", "--json"]);
    assert!(ok, "{stderr}");
    let r = run_report(&stdout);
    assert_eq!(r.result_rows, expected, "{r:?}");
    let discarded = r
        .blackhole
        .as_ref()
        .expect("what the BLACKHOLE sink discarded");
    assert_eq!(discarded.rows, expected as u64, "{r:?}");
    // Two generator instances, four epochs: a batch per instance and epoch.
    let batches = discarded.batches;
    assert!((2..=8).contains(&batches), "{r:?}");

    let misspelt = write("blackhole-option.sql", "OPTIONS ('fromat' 'json')");
    let (ok, _, stderr) = skein(&["run", &misspelt]);
    assert!(!ok);
    assert!(stderr.contains("unknown option 'fromat'"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Bad input fails with one line naming what was wrong and a non-zero exit,
/// never a panic or a backtrace (even with RUST_BACKTRACE set).
fn refused(args: &[&str], wanted: &str) {
    let (ok, _, stderr) = skein(args);
    assert!(!ok, "{args:?} was accepted");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert!(!stderr.contains("Stack backtrace"), "{args:?}: {stderr}");
    let line = stderr.lines().find(|l| l.contains(wanted));
    assert!(
        line.is_some(),
        "{args:?}: no line with {wanted:?} in {stderr}"
    );
}

#[test]
fn bad_input_is_refused_with_a_one_line_reason() {
    let dir = std::env::temp_dir().join(format!("skein-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, sql: &str| {
        let file = dir.join(name);
        std::fs::write(&file, sql).unwrap();
        file.to_str().unwrap().to_string()
    };
    let typo = write(
        "typo.sql",
        "CREATE EXTERNAL TABLE t (a BIGINT) STORED AS KAFKA LOCATION 'x' \
           OPTIONS ('bootstrap.servers' '127.0.0.1:9', 'paralelism' '2');\n\
         SELECT a FROM t;\n",
    );
    refused(
        &["explain", &typo],
        "unknown option 'paralelism' for a KAFKA table",
    );
    let generator = write(
        "generator.sql",
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' OPTIONS ('event' '10');\n\
         SELECT auction FROM bid;\n",
    );
    refused(
        &["explain", &generator],
        "unknown option 'event' for a NEXMARK table",
    );
    let redis = write(
        "redis.sql",
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' OPTIONS ('events' '10');\n\
         CREATE EXTERNAL TABLE out (auction BIGINT, n BIGINT) STORED AS REDIS \
           LOCATION '127.0.0.1:9' OPTIONS ('layout' 'hash', 'key' 'a:{auction}', \
           'ttl.seconds' '9223372036854775808');\n\
         INSERT INTO out SELECT auction, count(*) AS n FROM bid GROUP BY auction;\n",
    );
    refused(&["explain", &redis], "ttl.seconds");
    // YSB's layout is a sink kind of its own, whose options are checked too.
    let windows = |kind: &str, options: &str| {
        format!(
            "CREATE EXTERNAL TABLE ad_events STORED AS YSB LOCATION 'ad_events' OPTIONS ('events' '10');\n\
             CREATE EXTERNAL TABLE out (campaign_id VARCHAR, window_start TIMESTAMP, seen_count BIGINT) \
               STORED AS {kind} LOCATION '127.0.0.1:9' OPTIONS ({options});\n\
             INSERT INTO out SELECT ad_id AS campaign_id, tumble(event_time, INTERVAL '10' SECOND) AS window_start, \
               count(*) AS seen_count FROM ad_events GROUP BY ad_id, tumble(event_time, INTERVAL '10' SECOND);\n"
        )
    };
    let old_layout = write("old-layout.sql", &windows("REDIS", "'layout' 'ysb'"));
    refused(&["explain", &old_layout], "STORED AS YSB_REDIS");
    let ysb_redis = write("ysb-redis.sql", &windows("YSB_REDIS", "'layout' 'ysb'"));
    refused(
        &["explain", &ysb_redis],
        "unknown option 'layout' for a YSB_REDIS table",
    );
    let ysb_redis = write(
        "ysb-redis-ok.sql",
        &windows("YSB_REDIS", "'emit' 'updates'"),
    );
    let (ok, _, stderr) = skein(&["explain", &ysb_redis]);
    assert!(ok, "a YSB_REDIS table plans: {stderr}");
    let huge = write(
        "huge.sql",
        "CREATE EXTERNAL TABLE ad_events STORED AS YSB LOCATION 'ad_events' \
           OPTIONS ('events' '18446744073709551615');\n\
         SELECT count(*) FROM ad_events;\n",
    );
    refused(
        &["run", &huge, "--epochs", "2"],
        "\"events\" must be at most",
    );
    let hop = write(
        "hop.sql",
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' \
           OPTIONS ('events' '1000', 'event_time' 'date_time');\n\
         SELECT window_start, count(*) AS n FROM (SELECT unnest(hop(date_time, \
           INTERVAL '1' MILLISECOND, INTERVAL '30' DAY)) AS window_start FROM bid) \
         GROUP BY window_start;\n",
    );
    refused(&["explain", &hop], "at most 1000 are allowed");
    let interval = write(
        "interval.sql",
        "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' \
           OPTIONS ('events' '1000', 'epoch.interval' 'soon');\n\
         SELECT count(*) FROM bid;\n",
    );
    refused(
        &["explain", &interval],
        "option 'epoch.interval' = \"soon\"",
    );
    refused(
        &["run", &hop, "--group-size", "0"],
        "'--group-size <GROUP_SIZE>': must be at least 1",
    );
    refused(&["bench", "codec", "--events", "0"], "'--events <EVENTS>'");
    refused(
        &["bench", "codec", "--repeat", "0"],
        "'--repeat <REPEAT>': must be at least 1",
    );
    refused(
        &["bench", "codec", "--events", "1", "--epochs", "1"],
        "no bids among them",
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A checkpoint directory belongs to one query and one process: another
/// query text, a second live process, or a generator resumed with another
/// epoch count is a one-line refusal.
#[test]
fn a_checkpoint_directory_is_kept_to_its_query_and_process() {
    let dir = std::env::temp_dir().join(common::unique_name("skein-cli-checkpoint"));
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let checkpoints = dir.join("checkpoints");
    let query = |threshold: u32| {
        let file = dir.join(format!("q{threshold}.sql"));
        std::fs::write(
            &file,
            format!(
                "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' \
                   OPTIONS ('events' '20000', 'partitions' '2', 'event_time' 'date_time');\n\
                 CREATE EXTERNAL TABLE out (auction BIGINT, price BIGINT) STORED AS FILES \
                   LOCATION 'file://{}' OPTIONS ('format' 'json');\n\
                 INSERT INTO out SELECT auction, price FROM bid WHERE price > {threshold};\n",
                out.display()
            ),
        )
        .unwrap();
        file.to_str().unwrap().to_string()
    };
    let dir_arg = checkpoints.to_str().unwrap();
    let run = |file: &str, epochs: &str| {
        skein(&[
            "run",
            file,
            "--epochs",
            epochs,
            "--checkpoint-dir",
            dir_arg,
            "--json",
        ])
    };
    let first = query(100);
    let (ok, stdout, stderr) = run(&first, "4");
    assert!(ok, "{stderr}");
    let report = run_report(&stdout);
    assert_eq!(report.epochs, 4, "{report:?}");
    // Run again: it resumes after its last epoch and has nothing left.
    let (ok, stdout, stderr) = run(&first, "4");
    assert!(ok, "{stderr}");
    let report = run_report(&stdout);
    assert_eq!(report.resumed_after, Some(3), "{report:?}");
    assert_eq!(report.epochs, 0, "{report:?}");
    // A generator slices its input by --epochs: another count would read
    // events twice, so it is refused.
    let (ok, _, stderr) = run(&first, "6");
    assert!(!ok, "a generator resumed with another --epochs");
    assert!(
        stderr.contains("resume with the same --epochs") && stderr.trim().lines().count() == 1,
        "{stderr}"
    );

    let (ok, _, stderr) = run(&query(200), "4");
    assert!(!ok, "another query was let into the directory");
    assert!(
        stderr.contains("belongs to query") && stderr.trim().lines().count() == 1,
        "{stderr}"
    );

    // This test's own process stands in for a live holder of the lock.
    std::fs::write(checkpoints.join("lock"), std::process::id().to_string()).unwrap();
    let (ok, _, stderr) = run(&first, "4");
    assert!(!ok, "a second process was let into the directory");
    assert!(
        stderr.contains("in use by process") && stderr.trim().lines().count() == 1,
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_query_is_named_by_its_file_or_a_comment_and_two_running_queries_cannot_share_a_name() {
    let dir = std::env::temp_dir().join(common::unique_name("skein-cli-names"));
    let root = dir.join("checkpoints");
    std::fs::create_dir_all(&root).unwrap();
    let query = |file: &str, threshold: u32, name_line: &str| {
        let path = dir.join(file);
        std::fs::write(
            &path,
            format!(
                "{name_line}CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' \
                   OPTIONS ('events' '2000');\n\
                 CREATE EXTERNAL TABLE out (auction BIGINT, price BIGINT) STORED AS FILES \
                   LOCATION 'file://{}' OPTIONS ('format' 'json');\n\
                 INSERT INTO out SELECT auction, price FROM bid WHERE price > {threshold};\n",
                dir.join(format!("out-{threshold}")).display()
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    };
    let manifest_name = |sub: &str| -> serde_json::Value {
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(root.join(sub).join("manifest.json")).unwrap())
                .unwrap();
        m["described"]["name"].clone()
    };
    let run = |file: &str, sub: &str, extra: &[&str]| {
        let dir = root.join(sub);
        let mut args = vec!["run", file, "--epochs", "2", "--checkpoint-dir"];
        args.push(dir.to_str().unwrap());
        args.extend_from_slice(extra);
        let (ok, _, stderr) = skein(&args);
        (ok, stderr)
    };
    // The file's stem, unless a comment or --name says otherwise.
    let (ok, stderr) = run(&query("clicks.sql", 10, ""), "a", &[]);
    assert!(ok, "{stderr}");
    assert_eq!(manifest_name("a"), "clicks");
    let (ok, stderr) = run(&query("b.sql", 20, "-- name: big-bids\n"), "b", &[]);
    assert!(ok, "{stderr}");
    assert_eq!(manifest_name("b"), "big-bids");
    let (ok, stderr) = run(&query("c.sql", 30, ""), "c", &["--name", "named"]);
    assert!(ok, "{stderr}");
    assert_eq!(manifest_name("c"), "named");
    let (ok, stdout, stderr) = skein(&[
        "status",
        &query("b.sql", 20, "-- name: big-bids\n"),
        "--checkpoint-dir",
        root.join("b").to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout
            .lines()
            .next()
            .unwrap_or_default()
            .ends_with("(big-bids)"),
        "{stdout}"
    );

    // While "big-bids" runs (this test's process stands in for its holder),
    // another query may not take the name; the same query may run again
    // once it has stopped.
    std::fs::write(root.join("b").join("lock"), std::process::id().to_string()).unwrap();
    let (ok, stderr) = run(&query("d.sql", 40, ""), "d", &["--name", "big-bids"]);
    assert!(!ok, "a second running query took the name");
    assert!(
        stderr.contains("already named \"big-bids\"") && stderr.trim().lines().count() == 1,
        "{stderr}"
    );
    std::fs::remove_file(root.join("b").join("lock")).unwrap();
    let (ok, stderr) = run(&query("d.sql", 40, ""), "d", &["--name", "big-bids"]);
    assert!(ok, "the name is free once its query stopped: {stderr}");

    // A query without a checkpoint store holds its name too (this test's
    // process stands in for it): a name given is refused, a file's stem is
    // only noted.
    std::fs::create_dir_all(root.join(".running")).unwrap();
    std::fs::write(
        root.join(".running")
            .join(format!("{}.json", std::process::id())),
        serde_json::json!({
            "query_code": "qstoreless", "name": "printed", "sql": "SELECT 1",
            "group_size": 1, "pid": std::process::id(), "started_ms": 0,
        })
        .to_string(),
    )
    .unwrap();
    let (ok, stderr) = run(&query("e.sql", 50, ""), "e", &["--name", "printed"]);
    assert!(!ok, "a name a store-less query holds was taken");
    assert!(stderr.contains("without a checkpoint store"), "{stderr}");
    let (ok, stderr) = run(&query("printed.sql", 60, ""), "f", &[]);
    assert!(ok, "a file's stem is noted, not refused: {stderr}");
    assert!(
        stderr.contains("note: a running query is already named"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
