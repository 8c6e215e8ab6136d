//! How a query's sink is doing: the engine counts whole writes, and a sink
//! that retries an outage reports each failed attempt as it happens, so a
//! write stuck retrying shows in `skein status`, the metrics and the log
//! while it is stuck, not only once it gives up.
//!
//! The engine runs each sink write inside a [`WriteCall`] (a task-local): it
//! carries the sink's [`SinkHealth`] and, in a run with a time bound
//! (`--duration`), the instant the run must end. A sink reads them with
//! [`current_health`] and [`current_deadline`]; one that does not retry needs
//! neither, so the [`crate::sink::Sink`] trait stays as it is.
//!
//! The log says a sink is failing once per doubling of its failed attempts
//! (the 1st, 2nd, 4th, 8th, …), not at every attempt.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::sink::SinkConfig;

/// The option a sink table sets to wait out an outage for longer than the
/// run's bound (whole ms).
pub const RETRY_OPTION: &str = "retry.timeout.ms";

/// The wait before trying a failed sink write again, after `attempt`
/// failures: doubling from 100 ms to 3.2 s, so a short outage costs little
/// and a long one few attempts.
pub fn retry_step(attempt: u32) -> Duration {
    Duration::from_millis(100u64 << attempt.clamp(1, 6).saturating_sub(1))
}

/// What `skein status` shows of one sink member.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkHealthReport {
    /// The sink: its kind and location (`REDIS redis://host:port`).
    pub sink: String,
    /// Failed attempts since the last write that succeeded.
    pub consecutive_failures: u64,
    /// The last failure's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the first of the consecutive failures happened, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since_ms: Option<i64>,
    /// When a write last succeeded, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_ms: Option<i64>,
}

impl SinkHealthReport {
    /// Its last attempt failed.
    pub fn failing(&self) -> bool {
        self.consecutive_failures > 0
    }
}

/// One sink's health, shared by the engine and the sink (cheap to clone).
#[derive(Debug, Clone)]
pub struct SinkHealth {
    /// The sink's kind, the metrics' label.
    kind: Arc<str>,
    report: Arc<Mutex<(SinkHealthReport, u64)>>,
    /// When the failures in a row began (as `failing_since_ms`, but on the
    /// clock retries are timed by).
    since: Arc<Mutex<Option<Instant>>>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl SinkHealth {
    /// A sink that has written nothing yet and failed nothing.
    pub fn new(config: &SinkConfig) -> Self {
        // A Kafka table's location is a topic; its address is its brokers.
        let at = config
            .options
            .get("bootstrap.servers")
            .map_or(String::new(), |b| format!(" at {b}"));
        SinkHealth {
            kind: config.kind.to_ascii_lowercase().into(),
            report: Arc::new(Mutex::new((
                SinkHealthReport {
                    sink: format!(
                        "{} {}{at}",
                        config.kind.to_ascii_uppercase(),
                        config.location
                    ),
                    ..Default::default()
                },
                0,
            ))),
            since: Default::default(),
        }
    }

    /// One failed attempt; `retry_in` is the wait before the next, if the
    /// sink tries again. Logged on the 1st, 2nd, 4th, 8th, … in a row.
    pub fn failed(&self, error: &dyn std::fmt::Display, retry_in: Option<Duration>) {
        let (report, failures) = {
            let mut r = self.report.lock().expect("sink health");
            let (report, version) = &mut *r;
            report.consecutive_failures += 1;
            report.last_error = Some(error.to_string());
            report.failing_since_ms.get_or_insert_with(now_ms);
            self.since
                .lock()
                .expect("sink health")
                .get_or_insert_with(Instant::now);
            *version += 1;
            (report.clone(), report.consecutive_failures)
        };
        crate::metrics::sink_health(&self.kind, &report);
        if failures.is_power_of_two() {
            let since = report
                .failing_since_ms
                .map_or(0, |s| (now_ms() - s).max(0) / 1000);
            match retry_in {
                Some(wait) => tracing::warn!(
                    sink = %report.sink, failures, failing_for_s = since,
                    "sink is failing: {error}; retrying in {wait:?} (logged again at {} failures)",
                    failures * 2
                ),
                None => tracing::warn!(
                    sink = %report.sink, failures, failing_for_s = since,
                    "sink is failing: {error}"
                ),
            }
        }
    }

    /// A write went through: the failures in a row end.
    pub fn succeeded(&self) {
        let report = {
            let mut r = self.report.lock().expect("sink health");
            let (report, version) = &mut *r;
            if report.consecutive_failures > 0 {
                tracing::warn!(sink = %report.sink, failures = report.consecutive_failures,
                    "sink is writing again");
                // A healthy sink's successes change nothing worth saving.
                *version += 1;
            }
            report.consecutive_failures = 0;
            report.failing_since_ms = None;
            self.since.lock().expect("sink health").take();
            report.last_success_ms = Some(now_ms());
            report.clone()
        };
        crate::metrics::sink_health(&self.kind, &report);
    }

    /// What it says now.
    pub fn report(&self) -> SinkHealthReport {
        self.report.lock().expect("sink health").0.clone()
    }

    /// What it says now, with a number that changes with each failure and
    /// with the recovery after them (not with a healthy sink's successes),
    /// so the report is saved only when it says something new.
    pub fn versioned(&self) -> (SinkHealthReport, u64) {
        self.report.lock().expect("sink health").clone()
    }

    /// When the failures in a row began, if the sink is failing.
    pub fn failing_since(&self) -> Option<Instant> {
        *self.since.lock().expect("sink health")
    }

    /// The last failure's text, if any.
    pub fn last_error(&self) -> Option<String> {
        self.report
            .lock()
            .expect("sink health")
            .0
            .last_error
            .clone()
    }
}

/// What a run's bound means for its sink writes, shared by the runtime that
/// sets it and the function instances that read it at each write.
#[derive(Debug, Clone, Default)]
pub struct RunBound(Arc<Mutex<BoundNow>>);

/// See [`RunBound`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BoundNow {
    /// When the run must end, if it has a time bound (`--duration`).
    pub deadline: Option<Instant>,
    /// The engine tries a failed write again (until the deadline or the
    /// table's `retry.timeout.ms`, default [`DEFAULT_RETRY`]): a run that is
    /// not cut into a fixed count of epochs rides out an outage.
    pub retry_writes: bool,
}

/// How long a failed write is tried again when the table does not say.
pub const DEFAULT_RETRY: Duration = Duration::from_secs(120);

impl RunBound {
    /// The run going on from now.
    pub fn set(&self, now: BoundNow) {
        *self.0.lock().expect("run bound") = now;
    }

    /// What holds now.
    pub fn get(&self) -> BoundNow {
        *self.0.lock().expect("run bound")
    }
}

/// What the engine hands a sink beside a write.
#[derive(Debug, Clone)]
pub struct WriteCall {
    /// Where the sink reports failed attempts.
    pub health: SinkHealth,
    /// When the run must end, in a run with a time bound: a sink stops
    /// retrying there unless its table's `retry.timeout.ms` says to wait
    /// longer.
    pub deadline: Option<Instant>,
}

tokio::task_local! {
    static CALL: WriteCall;
}

/// Runs `write` (a sink's write) with `call` beside it.
pub async fn with_call<F: Future>(call: WriteCall, write: F) -> F::Output {
    CALL.scope(call, write).await
}

/// The health of the sink whose write is running, if the engine runs it.
pub fn current_health() -> Option<SinkHealth> {
    CALL.try_with(|c| c.health.clone()).ok()
}

/// When the run whose write is running must end, if it has a time bound.
pub fn current_deadline() -> Option<Instant> {
    CALL.try_with(|c| c.deadline).ok().flatten()
}

/// How long a sink that retries keeps going, from its first failure at
/// `first`: its own `retry` wait, cut at the run's `deadline` unless the
/// table set that wait itself (`explicit`). The answer's second part says
/// the deadline was cut short (the run's bound decides) — for the message.
pub fn give_up_at(
    first: Instant,
    retry: Duration,
    explicit: bool,
    deadline: Option<Instant>,
) -> (Instant, bool) {
    let own = first + retry;
    match deadline {
        Some(d) if d < own && !explicit => (d, true),
        _ => (own, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SinkConfig {
        SinkConfig {
            kind: "redis".into(),
            location: "redis://127.0.0.1:1".into(),
            options: Default::default(),
        }
    }

    #[test]
    fn failures_count_until_a_success() {
        let h = SinkHealth::new(&config());
        assert!(!h.report().failing());
        h.failed(&"refused", Some(Duration::from_millis(100)));
        h.failed(&"refused again", None);
        let r = h.report();
        assert_eq!(r.sink, "REDIS redis://127.0.0.1:1");
        assert_eq!(r.consecutive_failures, 2);
        assert_eq!(r.last_error.as_deref(), Some("refused again"));
        assert!(r.failing_since_ms.is_some() && r.last_success_ms.is_none());
        let (_, v) = h.versioned();
        h.succeeded();
        let (r, v2) = h.versioned();
        assert!(v2 > v && !r.failing() && r.failing_since_ms.is_none());
        assert!(r.last_success_ms.is_some());
        h.succeeded();
        assert_eq!(h.versioned().1, v2, "a healthy success is nothing new");
    }

    #[test]
    fn steps_double_to_a_bounded_wait() {
        let waits: Vec<u64> = (1..12).map(|a| retry_step(a).as_millis() as u64).collect();
        assert_eq!(&waits[..7], &[100, 200, 400, 800, 1600, 3200, 3200]);
        assert!(waits.iter().all(|w| *w <= 3200));
    }

    #[test]
    fn the_bound_cuts_the_wait_unless_the_table_set_it() {
        let t = Instant::now();
        let bound = Some(t + Duration::from_secs(10));
        let wait = Duration::from_secs(120);
        assert_eq!(
            give_up_at(t, wait, false, bound),
            (t + Duration::from_secs(10), true)
        );
        assert_eq!(give_up_at(t, wait, true, bound), (t + wait, false));
        assert_eq!(give_up_at(t, wait, false, None), (t + wait, false));
        let short = Duration::from_secs(2);
        assert_eq!(give_up_at(t, short, false, bound), (t + short, false));
    }

    #[tokio::test]
    async fn a_write_sees_its_call() {
        assert!(current_health().is_none());
        let h = SinkHealth::new(&config());
        let d = Instant::now();
        let call = WriteCall {
            health: h.clone(),
            deadline: Some(d),
        };
        let seen = with_call(call, async {
            (current_health().is_some(), current_deadline())
        })
        .await;
        assert_eq!(seen, (true, Some(d)));
    }
}
