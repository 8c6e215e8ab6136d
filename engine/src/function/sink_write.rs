//! A sink stage's write, watched: the sink's health is counted and saved for
//! `skein status` while the write runs (a write stuck retrying an outage
//! shows as failing before it gives up); a failed write is tried again where
//! the run rides out outages ([`BoundNow::retry_writes`]: every run but one
//! cut into a fixed count of epochs; a retry is safe, the sinks being
//! idempotent per epoch); and in a run with a time bound the write ends at
//! most one retry step ([`past_the_bound`]) after it, whatever the sink does, unless the
//! table's `retry.timeout.ms` says to wait longer.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::StageFunction;
use crate::error::{EngineError, Result};
use crate::sink::{Sink, SinkConfig};
use crate::sink_health::{
    BoundNow, DEFAULT_RETRY, RETRY_OPTION, SinkHealth, WriteCall, give_up_at, retry_step, with_call,
};

/// How far past the run's bound a write may go on: one retry step, the
/// longest [`retry_step`].
pub fn past_the_bound() -> Duration {
    retry_step(u32::MAX)
}

/// How often a stuck write's health is saved.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// A sink stage's sink and what is known of its health.
pub(super) struct SinkOutput {
    pub(super) sink: Arc<dyn Sink>,
    health: SinkHealth,
    /// The table's `retry.timeout.ms`: how long a failing write is tried
    /// again, even past the run's bound.
    own_wait: Option<Duration>,
    /// The health version last saved to the checkpoint store.
    saved: AtomicU64,
}

impl SinkOutput {
    pub(super) fn new(sink: Arc<dyn Sink>, config: &SinkConfig) -> Self {
        SinkOutput {
            sink,
            health: SinkHealth::new(config),
            own_wait: config
                .options
                .get(RETRY_OPTION)
                .and_then(|ms| ms.trim().parse().ok())
                .map(Duration::from_millis),
            saved: AtomicU64::new(0),
        }
    }
}

impl StageFunction {
    /// Runs the sink's write of one epoch (`write` makes each attempt),
    /// watched and tried again as the module says.
    pub(super) async fn watched_sink_write<F: Future<Output = Result<()>>>(
        &self,
        out: &SinkOutput,
        mut write: impl FnMut() -> F,
    ) -> Result<()> {
        let bound: BoundNow = self.env.bound.get();
        let cut_at = bound
            .deadline
            .filter(|_| out.own_wait.is_none())
            .map(|d| tokio::time::Instant::from_std(d + past_the_bound()));
        let mut failures = 0u32;
        // With the table's own wait, the bound passing is only said, once.
        let mut say_at = bound
            .deadline
            .filter(|_| cut_at.is_none())
            .map(tokio::time::Instant::from_std);
        let mut give_up: Option<(Instant, bool)> = None;
        let result = loop {
            let before = out.health.versioned().1;
            let e = match self
                .one_sink_attempt(out, bound, cut_at, &mut say_at, write())
                .await
            {
                Ok(()) => break Ok(()),
                Err(e) => e,
            };
            let reported = out.health.versioned().1 != before;
            if !bound.retry_writes {
                if !reported {
                    out.health.failed(&e, None);
                }
                break Err(e);
            }
            let (at, _) = *give_up.get_or_insert_with(|| {
                give_up_at(
                    // The sink's own retries of this write count too.
                    out.health.failing_since().unwrap_or_else(Instant::now),
                    out.own_wait.unwrap_or(DEFAULT_RETRY),
                    out.own_wait.is_some(),
                    bound.deadline,
                )
            });
            let now = Instant::now();
            if now >= at {
                if !reported {
                    out.health.failed(&e, None);
                }
                break Err(gave_up(out, failures + 1, e));
            }
            failures += 1;
            let wait = retry_step(failures).min(at - now);
            if !reported {
                out.health.failed(&e, Some(wait));
            }
            self.save_sink_health(out).await;
            tokio::time::sleep(wait).await;
        };
        if result.is_ok() {
            out.health.succeeded();
        }
        self.save_sink_health(out).await;
        result
    }

    /// One attempt: the sink's write with its [`WriteCall`] beside it, the
    /// health saved each second while it runs, cut at `cut_at`; a failing
    /// sink still trying at `say_at` is said to wait past the bound.
    async fn one_sink_attempt(
        &self,
        out: &SinkOutput,
        bound: BoundNow,
        cut_at: Option<tokio::time::Instant>,
        say_at: &mut Option<tokio::time::Instant>,
        write: impl Future<Output = Result<()>>,
    ) -> Result<()> {
        let call = WriteCall {
            health: out.health.clone(),
            deadline: bound.deadline,
        };
        let write = with_call(call, write);
        tokio::pin!(write);
        let mut save =
            tokio::time::interval_at(tokio::time::Instant::now() + SAVE_EVERY, SAVE_EVERY);
        loop {
            tokio::select! {
                r = &mut write => return r,
                _ = save.tick() => self.save_sink_health(out).await,
                () = sleep_until(cut_at) => return Err(self.past_the_bound(out)),
                () = sleep_until(*say_at) => {
                    *say_at = None;
                    if out.health.report().failing() {
                        tracing::warn!(sink = %out.health.report().sink,
                            "the run's bound has passed; the sink keeps trying for up to \
                             {RETRY_OPTION} = {} ms, as its table says",
                            out.own_wait.unwrap_or_default().as_millis());
                    }
                }
            }
        }
    }

    fn past_the_bound(&self, out: &SinkOutput) -> EngineError {
        let report = out.health.report();
        let last = report
            .last_error
            .unwrap_or_else(|| "none reported (the write was still waiting)".into());
        EngineError::sink_failed(
            report.sink,
            format!(
                "no write got through by the run's bound (+{:?}); \
                 last error: {last} (set '{RETRY_OPTION}' on the table to wait longer)",
                past_the_bound()
            ),
        )
    }

    /// Save the sink's health if it changed since the last save. A failure
    /// only costs the status a line, so it does not fail the write.
    async fn save_sink_health(&self, out: &SinkOutput) {
        let Some(cs) = &self.env.checkpoints else {
            return;
        };
        let (report, version) = out.health.versioned();
        if out.saved.load(Ordering::Relaxed) == version {
            return;
        }
        match cs
            .put_sink_health(self.ctx.stage, self.ctx.member, &report)
            .await
        {
            Ok(()) => out.saved.store(version, Ordering::Relaxed),
            Err(e) => tracing::warn!(stage = %self.name, error = %e, "writing the sink's health"),
        }
    }
}

/// The error a write that was tried again ends with: the sink's own, when
/// it already says what the last error was, else the sink, how often it
/// failed and the last error.
fn gave_up(out: &SinkOutput, attempts: u32, e: EngineError) -> EngineError {
    let text = crate::error::one_line(&e);
    if text.contains("last error") {
        return e;
    }
    EngineError::sink_failed(
        out.health.report().sink,
        format!("gave up after {attempts} attempts; last error: {text}"),
    )
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
