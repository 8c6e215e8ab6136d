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
//!
//! NEXMark q5, q7 and q8 from Kafka are in nexmark.rs; the
//! records, the reference and the runner in tests/common/event_time.rs.
//!
//! Results go to a files sink (JSON lines) and are read back as a multiset.

use crate::common;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::kafka::{PartitionWriter, create_topic};
use crate::common::rows::{int, millis, parse_timestamp, read_rows, text};

use crate::common::event_time::*;

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

/// The experiment: 4 partitions x 100,000 records 10 ms apart over
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
/// partition 0 is written on, its event time running 10x as fast as wall
/// time, until a window only partition 0 has rows in is written while the
/// run goes on (not only at its end): a short idle timeout lets the idle
/// partitions' watermark pass.
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
    let checkpoints = std::env::temp_dir().join(common::unique_name("skein-idle-cp"));
    let command = |bound: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_skein"));
        c.arg("run")
            .arg(&file)
            .args(bound)
            .args(["--interval", "250ms", "--group-size", "4", "--json"])
            .arg("--checkpoint-dir")
            .arg(&checkpoints)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        c
    };
    // A standing run: it goes on until it is stopped, however long the
    // writes below take on a loaded machine.
    let mut child = Running(command(&[]).spawn().expect("starting skein run"));

    // Partition 0 runs on: a record every 20 ms, 200 ms of event time
    // apart, until a window after the idle partitions' data has been
    // written while it still is. Every dozen records, look.
    let mut seen_while_running: BTreeSet<i64> = BTreeSet::new();
    let mut ts = idle_until;
    for sent in 0.. {
        send(0, ts);
        ts += 200;
        std::thread::sleep(Duration::from_millis(20));
        if sent % 12 != 11 {
            continue;
        }
        seen_while_running.extend(read_rows(&dir, false).iter().map(|r| millis(r, "w")));
        if seen_while_running.iter().any(|w| *w >= idle_until) {
            break;
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("skein run stopped while partition 0 was being written ({status}):\n{log}");
        }
        // A hang guard: 15,000 records is 5 minutes of writing.
        assert!(
            sent < 15_000,
            "no window after the idle partitions' data was written while partition 0 \
             was still being written (windows seen: {seen_while_running:?}); idle \
             partitions hold windows back:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    writer.flush();

    // Stop it (it commits the epoch in flight), then a bounded run takes
    // the rest and flushes the open windows.
    let sent = Command::new("kill")
        .args(["-s", "TERM", &child.0.id().to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success(), "kill -s TERM");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("waiting for skein") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "skein run did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "skein run failed ({status}):\n{text}");
    let mut drain = command(&["--until-drained"]);
    let status = drain.status().expect("the draining run");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "the draining run failed ({status}):\n{text}"
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
