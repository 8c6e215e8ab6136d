//! Epoch markers: how the exactly-once sinks tell a new write from a replay.
//!
//! Each member of the last stage writes its epochs in order, one at a time,
//! and the engine replays epochs after a crash with identical input. So a
//! sink needs to remember only one number per (run, member): the last epoch
//! it committed, stored in the same atomic step as the rows (a Kafka
//! transaction, a Redis MULTI/EXEC). A write at or below that number is a
//! replay and writes nothing. Keying by member makes this hold at any group
//! size; keying by run keeps a fresh start of the same query from being
//! taken for a replay.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use skein_engine::sink::SinkWrite;

/// The run a sink keys a write's marker by. A write without a run (a caller
/// that keeps no lineage) counts as a fresh run of this sink instance:
/// replays within the instance are caught, a restart writes anew.
#[derive(Debug, Clone)]
pub struct Runs {
    fresh: String,
}

impl Runs {
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        Runs {
            fresh: format!(
                "fresh-{}-{nanos:x}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    pub fn of<'a>(&'a self, write: &'a SinkWrite<'_>) -> &'a str {
        if write.run.is_empty() {
            &self.fresh
        } else {
            write.run
        }
    }
}

impl Default for Runs {
    fn default() -> Self {
        Self::new()
    }
}

/// The name markers are kept under: the `checkpoint` option, else the query.
pub fn marker_name<'a>(checkpoint: Option<&'a str>, write: &'a SinkWrite<'_>) -> &'a str {
    checkpoint.filter(|c| !c.is_empty()).unwrap_or(write.query)
}

/// The marker's field within a name: `<run>/<member>`.
pub fn marker_field(run: &str, member: u32) -> String {
    format!("{run}/{member}")
}

/// The member a marker field belongs to, and its run.
pub fn parse_marker_field(field: &str) -> Option<(&str, u32)> {
    let (run, member) = field.rsplit_once('/')?;
    Some((run, member.parse().ok()?))
}

/// A write of `epoch` is a replay when the member already committed it or a
/// later epoch.
pub fn is_replay(committed: Option<u64>, epoch: u64) -> bool {
    committed.is_some_and(|last| epoch <= last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_replays_are_at_or_below_the_marker() {
        let f = marker_field("run/with/slashes", 7);
        assert_eq!(parse_marker_field(&f), Some(("run/with/slashes", 7)));
        assert_eq!(parse_marker_field("nomember"), None);
        assert!(!is_replay(None, 0));
        assert!(is_replay(Some(3), 3));
        assert!(is_replay(Some(3), 2));
        assert!(!is_replay(Some(3), 4));
        assert_ne!(Runs::new().fresh, Runs::new().fresh);
    }
}
