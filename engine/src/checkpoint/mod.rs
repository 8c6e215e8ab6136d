//! Durable state: the write-ahead log of what each source member read, the
//! state of each stateful member, and the commit log, on an object store (a
//! local directory in-process, S3 on Lambda).
//!
//! Layout under the store's root (one root per query):
//!
//! ```text
//! manifest.json                      the query it belongs to (its text) and the run lineage
//! commit.json                        the last epoch every member finished, and the
//!                                    driver's progress up to it (progress.rs)
//! epochs/<e>.json                    the driver's decisions for epoch e (is it the last?)
//! offsets/<stage>-<member>/<e>.json  what a source member read in epoch e
//! state/<stage>-<member>/<e>.bin     a stateful member's whole state as of the end of e
//! state/<stage>-<member>/<e>.changes.bin  or its changes since an earlier state
//! tally/<stage>-<member>.json        a member's counts and figures (tally.rs)
//! failure.json                       the last epoch that failed, and why
//! sinks/<stage>-<member>.json        a sink member's health, once it has failed
//! ```
//!
//! An epoch is committed once every member has run it, written its state and
//! its sink writes: a restart resumes after the last commit, re-running later
//! epochs from the offsets log (same records, same watermarks), and sinks
//! skip what they already hold by (run, epoch, member).

mod progress;
mod sink_health;
mod snapshot;
mod summary;
mod tally;

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::payload::SourceOffset;
use crate::watermark::ClockState;

pub use progress::{
    BUCKET_MS, CheckpointFigures, CommitRecord, EpochFigures, Failure, Point, Progress, Totals,
};
pub use snapshot::{
    MemberChanges, MemberState, Snapshot, decode_state, encode_changes, encode_state,
};
pub use summary::StoreSummary;
pub use tally::{FIGURES_EVERY, Live, MemberFigures, MemberRecord, MemberTally, Reason, Tally};

/// What a checkpoint store belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The digest of the query text the store was written for.
    pub query_code: String,
    /// The run lineage every restart from this store keeps.
    pub run: String,
    /// The query as it was planned, for readers that have only the store
    /// (`skein ui`); none in a store written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub described: Option<Description>,
}

/// What it takes to plan a store's query again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Description {
    /// The query text.
    pub sql: String,
    /// Members of each function group.
    pub group_size: usize,
}

/// The last committed epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    /// The epoch committed.
    pub epoch: u64,
    /// It was the last epoch of its run: every window was flushed.
    pub last: bool,
}

/// The driver's decisions for one epoch, written before it fires it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochPlan {
    /// This epoch is the run's last: every window is flushed in it.
    pub last: bool,
}

/// What one table's reader of a source member read in one epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRead {
    /// The table read.
    pub table: String,
    /// Where the reader stood before the pull (next offset per partition).
    pub from: Vec<SourceOffset>,
    /// Where it stood after.
    pub to: Vec<SourceOffset>,
    /// The table's event-time clock after the pull, if it has event time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockState>,
}

/// A source member's log entry for one epoch: enough to read exactly the
/// same records again and send them with the same watermark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetsEntry {
    /// What each table's reader read.
    pub tables: Vec<TableRead>,
    /// The watermark the member sent with the epoch.
    pub watermark: Option<i64>,
    /// Every partition behind that watermark was idle.
    pub idle: bool,
    /// Every partition had reached the end it had at open.
    pub drained: bool,
    /// Every partition had reached its end (a bounded source).
    pub finished: bool,
    /// The run's number of epochs when it was bounded: generators slice
    /// their input by it, so a resume must keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<u64>,
    /// A pushed epoch: the records in its range that could not be taken
    /// (reported to the platform again if it redelivers them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub poison: Vec<PoisonRecord>,
}

/// A pushed record that could not be taken: undecodable with no
/// dead-letter destination to send it to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoisonRecord {
    /// Shard (partition) and sequence number (position).
    pub partition: String,
    /// Its sequence number.
    pub position: String,
    /// Why it could not be taken.
    pub reason: String,
}

/// A query's checkpoint store.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    manifest: Manifest,
    /// Bytes this handle has written (what a checkpoint costs).
    written: Arc<std::sync::atomic::AtomicU64>,
    /// Objects this handle has written (S3 PUT requests, what they cost).
    puts: Arc<std::sync::atomic::AtomicU64>,
    /// The commit this handle last cleaned up after (listing costs).
    forgot_at: Arc<std::sync::Mutex<Option<u64>>>,
}

/// Commits between clean-ups: each lists the store, and what waits for the
/// next one costs only space.
const FORGET_EVERY: u64 = 16;

fn epoch_name(e: u64) -> String {
    // Zero-padded so that listings sort by epoch.
    format!("{e:020}")
}

fn corrupt(key: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::Context(format!("checkpoint {key}: {e}"))
}

impl CheckpointStore {
    /// Open the store under `root` for the query `query_code`: a new store
    /// gets a manifest with a fresh run lineage; a store written for another
    /// query is refused.
    pub async fn open(store: Arc<dyn ObjectStore>, root: Path, query_code: &str) -> Result<Self> {
        let key = root.clone().join("manifest.json");
        let manifest = match get_json::<Manifest>(&store, &key).await? {
            Some(m) if m.query_code != query_code => {
                return Err(EngineError::Context(format!(
                    "the checkpoint store {root} belongs to query {}, not this query ({query_code}): \
                     the query text changed; give another checkpoint directory or remove this one",
                    m.query_code
                )));
            }
            Some(m) => m,
            None => {
                let m = Manifest {
                    query_code: query_code.to_string(),
                    run: fresh_run(query_code),
                    described: None,
                };
                put_json(&store, &key, &m).await?;
                m
            }
        };
        Ok(CheckpointStore {
            store,
            root,
            manifest,
            written: Default::default(),
            puts: Default::default(),
            forgot_at: Default::default(),
        })
    }

    /// A store whose manifest is known (a function instance: the driver
    /// opened the store and its lineage travels in the context).
    pub fn attach(store: Arc<dyn ObjectStore>, root: Path, query_code: &str, run: &str) -> Self {
        CheckpointStore {
            store,
            root,
            manifest: Manifest {
                query_code: query_code.to_string(),
                run: run.to_string(),
                described: None,
            },
            written: Default::default(),
            puts: Default::default(),
            forgot_at: Default::default(),
        }
    }

    /// The store's manifest: the query and run lineage it belongs to.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Record the query's text and group size in the manifest, if it does
    /// not hold them already (one write per run at most).
    pub async fn describe(&mut self, described: Description) -> Result<()> {
        if self.manifest.described.as_ref() == Some(&described) {
            return Ok(());
        }
        self.manifest.described = Some(described);
        let key = self.key(&["manifest.json"]);
        put_json(&self.store, &key, &self.manifest).await
    }

    /// The manifest as the store holds it, if there is one.
    pub async fn read_manifest(&self) -> Result<Option<Manifest>> {
        get_json(&self.store, &self.key(&["manifest.json"])).await
    }

    /// The store's root path in its object store.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Bytes written through this handle so far.
    pub fn bytes_written(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Objects written through this handle so far.
    pub fn puts(&self) -> u64 {
        self.puts.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn put(&self, key: &Path, bytes: Vec<u8>) -> Result<()> {
        let len = bytes.len();
        let started = std::time::Instant::now();
        self.store.put(key, PutPayload::from(bytes)).await?;
        crate::metrics::checkpoint_write(len, started.elapsed());
        self.written
            .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        self.puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    async fn put_json<T: Serialize>(&self, key: &Path, value: &T) -> Result<()> {
        let bytes = serde_json::to_vec(value).map_err(|e| corrupt(key, e))?;
        self.put(key, bytes).await
    }

    fn key(&self, parts: &[&str]) -> Path {
        let mut p = self.root.clone();
        for part in parts {
            p = p.join(*part);
        }
        p
    }

    fn member_dir(stage: u32, member: u32) -> String {
        format!("{stage:02}-{member:02}")
    }

    /// The last committed epoch, if any.
    pub async fn committed(&self) -> Result<Option<Commit>> {
        get_json(&self.store, &self.key(&["commit.json"])).await
    }

    /// Record `commit` as the last committed epoch.
    pub async fn commit(&self, commit: Commit) -> Result<()> {
        self.commit_with(commit, &Progress::default()).await
    }

    /// Record `commit` as the last committed epoch, with the driver's
    /// progress up to it.
    pub async fn commit_with(&self, commit: Commit, progress: &Progress) -> Result<()> {
        let record = CommitRecord {
            commit,
            progress: progress.clone(),
        };
        self.put_json(&self.key(&["commit.json"]), &record).await
    }

    /// Record a failed epoch (the last one is kept).
    pub async fn put_failure(&self, failure: &Failure) -> Result<()> {
        self.put_json(&self.key(&["failure.json"]), failure).await
    }

    /// The last failed epoch, if one failed.
    pub async fn failure(&self) -> Result<Option<Failure>> {
        get_json(&self.store, &self.key(&["failure.json"])).await
    }

    /// The last commit with the progress recorded with it, if any.
    pub async fn commit_record(&self) -> Result<Option<CommitRecord>> {
        get_json(&self.store, &self.key(&["commit.json"])).await
    }

    /// The plan the driver wrote for `epoch`, if it wrote one.
    pub async fn epoch_plan(&self, epoch: u64) -> Result<Option<EpochPlan>> {
        let name = format!("{}.json", epoch_name(epoch));
        get_json(&self.store, &self.key(&["epochs", &name])).await
    }

    /// Write the driver's plan for `epoch` before firing it.
    pub async fn put_epoch_plan(&self, epoch: u64, plan: EpochPlan) -> Result<()> {
        let name = format!("{}.json", epoch_name(epoch));
        self.put_json(&self.key(&["epochs", &name]), &plan).await
    }

    /// The offsets log entry of a source member for an epoch, if written.
    pub async fn offsets(
        &self,
        stage: u32,
        member: u32,
        epoch: u64,
    ) -> Result<Option<OffsetsEntry>> {
        let name = format!("{}.json", epoch_name(epoch));
        let dir = Self::member_dir(stage, member);
        get_json(&self.store, &self.key(&["offsets", &dir, &name])).await
    }

    /// Write a source member's offsets log entry for an epoch.
    pub async fn put_offsets(
        &self,
        stage: u32,
        member: u32,
        epoch: u64,
        entry: &OffsetsEntry,
    ) -> Result<()> {
        let name = format!("{}.json", epoch_name(epoch));
        let dir = Self::member_dir(stage, member);
        self.put_json(&self.key(&["offsets", &dir, &name]), entry)
            .await
    }

    /// Like [`Self::put_offsets`], but only if no entry for the epoch
    /// exists: `false` when one does (another writer took the epoch).
    pub async fn put_offsets_new(
        &self,
        stage: u32,
        member: u32,
        epoch: u64,
        entry: &OffsetsEntry,
    ) -> Result<bool> {
        let name = format!("{}.json", epoch_name(epoch));
        let key = self.key(&["offsets", &Self::member_dir(stage, member), &name]);
        let bytes = serde_json::to_vec(entry).map_err(|e| corrupt(&key, e))?;
        self.written
            .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let opts = object_store::PutOptions::from(object_store::PutMode::Create);
        match self
            .store
            .put_opts(&key, PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    fn state_key(&self, stage: u32, member: u32, epoch: u64, whole: bool) -> Path {
        let kind = if whole { "bin" } else { "changes.bin" };
        let name = format!("{}.{kind}", epoch_name(epoch));
        self.key(&["state", &Self::member_dir(stage, member), &name])
    }

    /// A member's state object for an epoch: whole or changes (its header
    /// says which).
    pub async fn state(&self, stage: u32, member: u32, epoch: u64) -> Result<Option<Vec<u8>>> {
        for whole in [true, false] {
            let key = self.state_key(stage, member, epoch, whole);
            if let Some(bytes) = get_bytes(&self.store, &key).await? {
                return Ok(Some(bytes));
            }
        }
        Ok(None)
    }

    /// Write a member's state for an epoch. Only one instance of a member
    /// writes at a time, and a cold one first drops what an earlier
    /// instance wrote past the commit ([`Self::drop_states_after`]), so
    /// the whole and the changes of one epoch never both stand.
    pub async fn put_state(
        &self,
        stage: u32,
        member: u32,
        epoch: u64,
        whole: bool,
        bytes: Vec<u8>,
    ) -> Result<()> {
        self.put(&self.state_key(stage, member, epoch, whole), bytes)
            .await
    }

    /// Delete a member's states of epochs after `commit` (all of them when
    /// nothing is committed): an earlier instance wrote them for epochs
    /// that a restart runs again. Returns how many.
    pub async fn drop_states_after(
        &self,
        stage: u32,
        member: u32,
        commit: Option<u64>,
    ) -> Result<u64> {
        let mut dropped = 0;
        let dir = Self::member_dir(stage, member);
        for (location, epoch) in self.list_epochs(&["state", &dir]).await? {
            if commit.is_none_or(|c| epoch > c) {
                delete_if_there(&self.store, &location).await?;
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    /// The highest epoch the driver has decided, if any (listed).
    pub async fn last_planned_epoch(&self) -> Result<Option<u64>> {
        let listed = self.list_epochs(&["epochs"]).await?;
        Ok(listed.into_iter().map(|(_, e)| e).max())
    }

    /// The objects under a directory whose names start with an epoch
    /// (`<epoch>.json`, `<epoch>.bin`, ...), with that epoch.
    async fn list_epochs(&self, parts: &[&str]) -> Result<Vec<(Path, u64)>> {
        use futures::TryStreamExt;
        let objects: Vec<_> = self
            .store
            .list(Some(&self.key(parts)))
            .try_collect()
            .await?;
        Ok(objects
            .into_iter()
            .filter_map(|o| {
                let epoch = o.location.filename()?.split('.').next()?.parse().ok()?;
                Some((o.location, epoch))
            })
            .collect())
    }

    /// Delete what no restart can need once `commit` is committed: epoch
    /// plans and log entries of epochs before it (the committed epoch's own
    /// entry is where a restart starts), and per member the states before
    /// the newest whole state at or before it (the changes after that whole
    /// state rebuild the committed one). Done at most every
    /// [`FORGET_EVERY`] commits of this handle.
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
        let mut deleted = 0;
        for dir in ["epochs", "offsets", "state"] {
            let parsed: Vec<(Path, u64, bool)> = self
                .list_epochs(&[dir])
                .await?
                .into_iter()
                .map(|(location, epoch)| {
                    let whole = !location.as_ref().ends_with(".changes.bin");
                    (location, epoch, whole)
                })
                .collect();
            // Per member directory: where its chain for `commit` starts.
            let mut keep_from: std::collections::HashMap<String, u64> = Default::default();
            if dir == "state" {
                for (location, epoch, whole) in &parsed {
                    if *whole && *epoch <= commit {
                        let e = keep_from.entry(parent(location)).or_insert(*epoch);
                        *e = (*e).max(*epoch);
                    }
                }
            }
            for (location, epoch, _) in parsed {
                let before = match dir {
                    "state" => keep_from.get(&parent(&location)).copied().unwrap_or(0),
                    _ => commit,
                };
                if epoch < before {
                    delete_if_there(&self.store, &location).await?;
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }
}

/// The directory part of a key.
fn parent(location: &Path) -> String {
    let s = location.as_ref();
    s.rsplit_once('/').map_or("", |(dir, _)| dir).to_string()
}

/// A run lineage nobody has used: the query, the time and some randomness.
pub fn fresh_run(query_code: &str) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!(
        "{}-{millis:x}-{:08x}",
        &query_code[..query_code.len().min(8)],
        rand::random::<u32>()
    )
}

async fn delete_if_there(store: &Arc<dyn ObjectStore>, key: &Path) -> Result<()> {
    match store.delete(key).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn get_bytes(store: &Arc<dyn ObjectStore>, key: &Path) -> Result<Option<Vec<u8>>> {
    match store.get(key).await {
        Ok(r) => Ok(Some(r.bytes().await?.to_vec())),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

async fn get_json<T: DeserializeOwned>(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
) -> Result<Option<T>> {
    match get_bytes(store, key).await? {
        Some(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| corrupt(key, e)),
        None => Ok(None),
    }
}

async fn put_json<T: Serialize>(store: &Arc<dyn ObjectStore>, key: &Path, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec(value).map_err(|e| corrupt(key, e))?;
    store.put(key, PutPayload::from(bytes)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn a_store_remembers_its_query_and_refuses_another() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let a = CheckpointStore::open(store.clone(), Path::from("q"), "abc")
            .await
            .unwrap();
        let again = CheckpointStore::open(store.clone(), Path::from("q"), "abc")
            .await
            .unwrap();
        assert_eq!(a.manifest(), again.manifest());
        let err = CheckpointStore::open(store, Path::from("q"), "other")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("belongs to query abc"), "{err}");
    }

    #[tokio::test]
    async fn commits_log_entries_and_forgetting() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let cs = CheckpointStore::open(store, Path::from("q"), "abc")
            .await
            .unwrap();
        assert_eq!(cs.committed().await.unwrap(), None);
        for e in 0..5 {
            cs.put_epoch_plan(e, EpochPlan { last: e == 4 })
                .await
                .unwrap();
            let entry = OffsetsEntry {
                tables: vec![TableRead {
                    table: "t".into(),
                    from: vec![],
                    to: vec![SourceOffset {
                        source: "t".into(),
                        partition: 0,
                        offset: e as i64,
                        position: None,
                    }],
                    clock: None,
                }],
                watermark: Some(e as i64),
                idle: false,
                drained: false,
                finished: false,
                epochs: None,
                poison: vec![],
            };
            cs.put_offsets(0, 1, e, &entry).await.unwrap();
            // Whole at 1, changes after it.
            cs.put_state(1, 0, e, e <= 1, vec![e as u8]).await.unwrap();
        }
        cs.commit(Commit {
            epoch: 3,
            last: false,
        })
        .await
        .unwrap();
        assert_eq!(cs.committed().await.unwrap().unwrap().epoch, 3);
        // Plans and entries of 0..3; the state of 0 (1 is whole, and 2 and
        // 3 build on it).
        assert_eq!(cs.forget_before(3).await.unwrap(), 7);
        assert!(cs.state(1, 0, 0).await.unwrap().is_none());
        assert_eq!(cs.state(1, 0, 2).await.unwrap().unwrap().as_slice(), &[2]);
        assert_eq!(cs.state(1, 0, 3).await.unwrap().unwrap().as_slice(), &[3]);
        // A cold member drops what an earlier instance wrote past the
        // commit; then its whole state stands alone.
        assert_eq!(cs.drop_states_after(1, 0, Some(3)).await.unwrap(), 1);
        assert_eq!(cs.drop_states_after(1, 0, Some(2)).await.unwrap(), 1);
        cs.put_state(1, 0, 3, true, vec![33]).await.unwrap();
        assert_eq!(cs.state(1, 0, 3).await.unwrap().unwrap().as_slice(), &[33]);
        assert_eq!(cs.forget_before(3).await.unwrap(), 0, "done at 3 already");
        assert_eq!(cs.forget_now(3).await.unwrap(), 2);
        assert!(cs.bytes_written() > 0);
        assert!(cs.offsets(0, 1, 2).await.unwrap().is_none());
        assert_eq!(
            cs.offsets(0, 1, 3).await.unwrap().unwrap().watermark,
            Some(3)
        );
        assert!(cs.epoch_plan(4).await.unwrap().unwrap().last);
        assert_eq!(cs.last_planned_epoch().await.unwrap(), Some(4));
    }
}
