//! A member of a group whose size changed since the commit it restores
//! from: its state is its key groups' share of the old members' state.
//! Each old member that held one of its key groups has its chain read and
//! rebuilt as that member would have (a whole state and the changes on
//! it), then cut by the key group of each row; the new member's first
//! checkpoint is whole, so its chain never builds on an object of the old
//! layout.

use std::collections::BTreeMap;

use super::StageFunction;
use super::member_state::{SavedChain, ordered_chain};
use super::payload_stage::{EpochStep, PayloadState};
use crate::checkpoint::{CheckpointStore, MemberState, Snapshot, decode_state};
use crate::error::{EngineError, Result};
use crate::key_groups::rows_of_member;
use crate::ring::HashRing;
use crate::updating::state::{EMITTED, GROUPS};
use crate::watermark::WatermarkMin;

impl PayloadState {
    /// Restore from `commit`, written when the stage had `was` members.
    pub(super) async fn restore_rescaled(
        &mut self,
        f: &StageFunction,
        cs: &CheckpointStore,
        commit: u64,
        was: u32,
    ) -> Result<()> {
        let ctx = f.context();
        let groups = match ctx.key_groups {
            0 => was,
            n => n,
        };
        let ring = HashRing::new(ctx.members as usize);
        let keys = split_keys(f, &self.step)?;
        let schemas = self.step.checkpoint_schemas();
        let mut merged = MemberState {
            epoch: commit,
            ..Default::default()
        };
        let mut watermark = WatermarkMin::default();
        let mut kept = 0usize;
        for old in old_members_to_read(groups, was, ctx.members, ctx.member) {
            let read = f.read_chain_of(cs, old, commit, &schemas).await?;
            let (whole, chain, _) = ordered_chain(&f.name, commit, read)?;
            let mut step = f.empty_step()?;
            let at = step.restore(whole, chain, commit)?;
            let bytes = step.encode_whole(commit, at, &schemas)?;
            let what = format!("{} (member {old} of {was})", f.name);
            let Snapshot::Whole(state) = decode_state(&bytes, &schemas, &what)? else {
                return Err(EngineError::Context(format!(
                    "{what}: a whole state decoded as changes"
                )));
            };
            watermark.add(state.watermark);
            merged.released = match (merged.released, state.released) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            // Sessions emitted are kept by key; a key no longer here is
            // never asked about.
            for (edge, sessions) in state.emitted_sessions {
                merged
                    .emitted_sessions
                    .entry(edge)
                    .or_default()
                    .extend(sessions);
            }
            for (edge, batches) in state.buffered {
                let columns = keys.get(&edge).ok_or_else(|| {
                    EngineError::Context(format!(
                        "{}: rows of edge {edge} have no key to split them by",
                        f.name
                    ))
                })?;
                let mine = merged.buffered.entry(edge).or_default();
                for b in batches {
                    let share = rows_of_member(&b, columns, groups, &ring, ctx.member as usize)?;
                    kept += share.num_rows();
                    if share.num_rows() > 0 {
                        mine.push(share);
                    }
                }
            }
        }
        merged.watermark = watermark.result();
        self.watermark = self.step.restore(merged, vec![], commit)?;
        // Nothing of this layout is in the store yet: the next state is whole.
        self.saved = SavedChain::default();
        tracing::info!(stage = %f.name, epoch = commit, from_members = was,
            to_members = ctx.members, rows = kept, "state taken from the old members' key groups");
        Ok(())
    }
}

/// The old members whose state holds some of `member`'s key groups now:
/// a member only ever holds its own key groups, so the others need not be
/// read. A member that owns no key group (the ring can leave one without)
/// still reads one, for the watermark every member shares.
fn old_members_to_read(groups: u32, was: u32, members: u32, member: u32) -> Vec<u32> {
    let (now, then) = (HashRing::new(members as usize), HashRing::new(was as usize));
    let mut old: Vec<u32> = (0..groups.max(1) as usize)
        .filter(|&g| now.member_for(g) == member as usize)
        .map(|g| then.member_for(g) as u32)
        .collect();
    old.sort_unstable();
    old.dedup();
    if old.is_empty() {
        old.push(member.min(was.saturating_sub(1)));
    }
    old
}

/// The key columns of every kind of row the step's state keeps, by the
/// edge (or pseudo edge) they travel under in a checkpoint.
fn split_keys(f: &StageFunction, step: &EpochStep) -> Result<BTreeMap<u32, Vec<usize>>> {
    let mut keys: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for e in &f.context().inputs {
        if let Some(key) = &e.key {
            keys.insert(e.shuffle_id, key.clone());
        }
    }
    if let EpochStep::Updating(u) = step {
        let kept = u.kept_keys().ok_or_else(|| {
            EngineError::Context(format!(
                "{}: its state is one group, not kept by key: it cannot change size",
                f.name
            ))
        })?;
        keys.insert(EMITTED, kept.clone());
        keys.insert(GROUPS, kept);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_member_reads_only_the_old_members_that_held_its_key_groups() {
        for (groups, was, members) in [(8, 4, 2), (8, 2, 4), (8, 8, 3), (4, 1, 4), (8, 3, 8)] {
            let (now, then) = (HashRing::new(members as usize), HashRing::new(was as usize));
            let mut read_in_all = 0;
            for member in 0..members {
                let old = old_members_to_read(groups, was, members, member);
                read_in_all += old.len();
                assert!(old.iter().all(|&o| o < was), "{old:?} of {was}");
                for g in 0..groups as usize {
                    if now.member_for(g) == member as usize {
                        let from = then.member_for(g) as u32;
                        assert!(
                            old.contains(&from),
                            "key group {g} comes from member {from}"
                        );
                    }
                }
            }
            assert!(
                read_in_all <= (members * was).max(members) as usize,
                "{groups} key groups, {was} -> {members}: {read_in_all} chains read"
            );
        }
        // 4 -> 2 and 2 -> 4 read fewer chains than every member reading all.
        let all = |was: u32, members: u32| {
            (0..members)
                .map(|m| old_members_to_read(8, was, members, m).len())
                .sum::<usize>()
        };
        eprintln!(
            "chains read, 8 key groups: 4 -> 2: {}, 2 -> 4: {}, 8 -> 3: {}, 3 -> 8: {}",
            all(4, 2),
            all(2, 4),
            all(8, 3),
            all(3, 8)
        );
        assert!(all(4, 2) < 8, "4 -> 2: {}", all(4, 2));
        assert!(all(2, 4) < 8, "2 -> 4: {}", all(2, 4));
    }
}
