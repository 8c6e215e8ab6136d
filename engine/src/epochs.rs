//! The epoch loop every driver shares: decide an epoch before firing it,
//! commit it once every function has finished it, resume after the last
//! commit, forget what no restart needs. What differs between runtimes
//! (how an epoch is fired and waited for, how a failure is seen, whether
//! instances can be replaced) sits behind [`EpochRuntime`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::watch;

use crate::checkpoint::{
    CheckpointFigures, CheckpointStore, Commit, EpochFigures, EpochPlan, Failure, Progress,
};
use crate::error::{EngineError, Result};
use crate::usage::Usage;

/// What the source instances said about one epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochOutcome {
    /// Records pulled, each source record once.
    pub events: u64,
    /// Every source partition reached the end it had when the run started.
    pub drained: bool,
    /// Every source is exhausted for good (bounded sources).
    pub finished: bool,
    /// Records the sources are behind their partitions' ends, where they
    /// can tell.
    pub lag: Option<u64>,
    /// The lowest watermark the sources sent, Unix ms.
    pub watermark_ms: Option<i64>,
}

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
    fn interval(&self) -> Option<Duration> {
        match self {
            StopAfter::Epochs(_) => None,
            StopAfter::Duration { interval, .. }
            | StopAfter::Drained { interval }
            | StopAfter::Signalled { interval, .. } => Some(*interval),
        }
    }

    fn signal(&self) -> Option<&StopSignal> {
        match self {
            StopAfter::Signalled { signal, .. } => Some(signal),
            _ => None,
        }
    }
}

/// Why a run stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
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

/// Decides when a [`StopAfter::Drained`] run has drained, in place of its
/// sources' flag: e.g. by comparing the committed offsets with ends that
/// move while the run goes on.
#[async_trait]
pub trait DrainCheck: Send {
    /// Whether the run has drained after `epoch`, given its outcome.
    async fn drained(&mut self, epoch: u64, outcome: EpochOutcome) -> Result<bool>;
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

    /// Whether a [`StopAfter::Drained`] run has drained after `epoch`
    /// (committed): by default what its sources said.
    async fn drained(&self, _epoch: u64, outcome: EpochOutcome) -> Result<bool> {
        Ok(outcome.drained)
    }

    /// What the functions used so far (running totals), as far as this
    /// runtime can see: recorded per epoch with the commits.
    async fn usage(&self) -> Usage {
        Usage::default()
    }

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
    /// The highest epoch with a decision in the store, once listed: later
    /// ones are new, and their decision is written without a read first.
    planned: tokio::sync::Mutex<Option<Option<u64>>>,
    /// What is recorded with the next commit.
    tracking: tokio::sync::Mutex<Tracking>,
}

/// The driver's progress between commits.
#[derive(Default)]
struct Tracking {
    progress: Progress,
    /// The runtime's usage when last looked at.
    usage: Usage,
    /// Objects and bytes written to the store (this handle and the
    /// functions) at the last commit.
    written_at_commit: (u64, u64),
    /// When the first epoch since the last commit was fired.
    fired: Option<Instant>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl EpochLog {
    /// `store`: none when the query does not checkpoint.
    pub fn new(store: Option<Arc<CheckpointStore>>, interval: u64) -> Self {
        EpochLog {
            store,
            interval: interval.max(1),
            planned: Default::default(),
            tracking: Default::default(),
        }
    }

    /// The last committed epoch, if any.
    pub async fn committed(&self) -> Result<Option<Commit>> {
        match &self.store {
            Some(cs) => cs.committed().await,
            None => Ok(None),
        }
    }

    /// The last committed epoch, taking the progress recorded with it to
    /// go on from.
    async fn resume(&self, runtime: &dyn EpochRuntime) -> Result<Option<Commit>> {
        let Some(cs) = &self.store else {
            return Ok(None);
        };
        let record = cs.commit_record().await?;
        let mut t = self.tracking.lock().await;
        t.usage = runtime.usage().await;
        t.written_at_commit = written(cs, &t.usage);
        if let Some(r) = &record {
            t.progress = r.progress.clone();
        }
        Ok(record.map(|r| r.commit))
    }

    /// Take what one epoch did into the progress.
    async fn ran(&self, runtime: &dyn EpochRuntime, outcome: &EpochOutcome, fired: Instant) {
        if self.store.is_none() {
            return;
        }
        let usage = runtime.usage().await;
        let mut t = self.tracking.lock().await;
        let used = usage.since(&t.usage);
        t.usage = usage;
        t.fired.get_or_insert(fired);
        t.progress.epoch(
            now_ms(),
            EpochFigures {
                events: outcome.events,
                took_ms: fired.elapsed().as_secs_f64() * 1000.0,
                lag: outcome.lag,
                watermark_ms: outcome.watermark_ms,
                usage: used,
            },
        );
    }

    /// Record a failed epoch (a failure to record it only costs the record).
    async fn failed(&self, epoch: u64, error: &EngineError) {
        let Some(cs) = &self.store else {
            return;
        };
        let failure = Failure {
            at_ms: now_ms(),
            epoch,
            message: crate::error::one_line(error),
        };
        if let Err(e) = cs.put_failure(&failure).await {
            tracing::warn!(error = %e, "recording a failed epoch");
        }
        self.tracking.lock().await.fired = None;
    }

    /// Whether `epoch` is the last: as decided the first time it fired.
    async fn decide(&self, epoch: u64, last: bool) -> Result<bool> {
        let Some(cs) = &self.store else {
            return Ok(last);
        };
        let mut planned = self.planned.lock().await;
        let highest = match *planned {
            Some(h) => h,
            None => *planned.insert(cs.last_planned_epoch().await?),
        };
        if highest.is_some_and(|h| epoch <= h)
            && let Some(plan) = cs.epoch_plan(epoch).await?
        {
            return Ok(plan.last);
        }
        cs.put_epoch_plan(epoch, EpochPlan { last }).await?;
        *planned = Some(highest.max(Some(epoch)));
        Ok(last)
    }

    /// Commit `epoch` if it is complete everywhere and the interval (or
    /// the end of the run, or a stop: `force`) says so; then drop what no
    /// restart needs.
    async fn commit(
        &self,
        runtime: &dyn EpochRuntime,
        epoch: u64,
        last: bool,
        force: bool,
    ) -> Result<()> {
        let Some(cs) = &self.store else {
            return Ok(());
        };
        if !(last || force || epoch.is_multiple_of(self.interval)) {
            return Ok(());
        }
        // An epoch that lost an invocation or left a member waiting is not
        // complete: it is run again after the last commit. Checked only
        // here: a member left waiting earlier is still waiting now.
        let started = std::time::Instant::now();
        runtime.check_complete(epoch).await?;
        {
            let mut t = self.tracking.lock().await;
            let now = written(cs, &t.usage);
            let fired = t.fired.take().unwrap_or(started);
            let figures = CheckpointFigures {
                epoch,
                at_ms: now_ms(),
                duration_ms: fired.elapsed().as_secs_f64() * 1000.0,
                bytes: now.1.saturating_sub(t.written_at_commit.1),
                requests: now.0.saturating_sub(t.written_at_commit.0),
            };
            t.progress.checkpoint(figures);
            t.written_at_commit = now;
            cs.commit_with(Commit { epoch, last }, &t.progress).await?;
        }
        cs.forget_before(epoch).await?;
        crate::metrics::commit(started.elapsed());
        runtime.committed(epoch).await;
        Ok(())
    }
}

/// Objects and bytes written to the store so far: through this handle
/// and, as the functions report them, through theirs.
fn written(cs: &CheckpointStore, usage: &Usage) -> (u64, u64) {
    (
        cs.puts() + usage.checkpoint_puts,
        cs.bytes_written() + usage.checkpoint_bytes,
    )
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
    let resumed = log.resume(runtime).await?;
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
    let signal = stop.signal();
    let mut events: BTreeMap<u64, u64> = BTreeMap::new();
    let mut failures: BTreeMap<u64, u32> = BTreeMap::new();
    let mut recoveries = 0;
    let mut epoch = first_epoch;
    // The sources said they are drained (or finished): the next epoch
    // flushes the state, and takes what came since.
    let mut flush = false;
    loop {
        let last = flush
            || match &stop {
                StopAfter::Epochs(n) => epoch + 1 >= *n,
                StopAfter::Duration { duration, .. } => start.elapsed() >= *duration,
                StopAfter::Drained { .. } => false,
                // Stopped with nothing to resume from: flush, as a bound would.
                StopAfter::Signalled { signal, .. } => log.store.is_none() && signal.is_raised(),
            };
        let last = log.decide(epoch, last).await?;
        let fired = Instant::now();
        let (outcome, stopping) = match run_and_commit(runtime, log, epoch, last, signal).await {
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
        crate::metrics::epoch(fired.elapsed(), outcome.events);
        events.insert(epoch, outcome.events);
        on_epoch(epoch, events.values().sum());
        epoch += 1;
        if last || (stopping && log.store.is_some()) {
            break;
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
        if flush || stopping {
            continue;
        }
        let wait = interval.saturating_sub(fired.elapsed());
        match signal {
            Some(signal) => tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = signal.raised() => {}
            },
            None => tokio::time::sleep(wait).await,
        }
    }
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

/// Run `epoch` and commit it when due. A stop asked for while it ran
/// (seen once it has run) ends the run with it, so it is committed now
/// whatever the interval; `true` in the answer says so.
async fn run_and_commit(
    runtime: &dyn EpochRuntime,
    log: &EpochLog,
    epoch: u64,
    last: bool,
    signal: Option<&StopSignal>,
) -> Result<(EpochOutcome, bool)> {
    let fired = Instant::now();
    let outcome = runtime.run_epoch(epoch, last).await?;
    log.ran(runtime, &outcome, fired).await;
    let stopping = signal.is_some_and(StopSignal::is_raised);
    log.commit(runtime, epoch, last, stopping).await?;
    Ok((outcome, stopping))
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
        /// Epochs fired as the last (flushing) one.
        flushed: Mutex<Vec<u64>>,
        /// Asks for a stop while this epoch runs.
        stop_during: Option<(u64, StopHandle)>,
    }

    #[async_trait]
    impl EpochRuntime for Scripted {
        async fn run_epoch(&self, epoch: u64, last: bool) -> Result<EpochOutcome> {
            self.ran.lock().unwrap().push(epoch);
            if last {
                self.flushed.lock().unwrap().push(epoch);
            }
            if let Some((at, handle)) = &self.stop_during
                && *at == epoch
            {
                handle.stop();
            }
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
        // The commit carries the progress: every epoch run (retries too),
        // and a checkpoint per commit; the failure is recorded apart.
        let progress = cs.commit_record().await.unwrap().unwrap().progress;
        assert_eq!((progress.totals.epochs, progress.totals.events), (8, 80));
        let committed: Vec<u64> = progress.checkpoints.iter().map(|c| c.epoch).collect();
        assert_eq!(committed, vec![0, 2, 4, 5]);
        assert!(progress.checkpoints.iter().all(|c| c.requests > 0));
        let failure = cs.failure().await.unwrap().unwrap();
        assert_eq!(failure.epoch, 4);
        assert!(failure.message.contains("a member waits"), "{failure:?}");
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

    fn standing(stop_at: u64) -> (Scripted, StopAfter) {
        let (handle, signal) = stop_signal();
        let rt = Scripted {
            stop_during: Some((stop_at, handle)),
            ..Default::default()
        };
        let interval = Duration::from_millis(1);
        (rt, StopAfter::Signalled { interval, signal })
    }

    #[tokio::test]
    async fn a_stopped_standing_run_commits_its_last_epoch_without_flushing() {
        let cs = store().await;
        let (rt, stop) = standing(3);
        // Commits every 5 epochs: the stop commits epoch 3 all the same.
        let log = EpochLog::new(Some(cs.clone()), 5);
        let run = run_epochs(&rt, &log, stop, |_, _| {}).await.unwrap();
        assert_eq!(*rt.ran.lock().unwrap(), vec![0, 1, 2, 3]);
        assert!(rt.flushed.lock().unwrap().is_empty(), "nothing flushed");
        assert_eq!((run.epochs, run.stopped), (4, Stopped::Signal));
        let commit = cs.committed().await.unwrap().unwrap();
        assert_eq!((commit.epoch, commit.last), (3, false));
        // A restart goes on after it until stopped again.
        let (rt, stop) = standing(5);
        let run = run_epochs(&rt, &log, stop, |_, _| {}).await.unwrap();
        assert_eq!(*rt.ran.lock().unwrap(), vec![4, 5]);
        assert_eq!(run.resumed.map(|c| c.epoch), Some(3));
    }

    #[tokio::test]
    async fn without_checkpoints_a_stopped_standing_run_flushes() {
        let (rt, stop) = standing(2);
        let run = run_epochs(&rt, &EpochLog::new(None, 1), stop, |_, _| {})
            .await
            .unwrap();
        assert_eq!(*rt.ran.lock().unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(*rt.flushed.lock().unwrap(), vec![3]);
        assert_eq!(run.stopped, Stopped::Signal);
    }

    #[tokio::test]
    async fn a_stop_between_epochs_does_not_wait_for_the_interval() {
        let (handle, signal) = stop_signal();
        let rt = Scripted::default();
        let stop = StopAfter::Signalled {
            interval: Duration::from_secs(600),
            signal,
        };
        let asked = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            handle.stop();
        });
        let log = EpochLog::new(Some(store().await), 1);
        let started = Instant::now();
        let run = run_epochs(&rt, &log, stop, |_, _| {}).await.unwrap();
        asked.await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(60));
        // Woken in the pause after epoch 0: one more epoch, committed.
        assert_eq!((run.epochs, run.stopped), (2, Stopped::Signal));
    }
}
