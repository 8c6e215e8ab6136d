//! The epoch loop every driver shares: decide an epoch before firing it,
//! commit it once every function has finished it, resume after the last
//! commit, forget what no restart needs. What differs between runtimes
//! (how an epoch is fired and waited for, how a failure is seen, whether
//! instances can be replaced) sits behind [`EpochRuntime`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::checkpoint::{CheckpointStore, Commit, EpochPlan};
use crate::error::{EngineError, Result};

/// What the source instances said about one epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochOutcome {
    /// Records pulled, each source record once.
    pub events: u64,
    /// Every source partition reached the end it had when the run started.
    pub drained: bool,
    /// Every source is exhausted for good (bounded sources).
    pub finished: bool,
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopAfter {
    /// A bounded run: the input is split into this many epochs.
    Epochs(u64),
    /// Fire an epoch every `interval` until `duration` has passed (or every
    /// source is exhausted for good), then one last epoch that flushes all
    /// state. A live source that is merely quiet does not end the run.
    Duration {
        duration: Duration,
        interval: Duration,
    },
    /// Fire an epoch every `interval` until every source partition has
    /// reached the end it had when the run started, then one last epoch.
    Drained { interval: Duration },
}

impl StopAfter {
    /// The epoch count of a bounded run (sources slice their input by it).
    pub fn bounded(self) -> Option<u64> {
        match self {
            StopAfter::Epochs(n) => Some(n.max(1)),
            StopAfter::Duration { .. } | StopAfter::Drained { .. } => None,
        }
    }
}

/// Where the functions run, as the epoch loop sees it.
#[async_trait]
pub trait EpochRuntime: Send + Sync {
    /// Fire every source member for `epoch` and return once the epoch has
    /// run as far as it will (in-process: the runtime is idle; Lambda: the
    /// synchronous triggers returned).
    async fn run_epoch(&self, epoch: u64, last: bool) -> Result<EpochOutcome>;

    /// Fail unless every function has finished `epoch`: no invocation
    /// failed and nobody waits for input.
    async fn check_complete(&self, epoch: u64) -> Result<()>;

    /// After `epoch` was committed.
    async fn committed(&self, _epoch: u64) {}

    /// After a failed epoch: replace every function instance, so that all
    /// start again from the last commit. `false`: this runtime cannot, and
    /// the run fails (a restart resumes after the last commit).
    async fn replace_instances(&self) -> Result<bool> {
        Ok(false)
    }
}

/// The driver's side of checkpoints: its decisions are written before an
/// epoch fires (a restart makes the same ones), and an epoch is committed
/// once every function has finished it.
pub struct EpochLog {
    store: Option<Arc<CheckpointStore>>,
    interval: u64,
}

impl EpochLog {
    /// `store`: none when the query does not checkpoint.
    pub fn new(store: Option<Arc<CheckpointStore>>, interval: u64) -> Self {
        EpochLog {
            store,
            interval: interval.max(1),
        }
    }

    /// The last committed epoch, if any.
    pub async fn committed(&self) -> Result<Option<Commit>> {
        match &self.store {
            Some(cs) => cs.committed().await,
            None => Ok(None),
        }
    }

    /// Whether `epoch` is the last: as decided the first time it fired.
    async fn decide(&self, epoch: u64, last: bool) -> Result<bool> {
        let Some(cs) = &self.store else {
            return Ok(last);
        };
        match cs.epoch_plan(epoch).await? {
            Some(plan) => Ok(plan.last),
            None => {
                cs.put_epoch_plan(epoch, EpochPlan { last }).await?;
                Ok(last)
            }
        }
    }

    /// Commit `epoch` if it is complete everywhere and the interval (or
    /// the end of the run) says so; then drop what no restart needs.
    async fn commit(&self, runtime: &dyn EpochRuntime, epoch: u64, last: bool) -> Result<()> {
        let Some(cs) = &self.store else {
            return Ok(());
        };
        if !(last || epoch.is_multiple_of(self.interval)) {
            return Ok(());
        }
        // An epoch that lost an invocation or left a member waiting is not
        // complete: it is run again after the last commit. Checked only
        // here: a member left waiting earlier is still waiting now.
        runtime.check_complete(epoch).await?;
        cs.commit(Commit { epoch, last }).await?;
        cs.forget_before(epoch).await?;
        runtime.committed(epoch).await;
        Ok(())
    }
}

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
}

/// Fire epochs until `stop`; the last epoch flushes all state. With a
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
    let resumed = log.committed().await?;
    let first_epoch = resumed.map_or(0, |c| c.epoch + 1);
    if let Some(c) = resumed {
        tracing::info!(epoch = c.epoch, "resuming after the last committed epoch");
    }
    // A bounded run that already reached its last epoch has nothing to do;
    // a larger --epochs goes on where it ended.
    if matches!((stop, resumed), (StopAfter::Epochs(n), Some(c)) if c.epoch + 1 >= n) {
        return Ok(EpochsRun {
            resumed,
            ..Default::default()
        });
    }
    let mut events: BTreeMap<u64, u64> = BTreeMap::new();
    let mut failures: BTreeMap<u64, u32> = BTreeMap::new();
    let mut recoveries = 0;
    let mut epoch = first_epoch;
    // The sources said they are drained (or finished): the next epoch
    // flushes the state, and takes what came since.
    let mut flush = false;
    loop {
        let last = flush
            || match stop {
                StopAfter::Epochs(n) => epoch + 1 >= n,
                StopAfter::Duration { duration, .. } => start.elapsed() >= duration,
                StopAfter::Drained { .. } => false,
            };
        let last = log.decide(epoch, last).await?;
        let fired = Instant::now();
        let outcome = match run_and_commit(runtime, log, epoch, last).await {
            Ok(outcome) => outcome,
            Err(e) => {
                let tries = failures.entry(epoch).or_default();
                *tries += 1;
                if log.store.is_none()
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
        crate::metrics::epoch(fired.elapsed(), outcome.events);
        events.insert(epoch, outcome.events);
        on_epoch(epoch, events.values().sum());
        epoch += 1;
        if last {
            break;
        }
        let interval = match stop {
            StopAfter::Epochs(_) => continue,
            StopAfter::Duration { interval, .. } | StopAfter::Drained { interval } => interval,
        };
        flush |= match stop {
            StopAfter::Drained { .. } => outcome.drained,
            _ => outcome.finished,
        };
        if !flush {
            tokio::time::sleep(interval.saturating_sub(fired.elapsed())).await;
        }
    }
    Ok(EpochsRun {
        resumed,
        epochs: epoch - first_epoch,
        events: events.values().sum(),
        recoveries,
    })
}

async fn run_and_commit(
    runtime: &dyn EpochRuntime,
    log: &EpochLog,
    epoch: u64,
    last: bool,
) -> Result<EpochOutcome> {
    let outcome = runtime.run_epoch(epoch, last).await?;
    log.commit(runtime, epoch, last).await?;
    Ok(outcome)
}

/// An error for an epoch some function did not finish.
pub fn not_committed(epoch: u64, why: impl std::fmt::Display) -> EngineError {
    EngineError::Incomplete(format!("epoch {epoch} is not committed: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStore;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use std::sync::Mutex;

    /// A runtime that fails chosen epochs once and records what it ran.
    #[derive(Default)]
    struct Scripted {
        fail_once: Mutex<Vec<u64>>,
        ran: Mutex<Vec<u64>>,
        replaced: Mutex<u32>,
    }

    #[async_trait]
    impl EpochRuntime for Scripted {
        async fn run_epoch(&self, epoch: u64, _last: bool) -> Result<EpochOutcome> {
            self.ran.lock().unwrap().push(epoch);
            Ok(EpochOutcome {
                events: 10,
                ..Default::default()
            })
        }
        async fn check_complete(&self, epoch: u64) -> Result<()> {
            let mut fail = self.fail_once.lock().unwrap();
            match fail.iter().position(|e| *e == epoch) {
                Some(i) => {
                    fail.remove(i);
                    Err(not_committed(epoch, "a member waits"))
                }
                None => Ok(()),
            }
        }
        async fn replace_instances(&self) -> Result<bool> {
            *self.replaced.lock().unwrap() += 1;
            Ok(true)
        }
    }

    async fn store() -> Arc<CheckpointStore> {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        Arc::new(
            CheckpointStore::open(store, Path::from("q"), "abc")
                .await
                .unwrap(),
        )
    }

    #[tokio::test]
    async fn a_failed_epoch_runs_again_from_the_last_commit() {
        let cs = store().await;
        let rt = Scripted {
            fail_once: Mutex::new(vec![4]),
            ..Default::default()
        };
        let log = EpochLog::new(Some(cs.clone()), 2);
        let run = run_epochs(&rt, &log, StopAfter::Epochs(6), |_, _| {})
            .await
            .unwrap();
        // Epoch 4 was not complete at its commit: 3 and 4 run again after
        // the commit of 2.
        assert_eq!(*rt.ran.lock().unwrap(), vec![0, 1, 2, 3, 4, 3, 4, 5]);
        assert_eq!((run.epochs, run.events, run.recoveries), (6, 60, 1));
        assert_eq!(cs.committed().await.unwrap().unwrap().epoch, 5);
        // A second run of the same bounded query has nothing to do.
        let again = run_epochs(&rt, &log, StopAfter::Epochs(6), |_, _| {})
            .await
            .unwrap();
        assert_eq!((again.epochs, again.resumed.map(|c| c.epoch)), (0, Some(5)));
    }

    #[tokio::test]
    async fn an_epoch_that_keeps_failing_ends_the_run() {
        let rt = Scripted {
            fail_once: Mutex::new(vec![1; TRIES_PER_EPOCH as usize]),
            ..Default::default()
        };
        let log = EpochLog::new(Some(store().await), 1);
        let err = run_epochs(&rt, &log, StopAfter::Epochs(4), |_, _| {})
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("epoch 1 is not committed"), "{err}");
        assert_eq!(*rt.replaced.lock().unwrap(), TRIES_PER_EPOCH - 1);
    }

    #[tokio::test]
    async fn without_checkpoints_a_failure_is_not_retried() {
        let rt = Scripted {
            fail_once: Mutex::new(vec![0]),
            ..Default::default()
        };
        // Without a store nothing is checked, so nothing fails either.
        let log = EpochLog::new(None, 1);
        let run = run_epochs(&rt, &log, StopAfter::Epochs(2), |_, _| {})
            .await
            .unwrap();
        assert_eq!((run.epochs, *rt.replaced.lock().unwrap()), (2, 0));
    }
}
