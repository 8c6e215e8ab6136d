//! A source member's offsets log: where a cold member stands (where the
//! log says the previous epoch ended), which epoch is read again exactly
//! as it was, and the entry an epoch writes before anything leaves.

use std::time::Instant;

use super::StageFunction;
use super::source_stage::{PulledState, SourceStage};
use crate::checkpoint::{CheckpointStore, MemberObject, OffsetsEntry};
use crate::error::{EngineError, Result};
use crate::request::Trigger;
use crate::source::{EpochSpec, ReplayMode};

impl SourceStage {
    /// With checkpoints: a cold instance stands where the log says the
    /// previous epoch ended, and an epoch already in the log is read again
    /// exactly as it was (an epoch the driver never fired before cannot be
    /// in it). The entry of an epoch read again.
    pub(super) async fn resume(
        &self,
        f: &StageFunction,
        cs: &CheckpointStore,
        state: &mut PulledState,
        spec: EpochSpec,
        t: &Trigger,
    ) -> Result<Option<OffsetsEntry>> {
        if !state.restored {
            self.stand_where_the_log_ends(f, cs, state, spec, t.committed)
                .await?;
            state.restored = true;
        }
        state.kept.committed(t.committed);
        if t.fresh {
            return Ok(None);
        }
        let mut logged = match state.kept.get(t.epoch) {
            Some(entry) => Some(entry.clone()),
            None => cs.offsets(f.ctx.stage, f.ctx.member, t.epoch).await?,
        };
        if logged.is_none() && !state.kept.taken_in() {
            self.take_in_notes(f, cs, &mut state.kept, spec, t.committed)
                .await?;
            logged = state.kept.get(t.epoch).cloned();
        }
        Ok(logged)
    }

    /// A cold source member of a checkpointing query: stand where the
    /// offsets log says the previous epoch ended, with the event-time
    /// clocks as they were then.
    async fn stand_where_the_log_ends(
        &self,
        f: &StageFunction,
        cs: &CheckpointStore,
        state: &mut PulledState,
        spec: EpochSpec,
        committed: Option<u64>,
    ) -> Result<()> {
        self.check_replayable(f)?;
        if spec.epoch == 0 {
            return Ok(());
        }
        let entry = self.previous_entry(f, cs, state, spec, committed).await?;
        self.check_epochs(f, &entry)?;
        let now = Instant::now();
        for (r, clock) in self.readers.iter().zip(state.clocks.iter_mut()) {
            let Some(read) = entry.tables.iter().find(|x| x.table == r.table) else {
                continue;
            };
            r.source
                .seek(spec, &read.to)
                .await
                .map_err(|e| e.at_source(&r.table, &f.name))?;
            if let (Some(clock), Some(saved)) = (clock.as_mut(), &read.clock) {
                clock.restore(saved, now);
            }
        }
        let previous = spec.epoch - 1;
        tracing::info!(stage = %f.name, epoch = previous, "source resumed from the offsets log");
        Ok(())
    }

    /// A query that checkpoints must be able to read an epoch again.
    fn check_replayable(&self, f: &StageFunction) -> Result<()> {
        match self
            .readers
            .iter()
            .find(|r| r.source.replay_mode() == ReplayMode::Unsupported)
        {
            Some(r) => Err(EngineError::source_failed(
                r.table.clone(),
                format!(
                    "{}: this source cannot read an epoch again, so a query reading it \
                     cannot checkpoint",
                    f.name
                ),
            )),
            None => Ok(()),
        }
    }

    /// The log entry of the epoch before `spec`'s: in the store, or in the
    /// source's note when that epoch was between checkpoints.
    async fn previous_entry(
        &self,
        f: &StageFunction,
        cs: &CheckpointStore,
        state: &mut PulledState,
        spec: EpochSpec,
        committed: Option<u64>,
    ) -> Result<OffsetsEntry> {
        let (stage, member) = (f.ctx.stage, f.ctx.member);
        let previous = spec.epoch - 1;
        let entry = match cs.member(stage, member, previous).await? {
            Some(object) => {
                f.tally.counted_before(object.tally);
                object.offsets
            }
            // Between checkpoints: the source's note has it.
            None => {
                self.take_in_notes(f, cs, &mut state.kept, spec, committed)
                    .await?;
                // The counts ride in the store's objects only: take the
                // commit's (what this member counted since is not known).
                let counted = match committed {
                    Some(c) => cs.member(stage, member, c).await?,
                    None => None,
                };
                f.tally.counted_before(counted.and_then(|o| o.tally));
                state.kept.get(previous).cloned()
            }
        };
        entry.ok_or_else(|| {
            EngineError::Context(format!(
                "{}: the offsets log in {} (and the note kept in the source) has no epoch \
                 {previous}, so epoch {} cannot start where it ended",
                f.name,
                cs.root(),
                spec.epoch
            ))
        })
    }

    /// A table that slices its input by the run's epochs resumes only with
    /// the epochs it was logged with.
    fn check_epochs(&self, f: &StageFunction, entry: &OffsetsEntry) -> Result<()> {
        let by_epoch = self
            .readers
            .iter()
            .find(|r| r.source.replay_mode() == ReplayMode::ByEpoch);
        let Some(r) = by_epoch.filter(|_| entry.epochs != f.ctx.epochs) else {
            return Ok(());
        };
        let said = |e: Option<u64>| e.map_or("unbounded".to_string(), |n| format!("{n} epochs"));
        Err(EngineError::source_failed(
            r.table.clone(),
            format!(
                "{}: this table slices its input by the run's epochs, and the checkpointed \
                 run had {}, not {}: resume with the same --epochs",
                f.name,
                said(entry.epochs),
                said(f.ctx.epochs)
            ),
        ))
    }

    /// Make an epoch's entry durable: in the source's note between
    /// checkpoints where it can keep one, else in the store.
    pub(super) async fn log(
        &self,
        f: &StageFunction,
        cs: Option<&CheckpointStore>,
        spec: EpochSpec,
        entry: Option<OffsetsEntry>,
        note: Option<String>,
    ) -> Result<()> {
        let (Some(cs), Some(entry)) = (cs, entry) else {
            return Ok(());
        };
        if let Some(note) = &note {
            let kept = self.keep_note(f, cs, spec, note).await;
            if !matches!(kept, Ok(true)) {
                // Not kept: the store has it (or the epoch fails).
                self.pulled.lock().await.kept.remove(spec.epoch);
            }
            if kept? {
                return Ok(());
            }
        }
        f.log_entry(cs, spec.epoch, entry).await
    }
}

impl StageFunction {
    /// Write this member's object for `epoch`: its log entry, and its
    /// counts. Created only if the epoch has none: one that does was taken
    /// by another instance (or an earlier run the driver did not know of),
    /// and the epoch fails to run again from the last commit.
    async fn log_entry(&self, cs: &CheckpointStore, epoch: u64, entry: OffsetsEntry) -> Result<()> {
        let object = MemberObject {
            offsets: Some(entry),
            tally: self.tally.carry(),
            state: None,
        };
        if cs
            .put_member_new(self.ctx.stage, self.ctx.member, epoch, object)
            .await?
        {
            return Ok(());
        }
        Err(EngineError::invocation_failed(
            self.name.clone(),
            format!(
                "epoch {epoch} is in the offsets log already; it runs again from the last commit"
            ),
        ))
    }
}
