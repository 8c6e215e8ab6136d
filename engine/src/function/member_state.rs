//! A stateful member's durable state: restored once by a cold instance,
//! written at the end of the epochs the driver will commit, as the
//! member's one object for that epoch (its counts ride along). Most
//! checkpoints write only the changes since the previous one; a whole state
//! is written when there is nothing to build on or the chain of changes has
//! grown as large as a whole state would be, so a restore reads at most
//! about twice the state.

use std::sync::Arc;

use super::{StageFunction, StageState};
use crate::checkpoint::{
    CheckpointStore, MemberObject, Snapshot, StateKind, decode_state, encode_changes, encode_state,
};
use crate::context::StageMode;
use crate::error::{EngineError, Result};
use crate::window_state::SavedWindows;

/// Longest chain of changes before a whole state, whatever the sizes: it
/// bounds how many objects a restore reads.
const MAX_CHAIN: u32 = 64;

/// What this instance knows of the states it wrote or read.
#[derive(Debug, Default)]
pub(super) struct SavedChain {
    /// The epoch of the newest state in the store that this instance's
    /// buffer continues from.
    base: Option<u64>,
    /// Bytes of the whole state at the chain's start.
    whole_bytes: usize,
    /// Bytes and count of the changes written on it since.
    changes_bytes: usize,
    changes: u32,
}

impl SavedChain {
    fn wants_whole(&self) -> bool {
        self.base.is_none()
            || self.changes >= MAX_CHAIN
            || self.changes_bytes >= self.whole_bytes.max(64 * 1024)
    }
}

impl StageFunction {
    /// The checkpoint store, when this query checkpoints.
    pub fn checkpoints(&self) -> Option<&Arc<CheckpointStore>> {
        self.ctx
            .checkpoint
            .as_ref()
            .and(self.env.checkpoints.as_ref())
    }

    /// A cold instance of a member that takes payloads: continue after the
    /// last committed epoch, with the state this member had then (a whole
    /// state and the changes written on it since).
    pub(super) async fn restore(&self, state: &mut StageState) -> Result<()> {
        let Some(cs) = self.checkpoints() else {
            return Ok(());
        };
        let commit = cs.committed().await?;
        if self.ctx.mode != StageMode::Stream {
            state.windows.keep_changes();
            if let Some(u) = &mut state.updating {
                u.keep_changes();
            }
            cs.drop_states_after(self.ctx.stage, self.ctx.member, commit.map(|c| c.epoch))
                .await?;
        }
        let Some(commit) = commit else {
            return Ok(());
        };
        state.next_epoch = commit.epoch + 1;
        if self.ctx.mode == StageMode::Stream {
            return Ok(());
        }
        let schemas = self.checkpoint_schemas(state);
        let mut chain = vec![];
        let mut epoch = commit.epoch;
        let mut saved = SavedChain {
            base: Some(commit.epoch),
            ..Default::default()
        };
        let mut counted = None;
        let whole = loop {
            let read = cs
                .member_state(self.ctx.stage, self.ctx.member, epoch)
                .await?
                .ok_or_else(|| {
                    EngineError::Context(format!(
                        "{}: epoch {} is committed but this member's state for epoch {epoch} \
                         is not in the checkpoint store {}",
                        self.name,
                        commit.epoch,
                        cs.root()
                    ))
                })?;
            // The committed object's counts: where this instance's go on from.
            counted = counted.or(Some(read.tally));
            let bytes = read.state;
            let what = format!("{} epoch {epoch}", self.name);
            match decode_state(&bytes, &schemas, &what)? {
                Snapshot::Whole(w) => {
                    saved.whole_bytes = bytes.len();
                    break w;
                }
                Snapshot::Changes(c) => {
                    if c.base >= epoch {
                        return Err(EngineError::Context(format!(
                            "state {what}: its base epoch {} is not before it",
                            c.base
                        )));
                    }
                    saved.changes_bytes += bytes.len();
                    saved.changes += 1;
                    epoch = c.base;
                    chain.push(c);
                }
            }
        };
        state.watermark = whole.watermark;
        if let Some(u) = &mut state.updating {
            if let Some(last) = chain.first() {
                state.watermark = last.watermark;
            }
            u.restore(
                whole.buffered,
                chain.into_iter().rev().map(|c| c.changes).collect(),
                commit.epoch,
            )?;
        } else {
            state
                .windows
                .restore(whole.buffered, whole.released, whole.emitted_sessions);
            for c in chain.into_iter().rev() {
                state.watermark = c.watermark;
                state.windows.apply(c.changes)?;
            }
        }
        state.saved = saved;
        self.tally.counted_before(counted.flatten());
        tracing::info!(stage = %self.name, epoch = commit.epoch, "state restored from the checkpoint");
        Ok(())
    }

    /// This member's state as of the end of `epoch`, encoded, when the
    /// driver will commit the epoch (`checkpoint`: it said so, or it is the
    /// run's last).
    pub(super) fn state_to_save(
        &self,
        state: &mut StageState,
        epoch: u64,
        checkpoint: bool,
    ) -> Result<Option<StateWrite>> {
        if self.checkpoints().is_none() || self.ctx.mode == StageMode::Stream || !checkpoint {
            return Ok(None);
        }
        let schemas = self.checkpoint_schemas(state);
        let changes = match &mut state.updating {
            Some(u) => u.take_changes(),
            None => state.windows.take_changes(),
        };
        let (bytes, whole) = match (changes, state.saved.base) {
            (Some(changes), Some(base)) if !state.saved.wants_whole() => (
                encode_changes(epoch, base, state.watermark, &changes, &schemas)?,
                false,
            ),
            _ => match &state.updating {
                Some(u) => {
                    let rows = u.whole()?;
                    let saved = SavedWindows {
                        buffered: &rows,
                        released: None,
                        emitted_sessions: &Default::default(),
                    };
                    (encode_state(epoch, state.watermark, saved, &schemas)?, true)
                }
                None => (
                    encode_state(epoch, state.watermark, state.windows.saved(), &schemas)?,
                    true,
                ),
            },
        };
        crate::metrics::checkpoint_bytes(&self.name, bytes.len());
        Ok(Some(StateWrite {
            epoch,
            whole,
            bytes,
        }))
    }

    /// The schema of each edge's rows in this member's checkpoints.
    fn checkpoint_schemas(
        &self,
        state: &StageState,
    ) -> std::collections::BTreeMap<u32, datafusion::arrow::datatypes::SchemaRef> {
        match &state.updating {
            Some(u) => u.checkpoint_schemas(),
            None => self.input_schemas.clone(),
        }
    }

    /// Write what [`Self::state_to_save`] encoded, with the member's
    /// counts, as its object for the epoch; its size, once written.
    pub(super) async fn write_state(&self, write: Option<StateWrite>) -> Result<Option<Written>> {
        let (Some(cs), Some(w)) = (self.checkpoints(), write) else {
            return Ok(None);
        };
        let len = w.bytes.len();
        let kind = if w.whole {
            StateKind::Whole
        } else {
            StateKind::Changes
        };
        let object = MemberObject {
            offsets: None,
            tally: self.tally.carry(),
            state: Some((kind, w.bytes)),
        };
        cs.put_member(self.ctx.stage, self.ctx.member, w.epoch, object)
            .await?;
        Ok(Some(Written {
            epoch: w.epoch,
            whole: w.whole,
            len,
        }))
    }
}

/// A member state encoded for one epoch, not yet written.
pub(super) struct StateWrite {
    epoch: u64,
    whole: bool,
    bytes: Vec<u8>,
}

/// A member state in the store: the next changes build on it.
pub(super) struct Written {
    epoch: u64,
    whole: bool,
    len: usize,
}

impl SavedChain {
    pub(super) fn note(&mut self, w: Written) {
        if w.whole {
            *self = SavedChain {
                base: Some(w.epoch),
                whole_bytes: w.len,
                ..Default::default()
            };
        } else {
            self.base = Some(w.epoch);
            self.changes_bytes += w.len;
            self.changes += 1;
        }
    }
}
