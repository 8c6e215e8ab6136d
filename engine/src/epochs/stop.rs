//! When a run stops: its bound, or a signal for a standing query; and the
//! checkpoint interval that follows from it.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// When a run stops.
#[derive(Debug, Clone)]
pub enum StopAfter {
    /// A bounded run: the input is split into this many epochs.
    Epochs(u64),
    /// Fire an epoch every `interval` until `duration` has passed (or every
    /// source is exhausted for good), then one last epoch that flushes all
    /// state. A live source that is merely quiet does not end the run.
    Duration {
        /// How long the run fires epochs.
        duration: Duration,
        /// The time between epochs.
        interval: Duration,
    },
    /// Fire an epoch every `interval` until every source partition has
    /// reached the end it had when the run started, then one last epoch.
    Drained {
        /// The time between epochs.
        interval: Duration,
    },
    /// A standing query: fire an epoch every `interval` until `signal` is
    /// raised, then finish the epoch in flight and commit it without
    /// flushing open windows (a restart resumes them from the checkpoint).
    /// Without a checkpoint store nothing could resume them, so that epoch
    /// is the last and flushes, as at the end of a `Duration` run.
    Signalled {
        /// The time between epochs.
        interval: Duration,
        /// Raised to stop the query.
        signal: StopSignal,
    },
}

impl StopAfter {
    /// The epoch count of a bounded run (sources slice their input by it).
    pub fn bounded(&self) -> Option<u64> {
        match self {
            StopAfter::Epochs(n) => Some((*n).max(1)),
            _ => None,
        }
    }

    /// Time between epochs; none for a bounded run (back to back).
    pub(super) fn interval(&self) -> Option<Duration> {
        match self {
            StopAfter::Epochs(_) => None,
            StopAfter::Duration { interval, .. }
            | StopAfter::Drained { interval }
            | StopAfter::Signalled { interval, .. } => Some(*interval),
        }
    }

    /// Epochs between commits when none is given: every epoch for a
    /// bounded run; [`STANDING_CHECKPOINT`] of epochs for a standing one.
    pub fn default_checkpoint_interval(&self) -> u64 {
        match self {
            StopAfter::Signalled { interval, .. } => default_checkpoint_interval(true, *interval),
            _ => 1,
        }
    }

    pub(super) fn signal(&self) -> Option<&StopSignal> {
        match self {
            StopAfter::Signalled { signal, .. } => Some(signal),
            _ => None,
        }
    }
}

/// Why a run stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stopped {
    /// Its bound was reached (epochs, duration, drained or finished
    /// sources): the last epoch flushed all state.
    #[default]
    Bound,
    /// A stop was asked for ([`StopSignal`]).
    Signal,
}

/// Asks a standing run to stop; see [`StopAfter::Signalled`].
#[derive(Debug, Clone)]
pub struct StopHandle(Arc<watch::Sender<bool>>);

/// What the epoch loop watches for a request to stop.
#[derive(Debug, Clone)]
pub struct StopSignal(watch::Receiver<bool>);

/// A new stop request: the handle for whoever may ask (a signal handler,
/// a deadline), the signal for the run.
pub fn stop_signal() -> (StopHandle, StopSignal) {
    let (tx, rx) = watch::channel(false);
    (StopHandle(Arc::new(tx)), StopSignal(rx))
}

impl StopHandle {
    /// Raise the signal: the run stops after the epoch in flight.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

impl StopSignal {
    /// Whether the signal was raised.
    pub fn is_raised(&self) -> bool {
        *self.0.borrow()
    }

    /// Returns once a stop is asked for; never if every handle is gone.
    pub async fn raised(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|stop| *stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
/// The checkpoint interval of a query that runs until it is stopped, when
/// none is given: commits about every [`STANDING_CHECKPOINT`]. A commit
/// costs a write per stateful member and one for the driver, and a restart
/// runs again what came after the last one: at 1 s epochs, a commit every
/// 10 epochs makes checkpoints a tenth of the requests for at most 10 s of
/// input read again (sinks skip what they hold). A bounded run commits
/// every epoch.
pub const STANDING_CHECKPOINT: Duration = Duration::from_secs(10);

/// The default checkpoint interval, in epochs: every epoch for a bounded
/// run; [`STANDING_CHECKPOINT`] of epochs of `interval` for a standing one.
pub fn default_checkpoint_interval(standing: bool, interval: Duration) -> u64 {
    if !standing || interval.is_zero() {
        return 1;
    }
    (STANDING_CHECKPOINT.as_secs_f64() / interval.as_secs_f64())
        .round()
        .max(1.0) as u64
}
