//! Everything the page reads from a query's checkpoint store, in one
//! place: the manifest (the query's text), the driver's commit record (its
//! progress), the last failed epoch and every member's record (counts and
//! figures). A change of the store's layout changes this file only.

use std::path::Path;

use skein_engine::checkpoint::{
    CheckpointStore, CommitRecord, Description, Failure, Layout, MemberRecord, StoreSummary,
};

use crate::error::UiError;

/// What one read of a store found.
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// The last commit and the driver's progress up to it.
    pub commit: Option<CommitRecord>,
    /// The group sizes of that commit, by stage id (a rescale changes
    /// them; empty before the first commit).
    pub layout: Layout,
    /// The last epoch that failed.
    pub failure: Option<Failure>,
    /// Every member's record, by (stage, member).
    pub members: Vec<((u32, u32), MemberRecord)>,
    /// The last epoch decided, the commit's time and the state's bytes.
    pub summary: StoreSummary,
}

/// A local checkpoint directory's store, and the query it belongs to with
/// its text where the manifest records it.
pub async fn open_local(dir: &Path) -> Result<(CheckpointStore, Option<Description>), UiError> {
    let probe = CheckpointStore::attach_dir(dir.to_path_buf(), "", "");
    let manifest = probe
        .read_manifest()
        .await
        .map_err(|e| UiError::store(dir.display(), e))?
        .ok_or_else(|| UiError::store(dir.display(), "no manifest.json"))?;
    let store = CheckpointStore::attach_dir(dir.to_path_buf(), &manifest.query_code, &manifest.run);
    Ok((store, manifest.described))
}

/// A checkpoint location on S3 (or `file:///`) of a query on Lambda.
pub fn open_url(url: &str, query_code: &str) -> Result<CheckpointStore, UiError> {
    let (store, root) =
        skein_lambda::checkpoints::locate(url).map_err(|e| UiError::store(url, e))?;
    Ok(CheckpointStore::attach(store, root, query_code, ""))
}

/// Read what the page shows of `store`.
pub async fn read(store: &CheckpointStore) -> Result<Records, UiError> {
    let at = || store.root().to_string();
    let (commit, layout) = match store
        .commit_record_in()
        .await
        .map_err(|e| UiError::store(at(), e))?
    {
        Some((commit, layout)) => (Some(commit), layout),
        None => (None, Layout::default()),
    };
    Ok(Records {
        commit,
        layout,
        failure: store.failure().await.map_err(|e| UiError::store(at(), e))?,
        members: store
            .member_records()
            .await
            .map_err(|e| UiError::store(at(), e))?,
        summary: store.summary().await.map_err(|e| UiError::store(at(), e))?,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use object_store::memory::InMemory;
    use object_store::path::Path as StorePath;
    use skein_engine::checkpoint::{Commit, MemberTally, Progress};

    #[tokio::test]
    async fn what_the_driver_and_members_wrote_reads_back() {
        let cs = CheckpointStore::open(Arc::new(InMemory::new()), StorePath::from("q"), "code")
            .await
            .unwrap();
        let mut progress = Progress::default();
        progress.epoch(
            1_000_000,
            skein_engine::checkpoint::EpochFigures {
                events: 42,
                took_ms: 7.0,
                lag: Some(3),
                ..Default::default()
            },
        );
        let commit = Commit {
            epoch: 0,
            last: false,
        };
        cs.commit(commit, None, vec![], &progress).await.unwrap();
        let tally = MemberTally::default();
        tally.measure(|l| {
            l.invocation(std::time::Duration::from_millis(5));
            l.rows_out += 10;
            l.reason("late", "bids", "2 rows after their window");
        });
        tally.save(&cs, 1, 0).await.unwrap();
        let got = read(&cs).await.unwrap();
        let commit = got.commit.unwrap();
        assert_eq!(commit.progress.totals.events, 42);
        assert_eq!(commit.progress.lag, Some(3));
        let (key, member) = &got.members[0];
        assert_eq!(*key, (1, 0));
        let figures = member.figures.as_ref().unwrap();
        assert_eq!((figures.invocations, figures.rows_out), (1, 10));
        assert_eq!(figures.reasons[0].kind, "late");
        assert!(got.failure.is_none());
    }
}
