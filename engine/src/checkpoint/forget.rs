//! Clean-up: what no restart can need once an epoch is committed goes, in
//! one batched delete now and then rather than requests every epoch. A
//! listing of the store's decisions and member objects says from the names
//! alone what is stale: decisions of committed epochs, source entries
//! before the commit (the committed epoch's own is where a restart
//! starts), per member the states before the newest whole state at or
//! before the commit (the changes after it rebuild the committed state),
//! the states of members past their group's size in the commit (a group
//! that shrank; a member that comes back starts whole after the commit),
//! and all but the last rescale records `skein status` lists.

use std::collections::HashMap;

use object_store::path::Path;

use super::{CheckpointStore, Layout, StateKind};
use crate::error::Result;

/// Commits between clean-ups: each lists the store (a LIST per 1,000
/// objects) and deletes in batches of 1,000 keys (one request each); what
/// waits for the next one costs only space.
const FORGET_EVERY: u64 = 64;

impl CheckpointStore {
    /// Delete what no restart can need once `commit`, made in `layout`,
    /// is committed, at most every [`FORGET_EVERY`] commits of this
    /// handle. Returns how many objects were deleted.
    pub async fn forget_before(&self, commit: u64, layout: &Layout) -> Result<u64> {
        {
            let mut at = self.forgot_at.lock().expect("not poisoned");
            if at.is_some_and(|at| commit < at + FORGET_EVERY) {
                return Ok(0);
            }
            *at = Some(commit);
        }
        self.forget_now(commit, layout).await
    }

    /// [`Self::forget_before`], now.
    pub async fn forget_now(&self, commit: u64, layout: &Layout) -> Result<u64> {
        let mut stale: Vec<Path> = self
            .list_epochs(&["epochs"])
            .await?
            .into_iter()
            .filter(|(_, through, _)| *through <= commit)
            .map(|(key, _, _)| key)
            .collect();
        let objects: Vec<(Path, u64, Option<StateKind>)> = self
            .list_epochs(&["members"])
            .await?
            .into_iter()
            .filter_map(|(key, epoch, _)| {
                let kind = StateKind::of_name(key.filename()?)?;
                Some((key, epoch, kind))
            })
            .collect();
        // Per member directory: where its chain for `commit` starts.
        let mut chain_from: HashMap<String, u64> = HashMap::new();
        for (key, epoch, kind) in &objects {
            if *kind == Some(StateKind::Whole) && *epoch <= commit {
                let from = chain_from.entry(parent(key)).or_insert(*epoch);
                *from = (*from).max(*epoch);
            }
        }
        for (key, epoch, kind) in objects {
            let keep_from = match kind {
                None => Some(commit),
                Some(_) => chain_from.get(&parent(&key)).copied(),
            };
            // A member past its group's size in the commit: no restore of
            // it or of a later commit reads what it wrote up to it (a new
            // member's first state after a rescale is whole). What it
            // writes after the commit (the group grew) is kept.
            let gone = kind.is_some()
                && epoch <= commit
                && member_of(&key).is_some_and(|(stage, member)| {
                    layout.get(&stage).is_some_and(|&size| member >= size)
                });
            if gone || keep_from.is_some_and(|from| epoch < from) {
                stale.push(key);
            }
        }
        // Rescale records of epochs run: a restart reads only the one
        // after its commit; status lists the last few.
        let mut layouts = self.list_epochs(&["layouts"]).await?;
        layouts.retain(|(_, epoch, _)| *epoch <= commit);
        layouts.sort_by_key(|(_, epoch, _)| *epoch);
        let old = layouts.len().saturating_sub(crate::status::RESIZES_SHOWN);
        stale.extend(layouts.into_iter().take(old).map(|(key, _, _)| key));
        let deleted = stale.len() as u64;
        self.backend.delete(stale).await?;
        Ok(deleted)
    }
}

/// The (stage, member) whose directory holds a member object.
fn member_of(key: &Path) -> Option<(u32, u32)> {
    CheckpointStore::member_of_dir(parent(key).rsplit('/').next()?)
}

/// The directory part of a key.
fn parent(key: &Path) -> String {
    let s = key.as_ref();
    s.rsplit_once('/').map_or("", |(dir, _)| dir).to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use super::*;
    use crate::checkpoint::{Commit, Decided, MemberObject};

    #[tokio::test]
    async fn what_a_restart_needs_is_kept() {
        let cs = CheckpointStore::open(Arc::new(InMemory::new()), Path::from("q"), "abc")
            .await
            .unwrap();
        for e in 0..5 {
            cs.decide(Decided {
                from: e,
                through: e,
                last: e == 4,
            })
            .await
            .unwrap();
            cs.put_member(0, 1, e, MemberObject::default())
                .await
                .unwrap();
            // Whole at 1, changes after it.
            let kind = if e <= 1 {
                StateKind::Whole
            } else {
                StateKind::Changes
            };
            let state = MemberObject {
                state: Some((kind, vec![e as u8])),
                ..Default::default()
            };
            cs.put_member(1, 0, e, state).await.unwrap();
        }
        let commit = Commit {
            epoch: 3,
            last: false,
        };
        cs.commit(commit, None, vec![], &Default::default())
            .await
            .unwrap();
        // Decisions of 0..=3; entries of 0..3; the state of 0 (1 is whole,
        // and 2 and 3 build on it).
        assert_eq!(cs.forget_before(3, &Layout::new()).await.unwrap(), 8);
        assert!(cs.member_state(1, 0, 0).await.unwrap().is_none());
        assert_eq!(cs.member_state(1, 0, 2).await.unwrap().unwrap().state, [2]);
        assert!(cs.member(0, 1, 2).await.unwrap().is_none());
        assert!(cs.member(0, 1, 3).await.unwrap().is_some());
        let log = cs.driver_log().await.unwrap();
        assert_eq!(log.last_at(4), Some(true));
        assert_eq!(
            cs.forget_before(4, &Layout::new()).await.unwrap(),
            0,
            "done at 3 already"
        );
        // A whole state at 3 ends the chain before it.
        let whole = MemberObject {
            state: Some((StateKind::Whole, vec![33])),
            ..Default::default()
        };
        cs.drop_states_after(1, 0, Some(2)).await.unwrap();
        cs.put_member(1, 0, 3, whole).await.unwrap();
        assert_eq!(cs.forget_now(3, &Layout::new()).await.unwrap(), 2);
        assert_eq!(cs.member_state(1, 0, 3).await.unwrap().unwrap().state, [33]);
    }

    #[tokio::test]
    async fn a_shrunk_groups_members_and_old_rescale_records_go() {
        let cs = CheckpointStore::open(Arc::new(InMemory::new()), Path::from("q"), "abc")
            .await
            .unwrap();
        let state = |kind| MemberObject {
            state: Some((kind, vec![1])),
            ..Default::default()
        };
        // Stage 2 ran at 4 members through epoch 2, at 1 from epoch 3.
        for member in 0..4 {
            for e in 1..=2 {
                cs.put_member(2, member, e, state(StateKind::Whole))
                    .await
                    .unwrap();
            }
        }
        cs.put_member(2, 0, 3, state(StateKind::Whole))
            .await
            .unwrap();
        // Member 3 of a later growth, already past the commit.
        cs.put_member(2, 3, 4, state(StateKind::Whole))
            .await
            .unwrap();
        for e in 1..=30 {
            let layout = Layout::from([(2, 1 + (e as u32 % 4))]);
            cs.put_layout_from(e, &layout).await.unwrap();
        }
        let layout = Layout::from([(2, 1)]);
        // Members 1..=3 up to 3: 6 states; member 0 before 3: 2; the three
        // rescale records up to 3 stay (status lists the last 20).
        let deleted = cs.forget_now(3, &layout).await.unwrap();
        assert_eq!(deleted, 8, "no rescale record goes while 20 are kept");
        for member in 1..4 {
            assert!(cs.member_state(2, member, 2).await.unwrap().is_none());
        }
        assert!(cs.member_state(2, 0, 3).await.unwrap().is_some());
        assert!(cs.member_state(2, 3, 4).await.unwrap().is_some());
        // At 25: member 3's state of 4, and the records of 1..=5 go; 20 up
        // to 25 and the 5 after it stay.
        assert_eq!(cs.forget_now(25, &layout).await.unwrap(), 1 + 5);
        assert_eq!(cs.layouts(100).await.unwrap().len(), 25);
        assert!(cs.layout_from(5).await.unwrap().is_none());
        assert!(cs.layout_from(6).await.unwrap().is_some());
    }
}
