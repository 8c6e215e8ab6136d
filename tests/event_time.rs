//! Event-time correctness, checked against references computed without the
//! engine.
//!
//! `--verify` runs the engine's own window functions in one process, so it
//! cannot catch their bugs. Here the expected rows come from a small
//! hand-written reference over the very records the test put into Kafka:
//!
//! * tumbling, sliding (hop) and session windows over a 4-partition topic
//!   read from its backlog, with uneven pulls, parallelism 1, 2 and 4 and
//!   group sizes 1, 4 and 8: exactly one row per window (and key), with the
//!   values of the bounded result;
//! * a topic whose partitions 1-3 go idle while partition 0 runs on: its
//!   windows are written while the run goes on, not only at its end;
//! * NEXMark q5, q7 and q8 published with `skein gen` and read from Kafka.
//!
//! Results go to a files sink (JSON lines) and are read back as a multiset.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::kafka::{PartitionWriter, create_topic, end_offsets, first_records};
use common::rows::{int, millis, parse_timestamp, read_rows, text};
use serde_json::Value;
use skein_generators::nexmark::{Event, NexmarkConfig, NexmarkGenerator};

// ---------------------------------------------------------------------------
// The records: {"k": key, "v": int, "ts": epoch ms}, in event-time order
// within each partition.

/// 2023-11-14T22:13:20Z, a multiple of every window size used here.
const BASE_MS: i64 = 1_700_000_000_000;
const PARTITIONS: i32 = 4;

#[derive(Clone, Debug)]
struct Rec {
    k: String,
    v: i64,
    ts: i64,
}

impl Rec {
    fn json(&self) -> String {
        format!(r#"{{"k":"{}","v":{},"ts":{}}}"#, self.k, self.v, self.ts)
    }
}

/// A fresh topic holding `records[p]` in partition `p`.
struct Topic {
    name: String,
    records: Vec<Vec<Rec>>,
}

impl Topic {
    fn create(prefix: &str, records: Vec<Vec<Rec>>) -> Topic {
        let brokers = common::require_kafka();
        let name = common::unique_name(prefix);
        create_topic(&brokers, &name, records.len() as i32);
        let writer = PartitionWriter::new(&brokers, &name);
        for (p, recs) in records.iter().enumerate() {
            for r in recs {
                writer.send(p as i32, &r.json());
            }
        }
        writer.flush();
        // Every record landed, in the partition it was meant for.
        let want: Vec<i64> = records.iter().map(|r| r.len() as i64).collect();
        assert_eq!(end_offsets(&brokers, &name), want, "{name}: end offsets");
        Topic { name, records }
    }

    fn all(&self) -> impl Iterator<Item = &Rec> {
        self.records.iter().flatten()
    }
}

/// Bursts of 1,000 records 10 ms apart (10 s of event time), separated by
/// pauses of 3 s, 3 s, then 15 s; the same event-time range in every
/// partition (partition `p` is `p` ms late). Each key skips every fourth
/// burst, so sessions (gap 5 s) both merge across short pauses and split.
fn bursty_records(partition: i32, n: usize) -> Vec<Rec> {
    const BURST: usize = 1000;
    let p = partition as usize;
    let mut burst_start = BASE_MS;
    (0..n)
        .map(|i| {
            let burst = i / BURST;
            if i > 0 && i % BURST == 0 {
                let pause = if (burst - 1) % 3 == 2 { 15_000 } else { 3_000 };
                burst_start += 10_000 + pause;
            }
            let mut key = (i * 31 + p * 7) % 8;
            if (burst + key).is_multiple_of(4) {
                key = (key + 1) % 8;
            }
            Rec {
                k: format!("k{key}"),
                v: ((i * 13 + p * 101) % 1000) as i64,
                ts: burst_start + (i % BURST) as i64 * 10 + partition as i64,
            }
        })
        .collect()
}

/// The topic the window matrix reads: 4 x 20,000 bursty records.
fn window_topic() -> &'static Topic {
    static TOPIC: OnceLock<Topic> = OnceLock::new();
    TOPIC.get_or_init(|| {
        Topic::create(
            "event-time-windows",
            (0..PARTITIONS).map(|p| bursty_records(p, 20_000)).collect(),
        )
    })
}

// ---------------------------------------------------------------------------
// The reference: plain Rust, none of the engine's window code.

fn tumble_start(ts: i64, size: i64) -> i64 {
    ts - ts.rem_euclid(size)
}

/// Starts `s = k * slide` of the windows `[s, s + size)` holding `ts`.
fn hop_starts(ts: i64, slide: i64, size: i64) -> Vec<i64> {
    let mut starts = vec![];
    let mut s = tumble_start(ts, slide);
    while s > ts - size {
        starts.push(s);
        s -= slide;
    }
    starts
}

/// (count, sum of v) per group, from (group, v) pairs.
fn count_sum<G: Ord>(rows: impl Iterator<Item = (G, i64)>) -> BTreeMap<G, (i64, i64)> {
    let mut acc: BTreeMap<G, (i64, i64)> = BTreeMap::new();
    for (group, v) in rows {
        let e = acc.entry(group).or_default();
        e.0 += 1;
        e.1 += v;
    }
    acc
}

/// (window start, key, count, sum of v) per tumbling window and key.
fn tumble_reference<'a>(
    records: impl Iterator<Item = &'a Rec>,
    size: i64,
) -> Vec<(i64, String, i64, i64)> {
    count_sum(records.map(|r| ((tumble_start(r.ts, size), r.k.clone()), r.v)))
        .into_iter()
        .map(|((w, k), (n, s))| (w, k, n, s))
        .collect()
}

/// (window start, count, sum of v) per sliding window.
fn hop_reference<'a>(
    records: impl Iterator<Item = &'a Rec>,
    slide: i64,
    size: i64,
) -> Vec<(i64, i64, i64)> {
    let rows = records.flat_map(|r| hop_starts(r.ts, slide, size).into_iter().map(|w| (w, r.v)));
    count_sum(rows)
        .into_iter()
        .map(|(w, (n, s))| (w, n, s))
        .collect()
}

/// (key, session start, count, sum of v, last ts) per session: a key's
/// session ends where it is quiet for longer than `gap`.
fn session_reference<'a>(
    records: impl Iterator<Item = &'a Rec>,
    gap: i64,
) -> Vec<(String, i64, i64, i64, i64)> {
    let mut by_key: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for r in records {
        by_key.entry(&r.k).or_default().push((r.ts, r.v));
    }
    let mut out = vec![];
    for (k, mut rows) in by_key {
        rows.sort();
        let mut current: Option<(i64, i64, i64, i64)> = None; // start, n, sum, last
        for (ts, v) in rows {
            current = match current {
                Some((start, n, s, last)) if ts - last <= gap => Some((start, n + 1, s + v, ts)),
                done => {
                    if let Some((start, n, s, last)) = done {
                        out.push((k.to_string(), start, n, s, last));
                    }
                    Some((ts, 1, v, ts))
                }
            };
        }
        if let Some((start, n, s, last)) = current {
            out.push((k.to_string(), start, n, s, last));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Running `skein` and reading what it wrote.

/// Whether this `skein` has `run --until-drained` (stop once every
/// partition reached the end offsets seen at the start).
fn has_until_drained() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let (_, stdout, _) = common::skein(&["run", "--help"]);
        stdout.contains("--until-drained")
    })
}

/// Arguments that read the whole backlog, then flush all state. A short
/// interval: pulls of 777 records take a hundred epochs.
fn drain_args() -> Vec<&'static str> {
    if has_until_drained() {
        vec!["--until-drained", "--interval", "20ms"]
    } else {
        // Before --until-drained: a --duration run ends at the first epoch
        // that pulls nothing.
        vec!["--duration", "600s", "--interval", "20ms"]
    }
}

/// The table `ev` of the test records in `topic`, event time `ts`.
fn ev_table(topic: &str, options: &[(&str, String)]) -> String {
    let mut options = options.to_vec();
    options.push(("event_time", "ts".into()));
    kafka_table("ev", "k VARCHAR, v BIGINT, ts TIMESTAMP", topic, &options)
}

fn kafka_table(name: &str, columns: &str, topic: &str, options: &[(&str, String)]) -> String {
    let mut opts = vec![
        ("bootstrap.servers", common::kafka_brokers()),
        ("format", "json".to_string()),
    ];
    opts.extend(options.iter().cloned());
    let opts: Vec<String> = opts.iter().map(|(k, v)| format!("'{k}' '{v}'")).collect();
    format!(
        "CREATE EXTERNAL TABLE {name} ({columns}) STORED AS KAFKA LOCATION '{topic}' OPTIONS ({});\n",
        opts.join(", ")
    )
}

/// A fresh output directory and the files table `out` writing JSON lines to it.
fn files_table(columns: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(common::unique_name("skein-event-time"));
    std::fs::create_dir_all(&dir).expect("output directory");
    let ddl = format!(
        "CREATE EXTERNAL TABLE out ({columns}) STORED AS FILES LOCATION 'file://{}' OPTIONS ('format' 'json');\n",
        dir.display()
    );
    (dir, ddl)
}

fn write_sql(name: &str, sql: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("{}.sql", common::unique_name(name)));
    std::fs::write(&path, sql).expect("writing the SQL file");
    path
}

/// Runs `sql` to the end of the backlog; fails the test if skein fails.
fn run_drained(name: &str, sql: &str, group_size: usize) {
    let file = write_sql(name, sql);
    let file = file.to_str().expect("a UTF-8 path");
    let group = group_size.to_string();
    let mut args = vec!["run", file, "--group-size", &group, "--json"];
    args.extend(drain_args());
    let (ok, stdout, stderr) = common::skein(&args);
    assert!(ok, "{name}: skein {args:?} failed:\n{stderr}\n{stdout}");
}

/// Compares rows as multisets; the message says how many rows were
/// expected and shows the first missing and unexpected (or doubled) ones.
fn assert_same_rows<T: Ord + Clone + Debug>(what: &str, got: &[T], want: &[T]) {
    let count = |rows: &[T]| {
        let mut m: BTreeMap<T, usize> = BTreeMap::new();
        for r in rows {
            *m.entry(r.clone()).or_default() += 1;
        }
        m
    };
    let (g, w) = (count(got), count(want));
    let surplus = |a: &BTreeMap<T, usize>, b: &BTreeMap<T, usize>| -> Vec<(T, usize)> {
        a.iter()
            .filter(|(r, n)| b.get(*r).copied().unwrap_or(0) < **n)
            .map(|(r, n)| (r.clone(), n - b.get(r).copied().unwrap_or(0)))
            .collect()
    };
    let missing = surplus(&w, &g);
    let extra = surplus(&g, &w);
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: {} rows, expected {}; {} expected rows missing, {} rows not expected (or too often)\n\
         first missing: {:?}\nfirst unexpected (row, times): {:?}",
        got.len(),
        want.len(),
        missing.len(),
        extra.len(),
        &missing[..missing.len().min(8)],
        &extra[..extra.len().min(8)],
    );
}

// ---------------------------------------------------------------------------
// Tumble, hop and session over the 4-partition backlog.

#[derive(Clone, Copy, Debug)]
enum Window {
    /// 10 s tumbling windows, count and sum per key.
    Tumble,
    /// 10 s windows sliding every 5 s, count and sum.
    Hop,
    /// Sessions per key with a 5 s gap.
    Session,
}

/// Runs `window` over the window topic with `parallelism` source instances,
/// `pull` records per pull and `group_size`, and checks every row.
fn check_window(window: Window, parallelism: usize, pull: usize, group_size: usize) {
    let topic = window_topic();
    let what = format!(
        "{window:?} parallelism {parallelism}, max.records.per.pull {pull}, group size {group_size}"
    );
    let source = ev_table(
        &topic.name,
        &[
            ("parallelism", parallelism.to_string()),
            ("max.records.per.pull", pull.to_string()),
        ],
    );
    match window {
        Window::Tumble => {
            let (dir, sink) = files_table("w TIMESTAMP, k VARCHAR, n BIGINT, s BIGINT");
            let query = "INSERT INTO out SELECT tumble(ts, INTERVAL '10' SECOND) AS w, k, \
                         count(*) AS n, sum(v) AS s FROM ev \
                         GROUP BY tumble(ts, INTERVAL '10' SECOND), k";
            run_drained("tumble", &format!("{source}{sink}{query}"), group_size);
            let got: Vec<_> = read_rows(&dir, true)
                .iter()
                .map(|r| (millis(r, "w"), text(r, "k"), int(r, "n"), int(r, "s")))
                .collect();
            assert_same_rows(&what, &got, &tumble_reference(topic.all(), 10_000));
        }
        Window::Hop => {
            let (dir, sink) = files_table("window_start TIMESTAMP, n BIGINT, s BIGINT");
            let query = "INSERT INTO out WITH h AS (\
                           SELECT unnest(hop(ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)) AS window_start, v FROM ev) \
                         SELECT window_start, count(*) AS n, sum(v) AS s FROM h GROUP BY window_start";
            run_drained("hop", &format!("{source}{sink}{query}"), group_size);
            let got: Vec<_> = read_rows(&dir, true)
                .iter()
                .map(|r| (millis(r, "window_start"), int(r, "n"), int(r, "s")))
                .collect();
            assert_same_rows(&what, &got, &hop_reference(topic.all(), 5_000, 10_000));
        }
        Window::Session => {
            let (dir, sink) = files_table(
                "k VARCHAR, session_start TIMESTAMP, n BIGINT, s BIGINT, last_ts TIMESTAMP",
            );
            let query = "INSERT INTO out WITH s AS (\
                           SELECT k, v, ts, session(ts, INTERVAL '5' SECOND) \
                             OVER (PARTITION BY k ORDER BY ts) AS session_start FROM ev) \
                         SELECT k, session_start, count(*) AS n, sum(v) AS s, max(ts) AS last_ts \
                         FROM s GROUP BY k, session_start";
            run_drained("session", &format!("{source}{sink}{query}"), group_size);
            let got: Vec<_> = read_rows(&dir, true)
                .iter()
                .map(|r| {
                    (
                        text(r, "k"),
                        millis(r, "session_start"),
                        int(r, "n"),
                        int(r, "s"),
                        millis(r, "last_ts"),
                    )
                })
                .collect();
            assert_same_rows(&what, &got, &session_reference(topic.all(), 5_000));
        }
    }
}

// The matrix covers each parallelism (1, 2, 4), group size (1, 4, 8) and an
// uneven pull (777, 5000) for every window kind, not the full product.
// Parallelism 1 with group size 1 is the configuration known to be right:
// it checks the reference itself.

#[test]
fn tumble_parallelism_1_group_1_pull_777() {
    check_window(Window::Tumble, 1, 777, 1);
}

#[test]
fn tumble_parallelism_4_group_4_pull_777() {
    check_window(Window::Tumble, 4, 777, 4);
}

#[test]
fn tumble_parallelism_2_group_8_pull_5000() {
    check_window(Window::Tumble, 2, 5000, 8);
}

#[test]
fn hop_parallelism_1_group_1_pull_5000() {
    check_window(Window::Hop, 1, 5000, 1);
}

#[test]
fn hop_parallelism_2_group_4_pull_777() {
    check_window(Window::Hop, 2, 777, 4);
}

#[test]
fn hop_parallelism_4_group_8_pull_5000() {
    check_window(Window::Hop, 4, 5000, 8);
}

#[test]
fn session_parallelism_1_group_1_pull_5000() {
    check_window(Window::Session, 1, 5000, 1);
}

#[test]
fn session_parallelism_4_group_1_pull_777() {
    check_window(Window::Session, 4, 777, 1);
}

#[test]
fn session_parallelism_2_group_8_pull_777() {
    check_window(Window::Session, 2, 777, 8);
}

/// The issue's experiment: 4 partitions x 100,000 records 10 ms apart over
/// the same event-time range, so 100 windows of 10 s with 4,000 records
/// each; parallelism 2 with pulls of 5,000 gave 286 rows.
#[test]
fn tumble_count_4x100k_same_range_parallelism_2_pull_5000() {
    let records: Vec<Vec<Rec>> = (0..PARTITIONS)
        .map(|_| {
            (0..100_000)
                .map(|i| Rec {
                    k: "k".into(),
                    v: 1,
                    ts: BASE_MS + i * 10,
                })
                .collect()
        })
        .collect();
    let topic = Topic::create("event-time-4x100k", records);
    let source = ev_table(
        &topic.name,
        &[
            ("parallelism", "2".into()),
            ("max.records.per.pull", "5000".into()),
        ],
    );
    let (dir, sink) = files_table("w TIMESTAMP, n BIGINT");
    let query = "INSERT INTO out SELECT tumble(ts, INTERVAL '10' SECOND) AS w, count(*) AS n \
                 FROM ev GROUP BY 1";
    run_drained("4x100k", &format!("{source}{sink}{query}"), 8);
    let got: Vec<(i64, i64)> = read_rows(&dir, true)
        .iter()
        .map(|r| (millis(r, "w"), int(r, "n")))
        .collect();
    let want: Vec<(i64, i64)> = (0..100).map(|w| (BASE_MS + w * 10_000, 4000)).collect();
    assert_same_rows("4 x 100,000 records, tumble count", &got, &want);
}

// ---------------------------------------------------------------------------
// Idle partitions.

/// Kills the `skein` process this test started if the test fails early.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Partitions 1-3 get 2 s of event time at the start and then nothing;
/// partition 0 is written on for ~18 s of wall time, its event time running
/// 10x as fast. With a short idle timeout, windows that only partition 0
/// has rows in are written while the run goes on, not only at its end.
fn check_idle_partitions(parallelism: usize) {
    let brokers = common::require_kafka();
    let name = common::unique_name("event-time-idle");
    create_topic(&brokers, &name, PARTITIONS);
    let writer = PartitionWriter::new(&brokers, &name);
    let mut written: Vec<Rec> = vec![];
    let mut send = |p: i32, ts: i64| {
        let r = Rec {
            k: format!("p{p}"),
            v: ts % 7,
            ts,
        };
        writer.send(p, &r.json());
        written.push(r);
    };
    for p in 0..PARTITIONS {
        for i in 0..20 {
            send(p, BASE_MS + i * 100);
        }
    }
    writer.flush();
    let idle_until = BASE_MS + 2_000;

    let source = ev_table(
        &name,
        &[
            ("parallelism", parallelism.to_string()),
            ("idle.timeout", "1s".into()),
        ],
    );
    let (dir, sink) = files_table("w TIMESTAMP, n BIGINT, s BIGINT");
    let query = "INSERT INTO out SELECT tumble(ts, INTERVAL '10' SECOND) AS w, \
                 count(*) AS n, sum(v) AS s FROM ev GROUP BY 1";
    let file = write_sql("idle", &format!("{source}{sink}{query}"));
    let log = std::env::temp_dir().join(common::unique_name("skein-idle-log"));
    let mut child = Running(
        Command::new(env!("CARGO_BIN_EXE_skein"))
            .arg("run")
            .arg(&file)
            // Outlasts partition 0's ~20 s of writes (an engine that stops at
            // the first empty epoch stops soon after them).
            .args(["--duration", "45s", "--interval", "250ms"])
            .args(["--group-size", "4", "--json"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("starting skein run"),
    );

    // Partition 0 runs on: a record every 20 ms of wall time, 200 ms of
    // event time apart. Between records, look at what has been written.
    let mut seen_while_running: BTreeSet<i64> = BTreeSet::new();
    let mut last_look = Instant::now();
    let mut ts = idle_until;
    for _ in 0..900 {
        send(0, ts);
        ts += 200;
        std::thread::sleep(Duration::from_millis(20));
        if last_look.elapsed() >= Duration::from_millis(250) {
            last_look = Instant::now();
            seen_while_running.extend(read_rows(&dir, false).iter().map(|r| millis(r, "w")));
            if let Ok(Some(status)) = child.0.try_wait() {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("skein run stopped while partition 0 was being written ({status}):\n{log}");
            }
        }
    }
    writer.flush();

    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("waiting for skein") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "skein run did not end"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "skein run failed ({status}):\n{log}");

    // Windows after the idle partitions' last record hold only partition 0's
    // rows: seeing one before partition 0 stopped means the idle partitions
    // did not hold the watermark.
    assert!(
        seen_while_running.iter().any(|w| *w >= idle_until),
        "no window after the idle partitions' data was written while partition 0 \
         was still being written (windows seen then: {seen_while_running:?}); \
         idle partitions hold windows until the end of the run:\n{log}"
    );
    let got: Vec<(i64, i64, i64)> = read_rows(&dir, true)
        .iter()
        .map(|r| (millis(r, "w"), int(r, "n"), int(r, "s")))
        .collect();
    let want: Vec<(i64, i64, i64)> =
        count_sum(written.iter().map(|r| (tumble_start(r.ts, 10_000), r.v)))
            .into_iter()
            .map(|(w, (n, s))| (w, n, s))
            .collect();
    assert_same_rows(
        &format!("idle partitions, parallelism {parallelism}, tumble"),
        &got,
        &want,
    );
}

/// One source instance owns the idle partitions and the running one.
#[test]
fn idle_partitions_do_not_hold_windows_back_parallelism_1() {
    check_idle_partitions(1);
}

/// Instance 1 owns partitions 1 and 3, and so is idle as a whole.
#[test]
fn idle_partitions_do_not_hold_windows_back_parallelism_2() {
    check_idle_partitions(2);
}

// ---------------------------------------------------------------------------
// NEXMark q5, q7 and q8 from Kafka.

/// 40 s of event time at the generator's 10,000 events/s.
const NEXMARK_EVENTS: u64 = 400_000;

/// Topics `<prefix>-person|auction|bid` written by `skein gen`, and the
/// same events generated in this process.
struct NexmarkTopics {
    prefix: String,
    events: Vec<Event>,
}

fn nexmark_topics() -> &'static NexmarkTopics {
    static TOPICS: OnceLock<NexmarkTopics> = OnceLock::new();
    TOPICS.get_or_init(|| {
        let brokers = common::require_kafka();
        let prefix = common::unique_name("event-time-nexmark");
        let events = NEXMARK_EVENTS.to_string();
        let (ok, _, stderr) = common::skein(&[
            "gen",
            "nexmark",
            "--to",
            &format!("kafka://{brokers}/{prefix}"),
            "--events",
            &events,
            "--partitions",
            "4",
            "--json",
        ]);
        assert!(ok, "skein gen nexmark failed:\n{stderr}");
        // `skein gen` starts event time at the wall clock; event 0 is the
        // first person, at exactly that time.
        let base_time_ms = first_records(&brokers, &format!("{prefix}-person"))
            .iter()
            .map(|payload| {
                let v: Value = serde_json::from_slice(payload).expect("a JSON person");
                v["date_time"].as_i64().expect("date_time in ms")
            })
            .min()
            .expect("the person topic has records");
        let events: Vec<Event> = NexmarkGenerator::new(NexmarkConfig {
            base_time_ms,
            max_events: Some(NEXMARK_EVENTS),
            ..NexmarkConfig::default()
        })
        .expect("a NEXMark generator")
        .into_events()
        .collect();
        // The same stream: as many records per table as generated here.
        for (table, kind) in [("person", 0), ("auction", 1), ("bid", 2)] {
            let generated = events
                .iter()
                .filter(|e| match e {
                    Event::Person(_) => kind == 0,
                    Event::Auction(_) => kind == 1,
                    Event::Bid(_) => kind == 2,
                })
                .count() as i64;
            let published: i64 = end_offsets(&brokers, &format!("{prefix}-{table}"))
                .iter()
                .sum();
            assert_eq!(published, generated, "{prefix}-{table}: records");
        }
        NexmarkTopics { prefix, events }
    })
}

fn bids(events: &[Event]) -> impl Iterator<Item = (i64, i64, i64, i64)> + '_ {
    events.iter().filter_map(|e| match e {
        Event::Bid(b) => Some((b.auction, b.bidder, b.price, b.date_time)),
        _ => None,
    })
}

/// q5: per 10 s window sliding every 5 s, the auction(s) with the most
/// bids: (auction, bids, window start).
fn q5_reference(events: &[Event]) -> Vec<(i64, i64, i64)> {
    let mut counts: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    for (auction, _, _, t) in bids(events) {
        for w in hop_starts(t, 5_000, 10_000) {
            *counts.entry((w, auction)).or_default() += 1;
        }
    }
    let mut top: BTreeMap<i64, i64> = BTreeMap::new();
    for ((w, _), n) in &counts {
        let m = top.entry(*w).or_default();
        *m = (*m).max(*n);
    }
    counts
        .into_iter()
        .filter(|((w, _), n)| top[w] == *n)
        .map(|((w, auction), n)| (auction, n, w))
        .collect()
}

/// q7: per 10 s tumbling window, the bid(s) with the top price:
/// (auction, price, bidder, date_time, window start).
fn q7_reference(events: &[Event]) -> Vec<(i64, i64, i64, i64, i64)> {
    let mut top: BTreeMap<i64, i64> = BTreeMap::new();
    for (_, _, price, t) in bids(events) {
        let m = top.entry(tumble_start(t, 10_000)).or_insert(price);
        *m = (*m).max(price);
    }
    bids(events)
        .filter(|(_, _, price, t)| top[&tumble_start(*t, 10_000)] == *price)
        .map(|(auction, bidder, price, t)| (auction, price, bidder, t, tumble_start(t, 10_000)))
        .collect()
}

/// q8: people who registered and opened an auction in the same 10 s
/// tumbling window: (id, name, window start), once each.
fn q8_reference(events: &[Event]) -> Vec<(i64, String, i64)> {
    let mut people: BTreeSet<(i64, i64, String)> = BTreeSet::new();
    let mut sellers: BTreeSet<(i64, i64)> = BTreeSet::new();
    for e in events {
        match e {
            Event::Person(p) => {
                people.insert((tumble_start(p.date_time, 10_000), p.id, p.name.clone()));
            }
            Event::Auction(a) => {
                sellers.insert((tumble_start(a.date_time, 10_000), a.seller));
            }
            Event::Bid(_) => {}
        }
    }
    people
        .into_iter()
        .filter(|(w, id, _)| sellers.contains(&(*w, *id)))
        .map(|(w, id, name)| (id, name, w))
        .collect()
}

/// The text of queries/nexmark/qN.sql over Kafka tables of the NEXMark
/// topics, into a files table with `out_columns`; returns the output
/// directory.
fn run_nexmark(query: u32, out_columns: &str, group_size: usize) -> PathBuf {
    let topics = nexmark_topics();
    let p = &topics.prefix;
    let event_time = [("event_time", "date_time".to_string())];
    let tables = match query {
        8 => [
            kafka_table(
                "person",
                "id BIGINT, name VARCHAR, date_time TIMESTAMP",
                &format!("{p}-person"),
                &event_time,
            ),
            kafka_table(
                "auction",
                "id BIGINT, seller BIGINT, date_time TIMESTAMP",
                &format!("{p}-auction"),
                &event_time,
            ),
        ]
        .concat(),
        _ => kafka_table(
            "bid",
            "auction BIGINT, bidder BIGINT, price BIGINT, date_time TIMESTAMP",
            &format!("{p}-bid"),
            &event_time,
        ),
    };
    let path = common::repo_path(&format!("queries/nexmark/q{query}.sql"));
    let body = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let (dir, sink) = files_table(out_columns);
    run_drained(
        &format!("nexmark-q{query}"),
        &format!("{tables}{sink}INSERT INTO out\n{body}"),
        group_size,
    );
    dir
}

fn check_q5(group_size: usize) {
    let dir = run_nexmark(
        5,
        "auction BIGINT, num BIGINT, window_start TIMESTAMP",
        group_size,
    );
    let got: Vec<_> = read_rows(&dir, true)
        .iter()
        .map(|r| (int(r, "auction"), int(r, "num"), millis(r, "window_start")))
        .collect();
    let want = q5_reference(&nexmark_topics().events);
    assert_same_rows(&format!("NEXMark q5, group size {group_size}"), &got, &want);
}

fn check_q7(group_size: usize) {
    let dir = run_nexmark(
        7,
        "auction BIGINT, price BIGINT, bidder BIGINT, date_time TIMESTAMP, window_start TIMESTAMP",
        group_size,
    );
    let got: Vec<_> = read_rows(&dir, true)
        .iter()
        .map(|r| {
            (
                int(r, "auction"),
                int(r, "price"),
                int(r, "bidder"),
                millis(r, "date_time"),
                millis(r, "window_start"),
            )
        })
        .collect();
    let want = q7_reference(&nexmark_topics().events);
    assert_same_rows(&format!("NEXMark q7, group size {group_size}"), &got, &want);
}

fn check_q8(group_size: usize) {
    let dir = run_nexmark(
        8,
        "id BIGINT, name VARCHAR, window_start TIMESTAMP",
        group_size,
    );
    let got: Vec<_> = read_rows(&dir, true)
        .iter()
        .map(|r| (int(r, "id"), text(r, "name"), millis(r, "window_start")))
        .collect();
    let want = q8_reference(&nexmark_topics().events);
    assert_same_rows(&format!("NEXMark q8, group size {group_size}"), &got, &want);
}

// The default group size (8) is what the issue asks for; group size 1 is
// the configuration known to be right and checks the references.

#[test]
fn nexmark_q5_from_kafka_default_group_size() {
    check_q5(8);
}

#[test]
fn nexmark_q7_from_kafka_default_group_size() {
    check_q7(8);
}

#[test]
fn nexmark_q8_from_kafka_default_group_size() {
    check_q8(8);
}

#[test]
fn nexmark_q5_from_kafka_group_size_1() {
    check_q5(1);
}

#[test]
fn nexmark_q7_from_kafka_group_size_1() {
    check_q7(1);
}

#[test]
fn nexmark_q8_from_kafka_group_size_1() {
    check_q8(1);
}

#[test]
fn reference_windows_by_hand() {
    // The reference's own arithmetic, on values worked out by hand.
    assert_eq!(tumble_start(BASE_MS + 9_999, 10_000), BASE_MS);
    assert_eq!(tumble_start(-1, 10_000), -10_000);
    assert_eq!(hop_starts(12_000, 5_000, 10_000), vec![10_000, 5_000]);
    assert_eq!(hop_starts(10_000, 5_000, 10_000), vec![10_000, 5_000]);
    let recs = |ts: &[i64]| -> Vec<Rec> {
        ts.iter()
            .map(|t| Rec {
                k: "a".into(),
                v: 1,
                ts: *t,
            })
            .collect()
    };
    // A gap of exactly 5 s continues the session; 5,001 ms ends it.
    assert_eq!(
        session_reference(recs(&[0, 5_000, 10_001]).iter(), 5_000),
        vec![
            ("a".into(), 0, 2, 2, 5_000),
            ("a".into(), 10_001, 1, 1, 10_001)
        ]
    );
    assert_eq!(parse_timestamp("2023-11-14T22:13:20"), Some(BASE_MS));
    assert_eq!(parse_timestamp("1970-01-01T00:00:00.5"), Some(500));
    assert_eq!(
        parse_timestamp("2020-01-01T00:00:00.123"),
        Some(1_577_836_800_123)
    );
}
