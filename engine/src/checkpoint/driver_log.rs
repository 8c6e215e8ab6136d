//! The driver's side of the store: its decisions (is an epoch the run's
//! last?) are durable before the epoch fires, so a restart decides the
//! same; its commits say which epoch a restart resumes after. Both go in
//! one object where they can: a commit carries the decisions for the
//! epochs after it (`commit.json`); decisions no commit carried stand alone
//! (`epochs/<from>.json`), one object per decision. The commit also
//! carries the driver's progress for `skein ui` (progress.rs).

use serde::{Deserialize, Serialize};

use super::{CheckpointStore, CommitRecord, Failure, Kind, Progress, epoch_name};
use crate::error::Result;

/// The last committed epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    /// The epoch committed.
    pub epoch: u64,
    /// It was the last epoch of its run: every window was flushed.
    pub last: bool,
}

/// The driver's decisions for the epochs `from..=through`, made before any
/// of them fires: none is the run's last, except `through` when `last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decided {
    /// The first epoch decided.
    pub from: u64,
    /// The last epoch decided.
    pub through: u64,
    /// `through` is the run's last epoch: every window is flushed in it.
    pub last: bool,
}

impl Decided {
    /// Whether `epoch` is decided here, and if so whether it is the last.
    pub fn last_at(&self, epoch: u64) -> Option<bool> {
        (self.from..=self.through)
            .contains(&epoch)
            .then_some(self.last && epoch == self.through)
    }
}

/// What the driver recorded of one epoch; it rides in the next commit, so
/// more figures can be added here without another request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The epoch.
    pub epoch: u64,
    /// Source records it read.
    pub events: u64,
    /// From firing it until it had run everywhere, ms.
    pub ms: u64,
}

/// Members per function group, by stage id, as a commit records them: a
/// member restoring from that commit reads the states of the members its
/// stage had then. Empty in commits written before groups could change
/// size (then every group has the size its context says).
pub type Layout = std::collections::BTreeMap<u32, u32>;

/// `commit.json`.
#[derive(Debug, Serialize, Deserialize)]
struct CommitObject {
    /// The commit and the driver's progress up to it.
    #[serde(flatten)]
    record: CommitRecord,
    /// The size of every function group the epochs up to it ran in.
    #[serde(default, skip_serializing_if = "Layout::is_empty")]
    layout: Layout,
    /// The decisions for the epochs after the commit, when made with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    decided: Option<Decided>,
    /// The epochs since the previous commit, as the driver saw them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    epochs: Vec<EpochRecord>,
}

/// What a (re)starting driver finds: the last commit and every decision
/// for an epoch after it.
#[derive(Debug, Clone, Default)]
pub struct DriverLog {
    /// The last commit.
    pub committed: Option<Commit>,
    /// Decisions for epochs after it.
    pub decided: Vec<Decided>,
    /// The driver's progress recorded with the commit, to go on from.
    pub progress: Progress,
}

impl DriverLog {
    /// Whether `epoch` was decided to be the last, if it was decided.
    pub fn last_at(&self, epoch: u64) -> Option<bool> {
        self.decided.iter().rev().find_map(|d| d.last_at(epoch))
    }

    /// The highest epoch decided, if any: later ones cannot have fired.
    pub fn highest(&self) -> Option<u64> {
        self.decided.iter().map(|d| d.through).max()
    }
}

impl CheckpointStore {
    /// The last committed epoch, if any.
    pub async fn committed(&self) -> Result<Option<Commit>> {
        Ok(self.commit_record().await?.map(|r| r.commit))
    }

    /// The last commit and the group sizes it was made in.
    pub async fn committed_in(&self) -> Result<Option<(Commit, Layout)>> {
        Ok(self
            .commit_record_in()
            .await?
            .map(|(record, layout)| (record.commit, layout)))
    }

    /// The last commit with the progress recorded with it, if any.
    pub async fn commit_record(&self) -> Result<Option<CommitRecord>> {
        Ok(self.commit_record_in().await?.map(|(r, _)| r))
    }

    /// [`Self::commit_record`] and the group sizes the commit was made in.
    pub async fn commit_record_in(&self) -> Result<Option<(CommitRecord, Layout)>> {
        Ok(self
            .get_json::<CommitObject>(&self.key(&["commit.json"]))
            .await?
            .map(|c| (c.record, c.layout)))
    }

    /// Record a failed epoch (the last one is kept): rare, and possibly
    /// before any commit, so an object of its own.
    pub async fn put_failure(&self, failure: &Failure) -> Result<()> {
        self.put_json(Kind::Other, &self.key(&["failure.json"]), failure)
            .await
    }

    /// The last failed epoch, if one failed.
    pub async fn failure(&self) -> Result<Option<Failure>> {
        self.get_json(&self.key(&["failure.json"])).await
    }

    /// The last commit and the decisions after it (read once, by a
    /// starting driver: the commit and a listing of the lone decisions).
    pub async fn driver_log(&self) -> Result<DriverLog> {
        let commit = self
            .get_json::<CommitObject>(&self.key(&["commit.json"]))
            .await?;
        let after = commit.as_ref().map_or(0, |c| c.record.commit.epoch + 1);
        let mut decided: Vec<Decided> = commit
            .as_ref()
            .and_then(|c| c.decided)
            .into_iter()
            .collect();
        let mut lone = self.list_epochs(&["epochs"]).await?;
        lone.retain(|(_, through, _)| *through >= after);
        lone.sort_by_key(|(_, through, _)| *through);
        for (key, _, _) in lone {
            decided.extend(self.get_json::<Decided>(&key).await?);
        }
        decided.retain(|d| d.through >= after);
        let (committed, progress) = match commit {
            Some(c) => (Some(c.record.commit), c.record.progress),
            None => (None, Progress::default()),
        };
        Ok(DriverLog {
            committed,
            decided,
            progress,
        })
    }

    /// Record `commit` as the last committed epoch, with the decisions for
    /// the epochs after it (when made now), what the driver recorded of
    /// the epochs since the previous commit and its progress: one object.
    pub async fn commit(
        &self,
        commit: Commit,
        decided: Option<Decided>,
        epochs: Vec<EpochRecord>,
        progress: &Progress,
    ) -> Result<()> {
        self.commit_in(commit, decided, epochs, progress, &Layout::new())
            .await
    }

    /// [`Self::commit`], recording the size of every function group.
    pub async fn commit_in(
        &self,
        commit: Commit,
        decided: Option<Decided>,
        epochs: Vec<EpochRecord>,
        progress: &Progress,
        layout: &Layout,
    ) -> Result<()> {
        let object = CommitObject {
            record: CommitRecord {
                commit,
                progress: progress.clone(),
            },
            layout: layout.clone(),
            decided,
            epochs,
        };
        self.put_json(Kind::Driver, &self.key(&["commit.json"]), &object)
            .await
    }

    /// Write decisions no commit carries, before the first of them fires.
    pub async fn decide(&self, decided: Decided) -> Result<()> {
        let name = format!("{}.json", epoch_name(decided.through));
        self.put_json(Kind::Driver, &self.key(&["epochs", &name]), &decided)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use object_store::path::Path;

    use super::*;

    #[tokio::test]
    async fn a_restart_finds_the_commit_and_the_decisions_after_it() {
        let cs = CheckpointStore::open(Arc::new(InMemory::new()), Path::from("q"), "abc")
            .await
            .unwrap();
        let log = cs.driver_log().await.unwrap();
        assert_eq!((log.committed, log.highest()), (None, None));
        let first = Decided {
            from: 0,
            through: 0,
            last: false,
        };
        cs.decide(first).await.unwrap();
        let next = Decided {
            from: 1,
            through: 4,
            last: true,
        };
        let commit = Commit {
            epoch: 0,
            last: false,
        };
        let mut progress = Progress::default();
        progress.epoch(
            1_000,
            crate::checkpoint::EpochFigures {
                events: 42,
                ..Default::default()
            },
        );
        cs.commit(commit, Some(next), vec![EpochRecord::default()], &progress)
            .await
            .unwrap();
        cs.decide(Decided {
            from: 5,
            through: 5,
            last: false,
        })
        .await
        .unwrap();
        let log = cs.driver_log().await.unwrap();
        assert_eq!(log.committed, Some(commit));
        assert_eq!(
            log.decided.len(),
            2,
            "the decision for 0 is committed: {log:?}"
        );
        assert_eq!(log.last_at(0), None);
        assert_eq!(log.last_at(2), Some(false));
        assert_eq!(log.last_at(4), Some(true));
        assert_eq!(log.last_at(5), Some(false));
        assert_eq!(log.highest(), Some(5));
        assert_eq!(cs.committed().await.unwrap(), Some(commit));
        assert_eq!(log.progress.totals.events, 42);
        let record = cs.commit_record().await.unwrap().unwrap();
        assert_eq!(record.progress.totals.events, 42);
    }
}
