//! The SQL conformance corpus (tests/sql/*.slt, the format in
//! tests/sql/README.md): every case of every file, against a real Kafka
//! broker, with its input in one epoch, split over many epochs, and through
//! a SIGKILL and a restart. The answers are in the files, computed without
//! the engine.

#[path = "../common/mod.rs"]
mod common;

mod changes;
mod db;
mod output;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use db::{SkeinDb, Tally, Variant};

/// Files run at once: each waits on Kafka and on its runs' epochs more
/// than it computes.
const FILES_AT_ONCE: usize = 7;

fn corpus() -> Vec<PathBuf> {
    let dir = common::repo_path("tests/sql");
    let only = std::env::var("SKEIN_SLT").ok();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/sql")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .filter(|p| {
            only.as_deref().is_none_or(|o| {
                p.file_stem()
                    .is_some_and(|s| o.split(',').any(|w| s.to_string_lossy() == w))
            })
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt file in {}", dir.display());
    files
}

/// Rows compared as multisets, whitespace collapsed.
fn same_rows(
    normalize: sqllogictest::Normalizer,
    actual: &[Vec<String>],
    expected: &[String],
) -> bool {
    let mut got: Vec<String> = actual.iter().map(|r| normalize(&r.join(" "))).collect();
    let mut want: Vec<String> = expected.iter().map(normalize).collect();
    got.sort();
    want.sort();
    got == want
}

/// Every file in `variant`; fails naming every case that failed.
fn run_corpus(variant: Variant) -> Tally {
    common::require_kafka();
    let files = corpus();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let queue = Arc::new(Mutex::new(files.clone()));
    let failures = Arc::new(Mutex::new(vec![]));
    std::thread::scope(|scope| {
        for _ in 0..FILES_AT_ONCE.min(files.len()) {
            let (queue, failures, tally) = (queue.clone(), failures.clone(), tally.clone());
            scope.spawn(move || {
                while let Some(path) = queue.lock().unwrap().pop() {
                    let stem = path.file_stem().unwrap().to_string_lossy().to_string();
                    let t = tally.clone();
                    let mut runner = sqllogictest::Runner::new(move || {
                        let db = SkeinDb::new(&stem, variant, t.clone());
                        async move { Ok(db) }
                    });
                    runner.with_validator(same_rows);
                    // Every case runs: a failure does not hide the next.
                    let records = match sqllogictest::parse_file(&path) {
                        Ok(r) => r,
                        Err(e) => {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{}: {e}", path.display()));
                            continue;
                        }
                    };
                    for record in records {
                        if let Err(e) = runner.run(record) {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("({}) {e}", variant.name()));
                        }
                    }
                }
            });
        }
    });
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} cases of {} files failed in the {} variant:\n{}",
        failures.len(),
        files.len(),
        variant.name(),
        failures.join("\n\n")
    );
    *tally.lock().unwrap()
}

#[test]
fn every_case_in_one_epoch() {
    let t = run_corpus(Variant::OneEpoch);
    eprintln!("{} queries, one epoch each", t.queries);
}

#[test]
fn every_case_split_over_epochs() {
    let t = run_corpus(Variant::Split);
    eprintln!("{} queries, two records per pull", t.queries);
}

#[test]
fn every_case_through_a_sigkill() {
    let t = run_corpus(Variant::Killed);
    // Most runs are long enough to be killed after a commit; a tiny input
    // may end first, so not every one.
    assert!(
        t.kills * 2 >= t.queries,
        "only {} of {} runs were killed mid-run",
        t.kills,
        t.queries
    );
}
