//! The driver's side of checkpoints: decisions before an epoch fires,
//! commits after every function has finished it.

use std::sync::Arc;
use std::time::Instant;

use super::runtime::{EpochFire, EpochOutcome, EpochRuntime};
use crate::checkpoint::{
    CheckpointFigures, CheckpointStore, Commit, Decided, EpochFigures, EpochRecord, Failure,
    Progress,
};
use crate::error::{EngineError, Result};
use crate::usage::Usage;

/// The driver's side of checkpoints: its decisions are written before an
/// epoch fires (a restart makes the same ones), and an epoch is committed
/// once every function has finished it. Decisions ride with commits where
/// they can, so a checkpoint costs the driver one write.
pub struct EpochLog {
    pub(super) store: Option<Arc<CheckpointStore>>,
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
    /// The last epoch committed (read at the start or written since).
    committed: Option<u64>,
    /// The progress the commit object carries for `skein ui`.
    tracking: Tracking,
    /// The group sizes the epochs since the last commit ran in.
    layout: crate::checkpoint::Layout,
    /// What the sources said of the last epoch run: a commit passes it to
    /// the runtime (`--autoscale` reads the lag from it).
    last_ran: EpochOutcome,
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
pub(super) enum Ahead {
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
    pub(super) async fn load(&self, runtime: &dyn EpochRuntime) -> Result<Option<Commit>> {
        let Some(cs) = &self.store else {
            return Ok(None);
        };
        let log = cs.driver_log().await?;
        let usage = runtime.usage().await;
        let mut state = self.state.lock().await;
        *state = LogState {
            fired: log.highest(),
            committed: log.committed.map(|c| c.epoch),
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
    pub(super) async fn ran(
        &self,
        runtime: &dyn EpochRuntime,
        outcome: &EpochOutcome,
        fired: Instant,
    ) {
        if self.store.is_none() {
            return;
        }
        let usage = runtime.usage().await;
        let mut state = self.state.lock().await;
        state.last_ran = *outcome;
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
                members: Some(runtime.layout().values().sum::<u32>()).filter(|m| *m > 0),
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
    pub(super) async fn decide(
        &self,
        runtime: &dyn EpochRuntime,
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
                committed: None,
            });
        };
        let mut state = self.state.lock().await;
        let fresh = state.fired.is_none_or(|f| epoch > f);
        let last = match state.last_at(epoch) {
            Some(last) => last,
            None => {
                let decided = self.ahead_from(epoch, ahead, last_wanted);
                match state.pending.take() {
                    Some(commit) => {
                        write_commit(cs, &mut state, commit, Some(decided)).await?;
                        // Nothing runs between the commit and this epoch:
                        // the runtime's moment to change a group's size.
                        runtime.committed(commit.epoch, &state.last_ran).await?;
                    }
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
            committed: state.committed,
        })
    }

    /// Commit `fire`'s epoch once it is complete everywhere: now, with the
    /// decisions through the next checkpoint, or (deciding one epoch at a
    /// time) with the next decision unless `now`. Then drop what no
    /// restart needs.
    pub(super) async fn commit(
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
        state.layout = runtime.layout();
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
        let last_ran = state.last_ran;
        drop(state);
        runtime.committed(fire.epoch, &last_ran).await?;
        Ok(())
    }

    /// A commit waiting for the next decision goes out alone: the run ends.
    pub(super) async fn flush(&self, runtime: &dyn EpochRuntime) -> Result<()> {
        let Some(cs) = &self.store else {
            return Ok(());
        };
        let mut state = self.state.lock().await;
        let Some(commit) = state.pending.take() else {
            return Ok(());
        };
        write_commit(cs, &mut state, commit, None).await?;
        let last_ran = state.last_ran;
        drop(state);
        runtime.committed(commit.epoch, &last_ran).await?;
        Ok(())
    }

    /// After a failed epoch: what was waiting to be committed is not.
    /// The failure is recorded for `skein ui` (a failure to record it only
    /// costs the record).
    pub(super) async fn failed(&self, epoch: u64, error: &EngineError) {
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
    cs.commit_in(
        commit,
        decided,
        records,
        &state.tracking.progress,
        &state.layout,
    )
    .await?;
    // Every path to a commit comes here: alone, with the next decisions, or
    // flushed at the end.
    crate::metrics::commit(started.elapsed());
    // Decisions of committed epochs are never asked again.
    state.decided.retain(|d| d.through > commit.epoch);
    state.decided.extend(decided);
    state.committed = Some(commit.epoch);
    cs.forget_before(commit.epoch, &state.layout).await?;
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
