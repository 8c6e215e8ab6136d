//! The epoch loop every driver shares: decide an epoch before firing it,
//! commit it once every function has finished it, resume after the last
//! commit, forget what no restart needs. What differs between runtimes
//! (how an epoch is fired and waited for, how a failure is seen, whether
//! instances can be replaced) sits behind [`EpochRuntime`].

use std::collections::BTreeMap;
use std::time::Instant;

use crate::checkpoint::{Commit, EpochRecord};
use crate::error::{EngineError, Result};

mod epoch_log;
mod runtime;
mod stop;
mod window_clock;

use epoch_log::Ahead;
pub use epoch_log::EpochLog;
pub use runtime::{DrainCheck, EpochFire, EpochOutcome, EpochRuntime};
pub use stop::{
    STANDING_CHECKPOINT, StopAfter, StopHandle, StopSignal, Stopped, default_checkpoint_interval,
    stop_signal,
};

/// How often one epoch may fail and be run again (after replacing every
/// instance) before the run gives up: a failure that repeats is not a
/// recycled instance but a fault of the query or its input.
const TRIES_PER_EPOCH: u32 = 3;

/// What [`run_epochs`] did.
#[derive(Debug, Clone, Default)]
pub struct EpochsRun {
    /// The committed epoch the run resumed after, if any.
    pub resumed: Option<Commit>,
    /// Epochs this run took to its end (from the first after the resumed
    /// commit), each once however often it was run again.
    pub epochs: u64,
    /// Source records of those epochs, each epoch counted once.
    pub events: u64,
    /// Times every instance was replaced after a failed epoch.
    pub recoveries: u32,
    /// Why it stopped.
    pub stopped: Stopped,
}

/// Fire epochs until `stop`; the last epoch flushes all state, except
/// where a standing run is stopped ([`StopAfter::Signalled`]). With a
/// checkpoint store, a run resumes after the last commit, and a failed
/// epoch is run again from the last commit where the runtime can replace
/// its instances. `on_epoch(epoch, events so far)` follows progress.
pub async fn run_epochs(
    runtime: &dyn EpochRuntime,
    log: &EpochLog,
    stop: StopAfter,
    mut on_epoch: impl FnMut(u64, u64),
) -> Result<EpochsRun> {
    let start = Instant::now();
    let resumed = log.load(runtime).await?;
    let first_epoch = resumed.map_or(0, |c| c.epoch + 1);
    if let Some(c) = resumed {
        tracing::info!(epoch = c.epoch, "resuming after the last committed epoch");
    }
    // A bounded run that already reached its last epoch has nothing to do;
    // a larger --epochs goes on where it ended.
    if matches!((&stop, resumed), (StopAfter::Epochs(n), Some(c)) if c.epoch + 1 >= *n) {
        return Ok(EpochsRun {
            resumed,
            ..Default::default()
        });
    }
    let ahead = match &stop {
        StopAfter::Epochs(n) => Ahead::ToCheckpoint {
            last: Some(n.saturating_sub(1)),
        },
        StopAfter::Signalled { .. } => Ahead::ToCheckpoint { last: None },
        StopAfter::Duration { .. } | StopAfter::Drained { .. } => Ahead::OneEpoch,
    };
    let signal = stop.signal();
    let mut events: BTreeMap<u64, u64> = BTreeMap::new();
    let mut failures: BTreeMap<u64, u32> = BTreeMap::new();
    let mut recoveries = 0;
    let mut epoch = first_epoch;
    // The sources said they are drained (or finished): the next epoch
    // flushes the state, and takes what came since.
    let mut flush = false;
    // The last epoch this run committed.
    let mut committed: Option<u64> = None;
    // Event time as the last epoch saw it.
    let mut clocks = window_clock::EventClocks::default();
    loop {
        let stop_asked = signal.is_some_and(StopSignal::is_raised);
        // Stopped right after a commit: nothing to finish.
        if stop_asked && log.store.is_some() && committed.is_some_and(|c| c + 1 == epoch) {
            break;
        }
        let last = flush
            || match &stop {
                StopAfter::Epochs(n) => epoch + 1 >= *n,
                StopAfter::Duration { duration, .. } => start.elapsed() >= *duration,
                StopAfter::Drained { .. } => false,
                // Stopped with nothing to resume from: flush, as a bound would.
                StopAfter::Signalled { .. } => log.store.is_none() && stop_asked,
            };
        // A stop is answered by committing the next epoch, whatever the interval.
        let fire = log.decide(runtime, epoch, last, stop_asked, ahead).await?;
        let fired = Instant::now();
        let attempt = async {
            let outcome = runtime.run_epoch(fire).await?;
            let took = fired.elapsed();
            crate::metrics::epoch(took, outcome.events);
            log.ran(runtime, &outcome, fired).await;
            // Seen once the epoch has run: it ends the run, committed now.
            let stopping = signal.is_some_and(StopSignal::is_raised) && log.store.is_some();
            let record = EpochRecord {
                epoch,
                events: outcome.events,
                ms: took.as_millis() as u64,
            };
            log.commit(runtime, fire, ahead, stopping, record).await?;
            Ok::<_, EngineError>((outcome, stopping))
        };
        let (outcome, stopping) = match attempt.await {
            Ok(done) => done,
            Err(e) => {
                log.failed(epoch, &e).await;
                let tries = failures.entry(epoch).or_default();
                *tries += 1;
                // A run past its time bound ends with the failure.
                let past_bound = matches!(&stop,
                    StopAfter::Duration { duration, .. } if start.elapsed() >= *duration);
                if log.store.is_none()
                    || past_bound
                    || *tries >= TRIES_PER_EPOCH
                    || !runtime.replace_instances().await?
                {
                    return Err(e);
                }
                recoveries += 1;
                let back = log.committed().await?.map_or(first_epoch, |c| c.epoch + 1);
                tracing::warn!(epoch, error = %e, resume = back,
                    "epoch failed; every instance replaced, running again after the last commit");
                epoch = back;
                continue;
            }
        };
        if fire.checkpoint {
            committed = Some(epoch);
        }
        events.insert(epoch, outcome.events);
        on_epoch(epoch, events.values().sum());
        epoch += 1;
        if fire.last || (stopping && fire.checkpoint) {
            break;
        }
        if stopping {
            // Not a checkpoint: the next epoch is, and ends the run.
            continue;
        }
        let Some(interval) = stop.interval() else {
            continue;
        };
        flush |= match &stop {
            StopAfter::Drained { .. } => runtime.drained(epoch - 1, outcome).await?,
            // A standing query runs until it is stopped, however quiet.
            StopAfter::Signalled { .. } => false,
            _ => outcome.finished,
        };
        if flush {
            continue;
        }
        let mut wait = interval.saturating_sub(fired.elapsed());
        // A window due to end before the interval is up gets its epoch;
        // windows shorter than the interval do not make epochs more often.
        if let Some(step) = runtime.window_step_ms()
            && step as u128 > interval.as_millis()
        {
            let due = clocks.next_end(step, &outcome);
            if let Some(due) = due {
                wait = wait.min(due.saturating_sub(fired.elapsed()));
            }
        }
        match signal {
            Some(signal) => tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = signal.raised() => {}
            },
            None => tokio::time::sleep(wait).await,
        }
    }
    log.flush(runtime).await?;
    let stopped = if signal.is_some_and(StopSignal::is_raised) {
        tracing::info!(epoch = epoch - 1, "stopped on request");
        Stopped::Signal
    } else {
        Stopped::Bound
    };
    Ok(EpochsRun {
        resumed,
        epochs: epoch - first_epoch,
        events: events.values().sum(),
        recoveries,
        stopped,
    })
}

/// An error for an epoch some function did not finish.
pub fn not_committed(epoch: u64, why: impl std::fmt::Display) -> EngineError {
    EngineError::Incomplete(format!("epoch {epoch} is not committed: {why}"))
}
#[cfg(test)]
mod tests;
