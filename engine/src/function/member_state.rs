//! A stateful member's durable state: restored once by a cold instance,
//! written at the end of the epochs the driver will commit, as the
//! member's one object for that epoch (its counts ride along). Most
//! checkpoints write only the changes since the previous one. A whole
//! state replaces the chain when half of the rows a restore would read are
//! no longer held (released windows, replaced keys), so a restore reads at
//! most about twice the state, and a state that only grows (a window
//! filling up) is written once, as its changes, not again and again whole.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;

use super::{StageFunction, StageState};
use crate::checkpoint::{
    CheckpointStore, MemberObject, MemberRecord, Snapshot, StateKind, decode_state, encode_changes,
    encode_state,
};
use crate::context::StageMode;
use crate::error::{EngineError, Result};
use crate::window_state::{Change, SavedWindows, rows_held};

/// Longest chain of changes before a whole state, whatever the sizes: it
/// bounds how many objects a restore reads.
const MAX_CHAIN: usize = 64;

/// A chain smaller than this is not worth replacing with a whole state.
const MIN_CHAIN_BYTES: usize = 64 * 1024;

/// States of one chain a restore reads at once.
const RESTORE_READS: usize = 8;

/// The chain of states in the store that this instance's buffer continues
/// from: what a restore of its newest state would read.
#[derive(Debug, Default)]
pub(super) struct SavedChain {
    /// Epochs of the chain's states, the whole one first.
    epochs: Vec<u64>,
    /// Their bytes.
    bytes: usize,
    /// The rows they hold.
    rows: u64,
}

impl SavedChain {
    /// Whether the next checkpoint is whole, with `live_rows` held now:
    /// there is nothing to build on, the chain is as long as it may get, or
    /// at least half the rows it holds are gone from the state.
    fn wants_whole(&self, live_rows: u64) -> bool {
        self.epochs.is_empty()
            || self.epochs.len() > MAX_CHAIN
            || (self.bytes >= MIN_CHAIN_BYTES && self.rows >= live_rows.saturating_mul(2))
    }

    pub(super) fn note(&mut self, w: Written) {
        if w.whole {
            self.epochs.clear();
            self.bytes = 0;
            self.rows = 0;
        }
        self.epochs.push(w.epoch);
        self.bytes += w.len;
        self.rows += w.rows;
    }
}

/// Rows in a set of changes.
fn change_rows(changes: &[Change]) -> u64 {
    changes.iter().map(|c| c.rows() as u64).sum()
}

/// One state object of a chain, read and decoded.
struct ReadState {
    snapshot: Snapshot,
    bytes: usize,
    tally: Option<MemberRecord>,
}

impl StageFunction {
    /// The checkpoint store, when this query checkpoints.
    pub fn checkpoints(&self) -> Option<&Arc<CheckpointStore>> {
        self.ctx
            .checkpoint
            .as_ref()
            .and(self.env.checkpoints.as_ref())
    }

    /// This member's state for `epoch`, of `kind` when it is known.
    async fn read_state(
        &self,
        cs: &CheckpointStore,
        commit: u64,
        epoch: u64,
        kind: Option<StateKind>,
        schemas: &BTreeMap<u32, SchemaRef>,
    ) -> Result<ReadState> {
        let (stage, member) = (self.ctx.stage, self.ctx.member);
        let read = match kind {
            Some(kind) => cs.member_state_of(stage, member, epoch, kind).await?,
            None => cs.member_state(stage, member, epoch).await?,
        };
        let read = read.ok_or_else(|| {
            EngineError::Context(format!(
                "{}: epoch {commit} is committed but this member's state for epoch {epoch} \
                 is not in the checkpoint store {}",
                self.name,
                cs.root()
            ))
        })?;
        let what = format!("{} epoch {epoch}", self.name);
        Ok(ReadState {
            snapshot: decode_state(&read.state, schemas, &what)?,
            bytes: read.state.len(),
            tally: read.tally,
        })
    }

    /// The chain of states the state at `commit` is: newest first, the
    /// whole state last. A state that lists its chain has the rest read at
    /// once; one from an older store is followed base by base.
    async fn read_chain(
        &self,
        cs: &CheckpointStore,
        commit: u64,
        schemas: &BTreeMap<u32, SchemaRef>,
    ) -> Result<Vec<ReadState>> {
        let newest = self.read_state(cs, commit, commit, None, schemas).await?;
        let listed = match &newest.snapshot {
            Snapshot::Whole(_) => return Ok(vec![newest]),
            Snapshot::Changes(c) => c.chain.clone(),
        };
        let bad = |reason: String| {
            EngineError::Context(format!("state {} epoch {commit}: {reason}", self.name))
        };
        if !listed.is_empty() {
            let ordered = listed.windows(2).all(|w| w[0] < w[1]);
            if !ordered || listed.last() >= Some(&commit) || listed.len() > MAX_CHAIN + 1 {
                return Err(bad(format!(
                    "its chain {listed:?} is not one this member writes"
                )));
            }
            let mut reads = Vec::with_capacity(listed.len());
            for (n, epochs) in listed.chunks(RESTORE_READS).enumerate() {
                let batch = epochs.iter().enumerate().map(|(i, &epoch)| {
                    let kind = if n == 0 && i == 0 {
                        StateKind::Whole
                    } else {
                        StateKind::Changes
                    };
                    self.read_state(cs, commit, epoch, Some(kind), schemas)
                });
                reads.extend(futures::future::try_join_all(batch).await?);
            }
            let mut chain = vec![newest];
            chain.extend(reads.into_iter().rev());
            return Ok(chain);
        }
        let mut chain = vec![newest];
        loop {
            let last = chain.last().expect("not empty");
            let (epoch, base) = match &last.snapshot {
                Snapshot::Whole(_) => return Ok(chain),
                Snapshot::Changes(c) => (c.epoch, c.base),
            };
            if base >= epoch {
                return Err(bad(format!(
                    "the state of epoch {epoch} builds on epoch {base}, not one before it"
                )));
            }
            chain.push(self.read_state(cs, commit, base, None, schemas).await?);
        }
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
        let mut read = self.read_chain(cs, commit.epoch, &schemas).await?;
        // The committed object's counts: where this instance's go on from.
        let counted = read[0].tally.clone();
        let mut saved = SavedChain::default();
        let whole = match read.pop().map(|r| (r.snapshot, r.bytes)) {
            Some((Snapshot::Whole(w), bytes)) => {
                saved.note(Written {
                    epoch: w.epoch,
                    whole: true,
                    len: bytes,
                    rows: rows_held(&w.buffered) as u64,
                });
                w
            }
            _ => {
                return Err(EngineError::Context(format!(
                    "state {} epoch {}: its chain does not start with a whole state",
                    self.name, commit.epoch
                )));
            }
        };
        let mut chain = vec![];
        let mut base = whole.epoch;
        for r in read.into_iter().rev() {
            let Snapshot::Changes(c) = r.snapshot else {
                return Err(EngineError::Context(format!(
                    "state {} epoch {}: a whole state in the middle of its chain",
                    self.name, commit.epoch
                )));
            };
            if c.base != base {
                return Err(EngineError::Context(format!(
                    "state {} epoch {}: the changes of epoch {} build on epoch {}, not {base}",
                    self.name, commit.epoch, c.epoch, c.base
                )));
            }
            base = c.epoch;
            saved.note(Written {
                epoch: c.epoch,
                whole: false,
                len: r.bytes,
                rows: change_rows(&c.changes),
            });
            chain.push(c);
        }
        state.watermark = whole.watermark;
        if let Some(u) = &mut state.updating {
            if let Some(last) = chain.last() {
                state.watermark = last.watermark;
            }
            u.restore(
                whole.buffered,
                chain.into_iter().map(|c| c.changes).collect(),
                commit.epoch,
            )?;
        } else {
            state
                .windows
                .restore(whole.buffered, whole.released, whole.emitted_sessions);
            for c in chain {
                state.watermark = c.watermark;
                state.windows.apply(c.changes)?;
            }
        }
        state.saved = saved;
        self.tally.counted_before(counted);
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
        let live_rows = match &state.updating {
            Some(u) => u.checkpoint_rows(),
            None => state.windows.rows(),
        } as u64;
        let (bytes, whole, rows) = match changes {
            Some(changes) if !state.saved.wants_whole(live_rows) => (
                encode_changes(
                    epoch,
                    &state.saved.epochs,
                    state.watermark,
                    &changes,
                    &schemas,
                )?,
                false,
                change_rows(&changes),
            ),
            _ => {
                let bytes = match &mut state.updating {
                    Some(u) => {
                        let rows = u.whole()?;
                        let saved = SavedWindows {
                            buffered: &rows,
                            released: None,
                            emitted_sessions: &Default::default(),
                        };
                        encode_state(epoch, state.watermark, saved, &schemas)?
                    }
                    None => encode_state(epoch, state.watermark, state.windows.saved(), &schemas)?,
                };
                (bytes, true, live_rows)
            }
        };
        crate::metrics::checkpoint_bytes(&self.name, bytes.len());
        Ok(Some(StateWrite {
            epoch,
            whole,
            bytes,
            rows,
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
            rows: w.rows,
        }))
    }
}

/// A member state encoded for one epoch, not yet written.
pub(super) struct StateWrite {
    epoch: u64,
    whole: bool,
    bytes: Vec<u8>,
    /// Rows it holds.
    rows: u64,
}

/// A member state in the store: the next changes build on it.
pub(super) struct Written {
    epoch: u64,
    whole: bool,
    len: usize,
    rows: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(epoch: u64, whole: bool, len: usize, rows: u64) -> Written {
        Written {
            epoch,
            whole,
            len,
            rows,
        }
    }

    #[test]
    fn a_growing_state_is_written_as_changes_until_the_chain_is_full() {
        let mut chain = SavedChain::default();
        assert!(chain.wants_whole(0), "nothing to build on");
        chain.note(write(1, true, 100, 10));
        let mut live = 10;
        for epoch in 2..=65 {
            // A window filling up: every row written is still held.
            live += 1_000;
            assert!(!chain.wants_whole(live), "epoch {epoch}");
            chain.note(write(epoch, false, 300_000, 1_000));
        }
        assert_eq!(chain.epochs.len(), MAX_CHAIN + 1);
        assert!(
            chain.wants_whole(live),
            "the chain is as long as it may get"
        );
        chain.note(write(66, true, 5_000_000, live));
        assert_eq!(chain.epochs, [66]);
        assert_eq!((chain.bytes, chain.rows), (5_000_000, live));
    }

    #[test]
    fn a_whole_state_follows_when_half_the_rows_read_are_gone() {
        let mut chain = SavedChain::default();
        chain.note(write(1, true, 200_000, 20_000));
        chain.note(write(2, false, 100_000, 10_000));
        assert!(!chain.wants_whole(30_000), "every row is held");
        assert!(!chain.wants_whole(15_001), "under half is gone");
        assert!(chain.wants_whole(15_000), "half is gone");
        assert!(chain.wants_whole(0), "a window was released");
    }

    #[test]
    fn a_small_chain_is_kept_whatever_it_holds() {
        let mut chain = SavedChain::default();
        chain.note(write(1, true, 1_000, 100));
        chain.note(write(2, false, 1_000, 100));
        assert!(
            !chain.wants_whole(0),
            "2 KB is cheaper to read than to rewrite"
        );
        assert_eq!(chain.epochs, [1, 2]);
    }
}
