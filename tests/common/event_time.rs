//! The event-time tests' records, their hand-written window reference (no
//! engine code), and running `skein` over them into a files sink.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::OnceLock;

use super::kafka::{PartitionWriter, create_topic, end_offsets};

// ---------------------------------------------------------------------------
// The records: {"k": key, "v": int, "ts": epoch ms}, in event-time order
// within each partition.

/// 2023-11-14T22:13:20Z, a multiple of every window size used here.
pub const BASE_MS: i64 = 1_700_000_000_000;
pub const PARTITIONS: i32 = 4;

#[derive(Clone, Debug)]
pub struct Rec {
    pub k: String,
    pub v: i64,
    pub ts: i64,
}

impl Rec {
    pub fn json(&self) -> String {
        format!(r#"{{"k":"{}","v":{},"ts":{}}}"#, self.k, self.v, self.ts)
    }
}

/// A fresh topic holding `records[p]` in partition `p`.
pub struct Topic {
    pub name: String,
    pub records: Vec<Vec<Rec>>,
}

impl Topic {
    pub fn create(prefix: &str, records: Vec<Vec<Rec>>) -> Topic {
        let brokers = super::require_kafka();
        let name = super::unique_name(prefix);
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

    pub fn all(&self) -> impl Iterator<Item = &Rec> {
        self.records.iter().flatten()
    }
}

/// Bursts of 1,000 records 10 ms apart (10 s of event time), separated by
/// pauses of 3 s, 3 s, then 15 s; the same event-time range in every
/// partition (partition `p` is `p` ms late). Each key skips every fourth
/// burst, so sessions (gap 5 s) both merge across short pauses and split.
pub fn bursty_records(partition: i32, n: usize) -> Vec<Rec> {
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
pub fn window_topic() -> &'static Topic {
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

pub fn tumble_start(ts: i64, size: i64) -> i64 {
    ts - ts.rem_euclid(size)
}

/// Starts `s = k * slide` of the windows `[s, s + size)` holding `ts`.
pub fn hop_starts(ts: i64, slide: i64, size: i64) -> Vec<i64> {
    let mut starts = vec![];
    let mut s = tumble_start(ts, slide);
    while s > ts - size {
        starts.push(s);
        s -= slide;
    }
    starts
}

/// (count, sum of v) per group, from (group, v) pairs.
pub fn count_sum<G: Ord>(rows: impl Iterator<Item = (G, i64)>) -> BTreeMap<G, (i64, i64)> {
    let mut acc: BTreeMap<G, (i64, i64)> = BTreeMap::new();
    for (group, v) in rows {
        let e = acc.entry(group).or_default();
        e.0 += 1;
        e.1 += v;
    }
    acc
}

/// (window start, key, count, sum of v) per tumbling window and key.
pub fn tumble_reference<'a>(
    records: impl Iterator<Item = &'a Rec>,
    size: i64,
) -> Vec<(i64, String, i64, i64)> {
    count_sum(records.map(|r| ((tumble_start(r.ts, size), r.k.clone()), r.v)))
        .into_iter()
        .map(|((w, k), (n, s))| (w, k, n, s))
        .collect()
}

/// (window start, count, sum of v) per sliding window.
pub fn hop_reference<'a>(
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
pub fn session_reference<'a>(
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
pub fn has_until_drained() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let (_, stdout, _) = super::skein(&["run", "--help"]);
        stdout.contains("--until-drained")
    })
}

/// Arguments that read the whole backlog, then flush all state. A short
/// interval: pulls of 777 records take a hundred epochs.
pub fn drain_args() -> Vec<&'static str> {
    if has_until_drained() {
        vec!["--until-drained", "--interval", "20ms"]
    } else {
        // Before --until-drained: a --duration run ends at the first epoch
        // that pulls nothing.
        vec!["--duration", "600s", "--interval", "20ms"]
    }
}

/// The table `ev` of the test records in `topic`, event time `ts`.
pub fn ev_table(topic: &str, options: &[(&str, String)]) -> String {
    let mut options = options.to_vec();
    options.push(("event_time", "ts".into()));
    kafka_table("ev", "k VARCHAR, v BIGINT, ts TIMESTAMP", topic, &options)
}

pub fn kafka_table(name: &str, columns: &str, topic: &str, options: &[(&str, String)]) -> String {
    let mut opts = vec![
        ("bootstrap.servers", super::kafka_brokers()),
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
pub fn files_table(columns: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(super::unique_name("skein-event-time"));
    std::fs::create_dir_all(&dir).expect("output directory");
    let ddl = format!(
        "CREATE EXTERNAL TABLE out ({columns}) STORED AS FILES LOCATION 'file://{}' OPTIONS ('format' 'json');\n",
        dir.display()
    );
    (dir, ddl)
}

pub fn write_sql(name: &str, sql: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("{}.sql", super::unique_name(name)));
    std::fs::write(&path, sql).expect("writing the SQL file");
    path
}

/// Runs `sql` to the end of the backlog; fails the test if skein fails.
pub fn run_drained(name: &str, sql: &str, group_size: usize) {
    let file = write_sql(name, sql);
    let file = file.to_str().expect("a UTF-8 path");
    let group = group_size.to_string();
    let mut args = vec!["run", file, "--group-size", &group, "--json"];
    args.extend(drain_args());
    let (ok, stdout, stderr) = super::skein(&args);
    assert!(ok, "{name}: skein {args:?} failed:\n{stderr}\n{stdout}");
}

/// Compares rows as multisets; the message says how many rows were
/// expected and shows the first missing and unexpected (or doubled) ones.
pub fn assert_same_rows<T: Ord + Clone + Debug>(what: &str, got: &[T], want: &[T]) {
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
