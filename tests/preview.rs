//! `skein preview` in a terminal (a pty, through util-linux's `script`) on a
//! live Kafka topic: records produced before it starts are not read (it
//! starts at the latest offsets), the updating query's rows are taken back
//! and replaced as records arrive, the table the printed changes add up to
//! equals a count made without the engine, and the query's sink (a keyed
//! Kafka table) receives nothing.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::windowed;

/// Lines the preview printed so far, read on a thread.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            // The pty's carriage returns.
            if tx.send(line.trim_end_matches('\r').to_string()).is_err() {
                break;
            }
        }
    });
    rx
}

/// The next line within `secs`, or a failure naming what was awaited.
fn next_line(rx: &mpsc::Receiver<String>, secs: u64, what: &str, seen: &[String]) -> String {
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| {
            panic!(
                "no {what} within {secs} s; printed so far:\n{}",
                seen.join("\n")
            )
        })
}

#[test]
fn preview_prints_an_updating_querys_changes_live_and_writes_no_sink() {
    let brokers = common::require_kafka();
    let (topic, source) = windowed::empty_kafka_table(1, 500);
    let sink_topic = common::unique_name("preview-out");
    common::kafka::create_topic(&brokers, &sink_topic, 1);
    let work = std::env::temp_dir().join(common::unique_name("skein-preview"));
    std::fs::create_dir_all(&work).unwrap();
    let sql = work.join("q.sql");
    std::fs::write(
        &sql,
        format!(
            "{source}\nCREATE EXTERNAL TABLE out (k VARCHAR, n BIGINT) STORED AS KAFKA \
             LOCATION '{sink_topic}' OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json', \
             'key' 'k');\nINSERT INTO out SELECT k, count(*) AS n FROM ev GROUP BY k;\n"
        ),
    )
    .unwrap();
    // Before the preview starts: not read, since it starts at the latest.
    let (before, _) = windowed::records(300, 1, 1_000);
    windowed::produce(&topic, &before);

    let command = format!(
        "{} preview {} --rows 1000000 --seconds 600 --interval 200ms",
        env!("CARGO_BIN_EXE_skein"),
        sql.display()
    );
    let mut child = Command::new("script")
        .args(["-q", "-f", "-e", "-c", &command, "/dev/null"])
        // Its own process group: the preview under the pty is stopped with it.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs the preview in a pty; scripts/setup.sh installs it");
    let rx = lines_of(&mut child);
    let mut seen = vec![];
    // The header: the columns, after the note that rows are taken back.
    loop {
        let line = next_line(&rx, 120, "header line", &seen);
        seen.push(line.clone());
        if line.trim() == "k | n" {
            break;
        }
    }
    // Records arrive while it runs, in two rounds: the second updates
    // every key the first made.
    let (records, _) = windowed::records(2_000, 1, 1_000);
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for round in records.chunks(1_000) {
        windowed::produce(&topic, round);
        for (_, json) in round {
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            *expected
                .entry(v["k"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // The printed changes add up to the counts, and some were taken back.
    let mut table: BTreeMap<String, i64> = BTreeMap::new();
    let mut taken_back = 0;
    let started = Instant::now();
    while table != expected {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the preview's table did not reach the counts in 180 s: {table:?} vs {expected:?}"
        );
        let line = next_line(&rx, 180, "row", &seen);
        seen.push(line.clone());
        let (kind, rest) = line.split_at(1.min(line.len()));
        let cells: Vec<&str> = rest.trim().split(" | ").collect();
        let [k, n] = cells.as_slice() else { continue };
        let n: i64 = match n.parse() {
            Ok(n) => n,
            Err(_) => continue,
        };
        match kind {
            "+" => {
                table.insert(k.to_string(), n);
            }
            "-" => {
                taken_back += 1;
                assert_eq!(
                    table.remove(*k),
                    Some(n),
                    "a retraction names the row shown"
                );
            }
            _ => {}
        }
    }
    assert!(
        taken_back > 0,
        "the second round took rows back:\n{}",
        seen.join("\n")
    );
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{}", child.id())])
        .status();
    let _ = common::wait_with_timeout(child, Duration::from_secs(30));
    assert!(
        windowed::kafka_rows(&sink_topic).is_empty(),
        "a preview writes nothing to the query's sink"
    );
    let _ = std::fs::remove_dir_all(&work);
}
