//! Formats end to end on the real Kafka, with topics written by the Confluent
//! client serializers (confluent-kafka's AvroSerializer and
//! ProtobufSerializer, run by `confluent_produce.py` in the venv that
//! scripts/setup.sh makes), not by our encoder:
//! * NEXMark q0–q8 read from Avro and from Protobuf topics give the rows
//!   they give from the JSON topics the events came from (`nexmark.rs`);
//! * undecodable records go to the dead-letter topic with their reasons
//!   (`dead_letters.rs`);
//! * a schema that evolves mid-topic loses nothing, each record read by the
//!   id it carries; columns taken from the latest schema give older records
//!   the defaults of fields added later; an unknown id is a dead letter; a
//!   registry gone away shows in `skein status` (`evolution.rs`);
//! * the Avro records on a Kinesis stream add up to the JSON ones
//!   (`kinesis.rs`);
//! * a Debezium topic joined with a stream and aggregated gives the final
//!   table computed here from the same events (`debezium.rs`).
//!
//! No schema registry server could be installed here (docs/formats.md): the
//! serializers use confluent-kafka's in-memory registry, the tables read the
//! wire format with their schema inline (or, in `evolution.rs`, from the
//! schemas that registry assigned, served over HTTP by the test), and the
//! registry client is tested against recorded answers
//! (connectors/formats/src/registry_tests.rs).

#[path = "../common/mod.rs"]
mod common;

mod dead_letters;
mod debezium;
mod evolution;
mod kinesis;
mod nexmark;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::array_value_to_string;
use skein::run::{CommonRunArgs, run_report};

/// The Python of the venv scripts/setup.sh makes for these tests.
fn python() -> PathBuf {
    let cache = std::env::var_os("SKEIN_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/skein"));
    let python = cache.join("formats-venv/bin/python");
    assert!(
        python.exists(),
        "{} not found: run scripts/setup.sh (it makes the venv with confluent-kafka)",
        python.display()
    );
    python
}

/// Run `confluent_produce.py` with `args`, `stdin` as its input.
fn produce(args: &[&str], stdin: &str) {
    let script = common::repo_path("tests/formats/confluent_produce.py");
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run confluent_produce.py");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = common::wait_with_timeout(child, std::time::Duration::from_secs(300));
    assert!(
        out.status.success(),
        "confluent_produce.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory of the temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(common::unique_name(name));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Run `sql` in-process until the topics are drained; its final rows as
/// sorted lines of text.
fn final_rows(sql: &str, flags: &[&str]) -> Vec<String> {
    let mut all = vec!["--until-drained", "--json"];
    all.extend_from_slice(flags);
    let args = CommonRunArgs::from_flags(all).expect("run flags");
    let (report, _) = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(run_report(sql, &args, None))
        .unwrap_or_else(|e| panic!("{sql}\nfailed: {e:#}"));
    let mut rows = lines(&report.rows);
    rows.sort();
    rows
}

fn lines(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = vec![];
    for b in batches {
        for row in 0..b.num_rows() {
            let cells: Vec<String> = b
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, row).unwrap())
                .collect();
            out.push(cells.join(" | "));
        }
    }
    out
}
