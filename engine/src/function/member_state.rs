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

use super::StageFunction;
use super::payload_stage::{EpochStep, PayloadState};
use crate::checkpoint::{
    CheckpointStore, MemberChanges, MemberObject, MemberRecord, MemberState, Snapshot, StateKind,
    decode_state, encode_changes, encode_state,
};
use crate::error::{EngineError, Result};
use crate::watermark::Watermark;
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
    pub(super) epochs: Vec<u64>,
    /// Their bytes.
    bytes: usize,
    /// The rows they hold.
    rows: u64,
}

impl SavedChain {
    /// Whether the next checkpoint is whole, with `live_rows` held now:
    /// there is nothing to build on, the chain is as long as it may get, or
    /// at least half the rows it holds are gone from the state.
    pub(super) fn wants_whole(&self, live_rows: u64) -> bool {
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
pub(super) struct ReadState {
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

    /// Member `member`'s state for `epoch`, of `kind` when it is known.
    async fn read_state(
        &self,
        cs: &CheckpointStore,
        (member, commit): (u32, u64),
        epoch: u64,
        kind: Option<StateKind>,
        schemas: &BTreeMap<u32, SchemaRef>,
    ) -> Result<ReadState> {
        let stage = self.ctx.stage;
        let read = match kind {
            Some(kind) => cs.member_state_of(stage, member, epoch, kind).await?,
            None => cs.member_state(stage, member, epoch).await?,
        };
        let read = read.ok_or_else(|| {
            EngineError::Context(format!(
                "{}: epoch {commit} is committed but the state of member {member} for epoch \
                 {epoch} is not in the checkpoint store {}",
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
    pub(super) async fn read_chain(
        &self,
        cs: &CheckpointStore,
        commit: u64,
        schemas: &BTreeMap<u32, SchemaRef>,
    ) -> Result<Vec<ReadState>> {
        self.read_chain_of(cs, self.ctx.member, commit, schemas)
            .await
    }

    /// [`Self::read_chain`] of member `member` of this stage.
    pub(super) async fn read_chain_of(
        &self,
        cs: &CheckpointStore,
        member: u32,
        commit: u64,
        schemas: &BTreeMap<u32, SchemaRef>,
    ) -> Result<Vec<ReadState>> {
        let at = (member, commit);
        let newest = self.read_state(cs, at, commit, None, schemas).await?;
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
                    self.read_state(cs, at, epoch, Some(kind), schemas)
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
            chain.push(self.read_state(cs, at, base, None, schemas).await?);
        }
    }

    /// Write what [`PayloadState::state_to_save`] encoded, with the member's
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

impl PayloadState {
    /// A cold instance of a member that takes payloads: continue after the
    /// last committed epoch, with the state this member had then (a whole
    /// state and the changes written on it since).
    pub(super) async fn restore(&mut self, f: &StageFunction) -> Result<()> {
        let Some(cs) = f.checkpoints() else {
            return Ok(());
        };
        let commit = cs.committed_in().await?;
        if self.step.keeps_state() {
            self.step.keep_changes();
            cs.drop_states_after(
                f.ctx.stage,
                f.ctx.member,
                commit.as_ref().map(|c| c.0.epoch),
            )
            .await?;
        }
        let Some((commit, layout)) = commit else {
            return Ok(());
        };
        self.next_epoch = commit.epoch + 1;
        if !self.step.keeps_state() {
            return Ok(());
        }
        // The group had another size when the commit was made: this
        // member's state is its key groups' share of the old members'.
        let was = layout.get(&f.ctx.stage).copied().unwrap_or(f.ctx.members);
        if was != f.ctx.members {
            return self.restore_rescaled(f, cs, commit.epoch, was).await;
        }
        let schemas = self.step.checkpoint_schemas();
        let read = f.read_chain(cs, commit.epoch, &schemas).await?;
        // The committed object's counts: where this instance's go on from.
        let counted = read[0].tally.clone();
        let (whole, chain, saved) = ordered_chain(&f.name, commit.epoch, read)?;
        self.watermark = self.step.restore(whole, chain, commit.epoch)?;
        self.saved = saved;
        f.tally.counted_before(counted);
        tracing::info!(stage = %f.name, epoch = commit.epoch, "state restored from the checkpoint");
        Ok(())
    }

    /// This member's state as of the end of `epoch`, encoded, when the
    /// driver will commit the epoch (`checkpoint`: it said so, or it is the
    /// run's last).
    pub(super) fn state_to_save(
        &mut self,
        f: &StageFunction,
        epoch: u64,
        checkpoint: bool,
    ) -> Result<Option<StateWrite>> {
        if f.checkpoints().is_none() || !self.step.keeps_state() || !checkpoint {
            return Ok(None);
        }
        let schemas = self.step.checkpoint_schemas();
        let changes = self.step.take_changes();
        let live_rows = self.step.live_rows() as u64;
        let (bytes, whole, rows) = match changes {
            Some(changes) if !self.saved.wants_whole(live_rows) => {
                let chain = &self.saved.epochs;
                let bytes = encode_changes(epoch, chain, self.watermark, &changes, &schemas)?;
                (bytes, false, change_rows(&changes))
            }
            _ => {
                let bytes = self.step.encode_whole(epoch, self.watermark, &schemas)?;
                (bytes, true, live_rows)
            }
        };
        crate::metrics::checkpoint_bytes(&f.name, bytes.len());
        Ok(Some(StateWrite {
            epoch,
            whole,
            bytes,
            rows,
        }))
    }
}

/// A chain read newest first as its whole state, the changes on it in
/// order, and what the next checkpoint builds on; an error names a chain
/// this member does not write.
pub(super) fn ordered_chain(
    name: &str,
    commit: u64,
    mut read: Vec<ReadState>,
) -> Result<(MemberState, Vec<MemberChanges>, SavedChain)> {
    let bad = |why: String| EngineError::Context(format!("state {name} epoch {commit}: {why}"));
    let mut saved = SavedChain::default();
    let whole = match read.pop().map(|r| (r.snapshot, r.bytes)) {
        Some((Snapshot::Whole(w), bytes)) => {
            let rows = rows_held(&w.buffered) as u64;
            saved.note(Written {
                epoch: w.epoch,
                whole: true,
                len: bytes,
                rows,
            });
            w
        }
        _ => return Err(bad("its chain does not start with a whole state".into())),
    };
    let mut chain = vec![];
    let mut base = whole.epoch;
    for r in read.into_iter().rev() {
        let Snapshot::Changes(c) = r.snapshot else {
            return Err(bad("a whole state in the middle of its chain".into()));
        };
        if c.base != base {
            return Err(bad(format!(
                "the changes of epoch {} build on epoch {}, not {base}",
                c.epoch, c.base
            )));
        }
        base = c.epoch;
        let rows = change_rows(&c.changes);
        saved.note(Written {
            epoch: c.epoch,
            whole: false,
            len: r.bytes,
            rows,
        });
        chain.push(c);
    }
    Ok((whole, chain, saved))
}

impl EpochStep {
    /// Whether the step keeps state across epochs (and so checkpoints it).
    fn keeps_state(&self) -> bool {
        !matches!(self, EpochStep::Stream)
    }

    /// Start recording changes for the next checkpoint.
    fn keep_changes(&mut self) {
        match self {
            EpochStep::Stream => {}
            EpochStep::Windowed(w) => w.windows.keep_changes(),
            EpochStep::Updating(u) => u.state.keep_changes(),
        }
    }

    /// The changes since the last checkpoint.
    fn take_changes(&mut self) -> Option<Vec<Change>> {
        match self {
            EpochStep::Stream => None,
            EpochStep::Windowed(w) => w.windows.take_changes(),
            EpochStep::Updating(u) => u.state.take_changes(),
        }
    }

    /// Rows a whole state would hold now.
    fn live_rows(&self) -> usize {
        match self {
            EpochStep::Stream => 0,
            EpochStep::Windowed(w) => w.windows.rows(),
            EpochStep::Updating(u) => u.state.checkpoint_rows(),
        }
    }

    /// The schema of each edge's rows in this member's checkpoints.
    pub(super) fn checkpoint_schemas(&self) -> BTreeMap<u32, SchemaRef> {
        match self {
            EpochStep::Stream => BTreeMap::new(),
            EpochStep::Windowed(w) => w.schemas.clone(),
            EpochStep::Updating(u) => u.state.checkpoint_schemas(),
        }
    }

    /// The whole state, encoded.
    pub(super) fn encode_whole(
        &mut self,
        epoch: u64,
        watermark: Watermark,
        schemas: &BTreeMap<u32, SchemaRef>,
    ) -> Result<Vec<u8>> {
        match self {
            EpochStep::Updating(u) => {
                let rows = u.state.whole()?;
                let saved = SavedWindows {
                    buffered: &rows,
                    released: None,
                    emitted_sessions: &Default::default(),
                };
                encode_state(epoch, watermark, saved, schemas)
            }
            EpochStep::Windowed(w) => encode_state(epoch, watermark, w.windows.saved(), schemas),
            EpochStep::Stream => Err(EngineError::Context(
                "a stage without state has none to write".into(),
            )),
        }
    }

    /// Take a restored chain in; the watermark the state had.
    pub(super) fn restore(
        &mut self,
        whole: MemberState,
        chain: Vec<MemberChanges>,
        commit: u64,
    ) -> Result<Watermark> {
        let mut watermark = whole.watermark;
        match self {
            EpochStep::Stream => {}
            EpochStep::Updating(u) => {
                if let Some(last) = chain.last() {
                    watermark = last.watermark;
                }
                let changes = chain.into_iter().map(|c| c.changes).collect();
                u.state.restore(whole.buffered, changes, commit)?;
            }
            EpochStep::Windowed(w) => {
                let sessions = whole.emitted_sessions;
                w.windows.restore(whole.buffered, whole.released, sessions);
                for c in chain {
                    watermark = c.watermark;
                    w.windows.apply(c.changes)?;
                }
            }
        }
        Ok(watermark)
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
