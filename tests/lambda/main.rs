//! The Lambda backend on ministack, with the real `skein-function` binary
//! as every function's bootstrap:
//! * `skein deploy / run / status / destroy --backend lambda` (`backend.rs`);
//! * checkpoints on S3 through killed bootstraps (`checkpoints.rs`);
//! * `skein cost --backend lambda` (`cost.rs`);
//! * the embedded-metric-format lines in the functions' logs (`emf.rs`);
//! * Kinesis pushed by an event-source mapping (`push.rs`), into a tumbling
//!   aggregate (`push_windows.rs`);
//! * a standing query with no local process (`standing.rs`), whose groups
//!   size themselves with `--autoscale` (`autoscale.rs`).

#[path = "../common/mod.rs"]
mod common;

mod autoscale;
mod backend;
mod checkpoints;
mod cost;
mod emf;
mod push;
mod push_windows;
mod standing;

/// Polls `ready` every second for up to `secs`; fails the test naming
/// `what` if it never gives a value.
fn eventually<T>(secs: u64, what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let started = std::time::Instant::now();
    loop {
        if let Some(v) = ready() {
            return v;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(secs),
            "no {what} in {secs} s"
        );
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// `skein status CODE --backend lambda --json`: the query's status, typed,
/// and the whole object for what only Lambda adds (its schedule and lease,
/// an object of their own: src/status.rs).
fn lambda_status(
    store: &str,
    code: &str,
) -> (skein_engine::status::QueryStatus, serde_json::Value) {
    let out = common::skein_on_aws_ok(store, &["status", code, "--backend", "lambda", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("status --json");
    (common::typed(&v, &out), v)
}
