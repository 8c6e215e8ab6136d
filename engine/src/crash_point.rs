//! A deliberate crash at the moment exactly once is hardest to keep, for the
//! tests that prove it: `SKEIN_CRASH_AFTER_SINK_WRITE=<epoch>` aborts the
//! process right after a sink has written rows of that epoch or a later one,
//! before the epoch can commit. The restart writes the epoch again, and only
//! the sink's replay detection keeps its rows from doubling. Random kills
//! rarely land in that gap; this one always does.

use std::sync::OnceLock;

/// The variable that arms the crash.
pub const CRASH_AFTER_SINK_WRITE: &str = "SKEIN_CRASH_AFTER_SINK_WRITE";

fn armed_at() -> Option<u64> {
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    *AT.get_or_init(|| {
        let value = std::env::var(CRASH_AFTER_SINK_WRITE).ok()?;
        match value.trim().parse() {
            Ok(epoch) => Some(epoch),
            Err(_) => {
                tracing::warn!("{CRASH_AFTER_SINK_WRITE}={value:?} is no epoch number; ignored");
                None
            }
        }
    })
}

/// Called after a sink wrote `rows` rows of `epoch` successfully.
pub fn after_sink_write(epoch: u64, rows: usize) {
    if rows > 0 && armed_at().is_some_and(|at| epoch >= at) {
        eprintln!(
            "skein: {CRASH_AFTER_SINK_WRITE}: crashing after the sink wrote {rows} rows of \
             epoch {epoch}, before it commits"
        );
        std::process::abort();
    }
}
