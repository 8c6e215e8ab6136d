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
    CheckpointFigures, CheckpointStore, Commit, Decided, EpochFigures, EpochRecord, Failure,
    Progress,
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

    /// Epochs between commits when none is given: every epoch for a
    /// bounded run; [`STANDING_CHECKPOINT`] of epochs for a standing one.
    pub fn default_checkpoint_interval(&self) -> u64 {
        match self {
            StopAfter::Signalled { interval, .. } => default_checkpoint_interval(true, *interval),
            _ => 1,
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

/// What the driver decided for one epoch it fires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochFire {
    /// The epoch.
    pub epoch: u64,
    /// The run's last epoch: every window is flushed.
    pub last: bool,
    /// The epoch will be committed: every stateful member keeps its state
    /// as of its end.
    pub checkpoint: bool,
    /// No earlier run can have fired it, so no source member has logged
    /// it: a source member need not look for its entry first.
    pub fresh: bool,
}

/// Where the functions run, as the epoch loop sees it.
#[async_trait]
pub trait EpochRuntime: Send + Sync {
    /// Fire every source member for an epoch and return once the epoch has
    /// run as far as it will (in-process: the runtime is idle; Lambda: the
    /// synchronous triggers returned).
    async fn run_epoch(&self, fire: EpochFire) -> Result<EpochOutcome>;

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

/// The driver's side of checkpoints: its decisions are written before an
/// epoch fires (a restart makes the same ones), and an epoch is committed
/// once every function has finished it. Decisions ride with commits where
/// they can, so a checkpoint costs the driver one write.
pub struct EpochLog {
    store: Option<Arc<CheckpointStore>>,
    interval: u64,
    state: tokio::sync::Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    /// Decisions known: read at the start or made since.
    decided: Vec<Decided>,
    /// Epochs at or below this may have fired before; none above has.
    fired: Option<u64>,
    /// A commit that goes out with the next decision (runs that decide
    /// one epoch at a time).
    pending: Option<Commit>,
    /// What the driver saw of the epochs since the last commit.
    records: Vec<EpochRecord>,
    /// The progress the commit object carries for `skein ui`.
    tracking: Tracking,
}

impl LogState {
    fn last_at(&self, epoch: u64) -> Option<bool> {
        self.decided.iter().rev().find_map(|d| d.last_at(epoch))
    }
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

/// How far ahead the driver decides.
#[derive(Debug, Clone, Copy)]
enum Ahead {
    /// Through the next checkpoint, at each commit: a run whose last epoch
    /// is known (`--epochs`) or which has none (a standing query).
    ToCheckpoint {
        /// The last epoch of a bounded run.
        last: Option<u64>,
    },
    /// One epoch at a time, before it fires: whether the next is the last
    /// depends on what this one finds (`--until-drained`, `--duration`).
    OneEpoch,
}

impl EpochLog {
    /// `store`: none when the query does not checkpoint; commits every
    /// `interval` epochs.
    pub fn new(store: Option<Arc<CheckpointStore>>, interval: u64) -> Self {
        EpochLog {
            store,
            interval: interval.max(1),
            state: Default::default(),
        }
    }

    /// The last committed epoch, if any.
    pub async fn committed(&self) -> Result<Option<Commit>> {
        match &self.store {
            Some(cs) => cs.committed().await,
            None => Ok(None),
        }
    }

    /// Read the last commit, the decisions after it and the progress
    /// recorded with it to go on from: a run starts here.
    async fn load(&self, runtime: &dyn EpochRuntime) -> Result<Option<Commit>> {
        let Some(cs) = &self.store else {
            return Ok(None);
        };
        let log = cs.driver_log().await?;
        let usage = runtime.usage().await;
        let mut state = self.state.lock().await;
        *state = LogState {
            fired: log.highest(),
            decided: log.decided,
            tracking: Tracking {
                progress: log.progress,
                written_at_commit: written(cs, &usage),
                usage,
                fired: None,
            },
            ..Default::default()
        };
        Ok(log.committed)
    }

    /// Take what one epoch did into the progress.
    async fn ran(&self, runtime: &dyn EpochRuntime, outcome: &EpochOutcome, fired: Instant) {
        if self.store.is_none() {
            return;
        }
        let usage = runtime.usage().await;
        let mut state = self.state.lock().await;
        let t = &mut state.tracking;
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

    /// The next checkpoint epoch at or after `epoch`.
    fn checkpoint_at_or_after(&self, epoch: u64) -> u64 {
        epoch.div_ceil(self.interval) * self.interval
    }

    /// Decisions from `from` through the next checkpoint (or the run's end).
    fn ahead_from(&self, from: u64, ahead: Ahead, last_wanted: bool) -> Decided {
        match ahead {
            Ahead::OneEpoch => Decided {
                from,
                through: from,
                last: last_wanted,
            },
            Ahead::ToCheckpoint { last } => {
                let through = self.checkpoint_at_or_after(from);
                let through = last.map_or(through, |l| through.min(l).max(from));
                Decided {
                    from,
                    through,
                    last: last_wanted || last == Some(through),
                }
            }
        }
    }

    /// What `epoch` is: as decided before (by this run or an earlier one),
    /// or decided now and written before it fires, with the commit waiting
    /// to go out, if any.
    async fn decide(
        &self,
        epoch: u64,
        last_wanted: bool,
        checkpoint_wanted: bool,
        ahead: Ahead,
    ) -> Result<EpochFire> {
        let Some(cs) = &self.store else {
            return Ok(EpochFire {
                epoch,
                last: last_wanted,
                checkpoint: false,
                fresh: true,
            });
        };
        let mut state = self.state.lock().await;
        let fresh = state.fired.is_none_or(|f| epoch > f);
        let last = match state.last_at(epoch) {
            Some(last) => last,
            None => {
                let decided = self.ahead_from(epoch, ahead, last_wanted);
                match state.pending.take() {
                    Some(commit) => write_commit(cs, &mut state, commit, Some(decided)).await?,
                    None => {
                        cs.decide(decided).await?;
                        state.decided.push(decided);
                    }
                }
                decided.last_at(epoch).unwrap_or(last_wanted)
            }
        };
        state.fired = Some(state.fired.map_or(epoch, |f| f.max(epoch)));
        Ok(EpochFire {
            epoch,
            last,
            checkpoint: last || checkpoint_wanted || epoch.is_multiple_of(self.interval),
            fresh,
        })
    }

    /// Commit `fire`'s epoch once it is complete everywhere: now, with the
    /// decisions through the next checkpoint, or (deciding one epoch at a
    /// time) with the next decision unless `now`. Then drop what no
    /// restart needs.
    async fn commit(
        &self,
        runtime: &dyn EpochRuntime,
        fire: EpochFire,
        ahead: Ahead,
        now: bool,
        record: EpochRecord,
    ) -> Result<()> {
        let Some(cs) = &self.store else {
            return Ok(());
        };
        let mut state = self.state.lock().await;
        state.records.push(record);
        if !fire.checkpoint {
            return Ok(());
        }
        // An epoch that lost an invocation or left a member waiting is not
        // complete: it is run again after the last commit. Checked only
        // here: a member left waiting earlier is still waiting now.
        let started = std::time::Instant::now();
        runtime.check_complete(fire.epoch).await?;
        state.tracking.checkpoint(cs, fire.epoch, started);
        let commit = Commit {
            epoch: fire.epoch,
            last: fire.last,
        };
        let decided = match ahead {
            _ if fire.last || now => None,
            Ahead::OneEpoch => {
                state.pending = Some(commit);
                return Ok(());
            }
            Ahead::ToCheckpoint { .. } => {
                let next = fire.epoch + 1;
                match state.last_at(next) {
                    // Decided already (a resumed run's earlier decisions).
                    Some(_) => None,
                    None => Some(self.ahead_from(next, ahead, false)),
                }
            }
        };
        write_commit(cs, &mut state, commit, decided).await?;
        drop(state);
        runtime.committed(fire.epoch).await;
        Ok(())
    }

    /// A commit waiting for the next decision goes out alone: the run ends.
    async fn flush(&self, runtime: &dyn EpochRuntime) -> Result<()> {
        let Some(cs) = &self.store else {
            return Ok(());
        };
        let mut state = self.state.lock().await;
        let Some(commit) = state.pending.take() else {
            return Ok(());
        };
        write_commit(cs, &mut state, commit, None).await?;
        drop(state);
        runtime.committed(commit.epoch).await;
        Ok(())
    }

    /// After a failed epoch: what was waiting to be committed is not.
    /// The failure is recorded for `skein ui` (a failure to record it only
    /// costs the record).
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
        let mut state = self.state.lock().await;
        state.pending = None;
        state.records.clear();
        state.tracking.fired = None;
    }
}

impl Tracking {
    /// Take the checkpoint of `epoch`, whose commit is about to go out.
    fn checkpoint(&mut self, cs: &CheckpointStore, epoch: u64, started: Instant) {
        let now = written(cs, &self.usage);
        let fired = self.fired.take().unwrap_or(started);
        self.progress.checkpoint(CheckpointFigures {
            epoch,
            at_ms: now_ms(),
            duration_ms: fired.elapsed().as_secs_f64() * 1000.0,
            bytes: now.1.saturating_sub(self.written_at_commit.1),
            requests: now.0.saturating_sub(self.written_at_commit.0),
        });
        self.written_at_commit = now;
    }
}

/// Write `commit` with `decided` (the decisions after it, if made now),
/// the records of the epochs since the last commit and the driver's
/// progress: one object. Then
/// drop what no restart needs, now and then.
async fn write_commit(
    cs: &CheckpointStore,
    state: &mut LogState,
    commit: Commit,
    decided: Option<Decided>,
) -> Result<()> {
    let started = std::time::Instant::now();
    let records = std::mem::take(&mut state.records);
    cs.commit(commit, decided, records, &state.tracking.progress)
        .await?;
    // Every path to a commit comes here: alone, with the next decisions, or
    // flushed at the end.
    crate::metrics::commit(started.elapsed());
    // Decisions of committed epochs are never asked again.
    state.decided.retain(|d| d.through > commit.epoch);
    state.decided.extend(decided);
    cs.forget_before(commit.epoch).await?;
    Ok(())
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
        let fire = log.decide(epoch, last, stop_asked, ahead).await?;
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
        let wait = interval.saturating_sub(fired.elapsed());
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
        /// Every epoch fired, as fired.
        fired: Mutex<Vec<EpochFire>>,
    }

    #[async_trait]
    impl EpochRuntime for Scripted {
        async fn run_epoch(&self, fire: EpochFire) -> Result<EpochOutcome> {
            let EpochFire { epoch, last, .. } = fire;
            self.ran.lock().unwrap().push(epoch);
            self.fired.lock().unwrap().push(fire);
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
        // Commits every 5 epochs: a stop during epoch 3 commits epoch 4.
        let log = EpochLog::new(Some(cs.clone()), 5);
        let run = run_epochs(&rt, &log, stop, |_, _| {}).await.unwrap();
        assert_eq!(*rt.ran.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        let checkpoints: Vec<bool> = rt
            .fired
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.checkpoint)
            .collect();
        assert_eq!(checkpoints, [true, false, false, false, true]);
        assert!(rt.flushed.lock().unwrap().is_empty(), "nothing flushed");
        assert_eq!((run.epochs, run.stopped), (5, Stopped::Signal));
        let commit = cs.committed().await.unwrap().unwrap();
        assert_eq!((commit.epoch, commit.last), (4, false));
        // A restart goes on after it until stopped again; epoch 5 is a
        // checkpoint of its own.
        let (rt, stop) = standing(5);
        let run = run_epochs(&rt, &log, stop, |_, _| {}).await.unwrap();
        assert_eq!(*rt.ran.lock().unwrap(), vec![5]);
        assert_eq!(run.resumed.map(|c| c.epoch), Some(4));
        assert!(
            rt.fired.lock().unwrap()[0].fresh,
            "nothing decided 5 before"
        );
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
        // Woken in the pause after epoch 0, which was committed: done.
        assert_eq!((run.epochs, run.stopped), (1, Stopped::Signal));
    }
}
