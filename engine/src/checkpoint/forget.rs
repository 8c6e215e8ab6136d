//! Clean-up: what no restart can need once an epoch is committed goes, in
//! one batched delete now and then rather than requests every epoch. A
//! listing of the store's decisions and member objects says from the names
//! alone what is stale: decisions of committed epochs, source entries
//! before the commit (the committed epoch's own is where a restart
//! starts), and per member the states before the newest whole state at or
//! before the commit (the changes after it rebuild the committed state).

use std::collections::HashMap;

use object_store::path::Path;

use super::{CheckpointStore, StateKind};
use crate::error::Result;

/// Commits between clean-ups: each lists the store (a LIST per 1,000
/// objects) and deletes in batches of 1,000 keys (one request each); what
/// waits for the next one costs only space.
const FORGET_EVERY: u64 = 64;

impl CheckpointStore {
    /// Delete what no restart can need once `commit` is committed, at most
    /// every [`FORGET_EVERY`] commits of this handle. Returns how many
    /// objects were deleted.
    pub async fn forget_before(&self, commit: u64) -> Result<u64> {
        {
            let mut at = self.forgot_at.lock().expect("not poisoned");
            if at.is_some_and(|at| commit < at + FORGET_EVERY) {
                return Ok(0);
            }
            *at = Some(commit);
        }
        self.forget_now(commit).await
    }

    /// [`Self::forget_before`], now.
    pub async fn forget_now(&self, commit: u64) -> Result<u64> {
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
            if keep_from.is_some_and(|from| epoch < from) {
                stale.push(key);
            }
        }
        let deleted = stale.len() as u64;
        self.backend.delete(stale).await?;
        Ok(deleted)
    }
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
        assert_eq!(cs.forget_before(3).await.unwrap(), 8);
        assert!(cs.member_state(1, 0, 0).await.unwrap().is_none());
        assert_eq!(cs.member_state(1, 0, 2).await.unwrap().unwrap().state, [2]);
        assert!(cs.member(0, 1, 2).await.unwrap().is_none());
        assert!(cs.member(0, 1, 3).await.unwrap().is_some());
        let log = cs.driver_log().await.unwrap();
        assert_eq!(log.last_at(4), Some(true));
        assert_eq!(cs.forget_before(4).await.unwrap(), 0, "done at 3 already");
        // A whole state at 3 ends the chain before it.
        let whole = MemberObject {
            state: Some((StateKind::Whole, vec![33])),
            ..Default::default()
        };
        cs.drop_states_after(1, 0, Some(2)).await.unwrap();
        cs.put_member(1, 0, 3, whole).await.unwrap();
        assert_eq!(cs.forget_now(3).await.unwrap(), 2);
        assert_eq!(cs.member_state(1, 0, 3).await.unwrap().unwrap().state, [33]);
    }
}
