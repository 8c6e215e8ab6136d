//! Durable state: the write-ahead log of what each source member read, the
//! state of each stateful member, and the driver's decisions and commits,
//! on an object store (a local directory in-process, S3 or S3 Express One
//! Zone on Lambda).
//!
//! Layout under the store's root (one root per query), made so that a
//! checkpoint costs as few requests as it can: one object per member per
//! epoch it has something to keep in, and one object per commit.
//!
//! ```text
//! manifest.json                       the query it belongs to (its text), the run lineage,
//!                                     the layout
//! commit.json                         the driver's object at a commit: the last committed
//!                                     epoch, the decisions for the epochs after it, what
//!                                     the driver recorded of the epochs since the last one,
//!                                     and its progress for `skein ui` (progress.rs)
//! epochs/<e>.json                     decisions for epochs from e that no commit carried
//! members/<stage>-<member>/<e>.bin          a member's object for epoch e: its offsets-log
//!                                           entry (a source member; a Kafka source's only at
//!                                           checkpoints, between them its source keeps it:
//!                                           function/source_note.rs), its counts and figures
//! members/<stage>-<member>/<e>.state.bin    ... with its whole state as of the end of e
//! members/<stage>-<member>/<e>.changes.bin  ... with its changes since an earlier state
//! tally/<stage>-<member>.json         the counts and figures of a member that writes no
//!                                     epoch objects (tally.rs)
//! failure.json                        the last epoch that failed, and why
//! sinks/<stage>-<member>.json         a sink member's health, once it has failed
//! ```
//!
//! An epoch is committed once every member has run it, written its state and
//! its sink writes: a restart resumes after the last commit, re-running later
//! epochs from the offsets log (same records, same watermarks), and sinks
//! skip what they already hold by (run, epoch, member). What no restart can
//! need any more is deleted now and then in one batched request
//! ([`CheckpointStore::forget_before`]).

mod driver_log;
mod forget;
mod io;
mod member;
mod progress;
mod rescale;
mod segments;
mod sink_reports;
mod snapshot;
mod summary;
mod tally;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use object_store::ObjectStore;
use object_store::path::Path;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::payload::SourceOffset;
use crate::watermark::ClockState;

pub use driver_log::{Commit, Decided, DriverLog, EpochRecord, Layout};
pub use member::{MemberObject, MemberRead, StateKind};
pub use progress::{
    BUCKET_MS, CheckpointFigures, CommitRecord, EpochFigures, Failure, Point, Progress, Totals,
};
pub use rescale::RescaleRequest;
pub use snapshot::{
    MemberChanges, MemberState, Snapshot, decode_state, encode_changes, encode_state,
};
pub use summary::StoreSummary;
pub use tally::{FIGURES_EVERY, Live, MemberFigures, MemberRecord, MemberTally, Reason, Tally};

use io::Backend;

/// The layout this version writes (see the module's documentation).
const LAYOUT: u32 = 2;
/// A local directory's layout: 3 holds objects in segment files
/// (`segments.rs`); 2 had a file per object.
const DIR_LAYOUT: u32 = 3;

/// The object `key` of the checkpoint directory `dir` as it stands, read
/// from outside the process that holds it (tools and tests that watch a run).
pub fn local_object(dir: &std::path::Path, key: &str) -> Result<Option<Vec<u8>>> {
    segments::SegmentDir::new(dir.to_path_buf()).get(&Path::from(key))
}

/// The keys under `prefix` of the checkpoint directory `dir`, as it stands.
pub fn local_keys(dir: &std::path::Path, prefix: &str) -> Result<Vec<String>> {
    let listed = segments::SegmentDir::new(dir.to_path_buf()).list(&Path::from(prefix))?;
    Ok(listed.into_iter().map(|l| l.key.to_string()).collect())
}

/// What a checkpoint store belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The digest of the query text the store was written for.
    pub query_code: String,
    /// The run lineage every restart from this store keeps.
    pub run: String,
    /// The layout of the store's objects; stores from before layouts were
    /// numbered have none.
    #[serde(default)]
    pub layout: u32,
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
    /// The instances each source table reads with: a resumed query keeps
    /// them (the offsets log is kept per instance). None where the store
    /// is not a local directory (`skein run` records them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<std::collections::BTreeMap<String, usize>>,
    /// The query's name (`--name`, a `-- name:` line, or its file's stem);
    /// its code stays the identity of its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
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
    backend: Backend,
    root: Path,
    manifest: Manifest,
    /// What this handle has written (what a checkpoint costs).
    counts: Arc<Counters>,
    /// The commit this handle last cleaned up after (listing costs).
    forgot_at: Arc<std::sync::Mutex<Option<u64>>>,
}

/// What a handle wrote, by kind of object.
#[derive(Debug, Default)]
struct Counters {
    bytes: AtomicU64,
    entries: AtomicU64,
    states: AtomicU64,
    driver: AtomicU64,
    other: AtomicU64,
}

/// The kinds of object a checkpoint writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A member object without state (a source member's log entry).
    Entry,
    /// A member object with state.
    State,
    /// A commit or a decision of the driver.
    Driver,
    /// The manifest, counts written alone.
    Other,
}

/// Objects written through a handle (S3 PUT requests), by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PutCounts {
    /// Member objects without state: source members' log entries, one per
    /// member per epoch.
    pub entries: u64,
    /// Member objects with state: one per stateful member per commit.
    pub states: u64,
    /// The driver's commits and decisions.
    pub driver: u64,
    /// Manifests and counts written alone.
    pub other: u64,
}

impl PutCounts {
    /// Every object.
    pub fn total(&self) -> u64 {
        self.entries + self.states + self.driver + self.other
    }
}

fn epoch_name(e: u64) -> String {
    // Zero-padded so that listings sort by epoch.
    format!("{e:020}")
}

/// The epoch an object's name starts with (`<epoch>.json`, `<epoch>.bin`, ...).
fn epoch_of(key: &Path) -> Option<u64> {
    key.filename()?.split('.').next()?.parse().ok()
}

fn corrupt(key: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::Context(format!("checkpoint {key}: {e}"))
}

impl CheckpointStore {
    /// Open the store under `root` of `store` for the query `query_code`: a
    /// new store gets a manifest with a fresh run lineage; a store written
    /// for another query, or in another layout, is refused.
    pub async fn open(store: Arc<dyn ObjectStore>, root: Path, query_code: &str) -> Result<Self> {
        Self::open_on(Backend::Objects(store), root, query_code).await
    }

    /// [`Self::open`] on a local directory, written in place.
    pub async fn open_dir(dir: PathBuf, query_code: &str) -> Result<Self> {
        Self::open_on(Backend::dir(dir), Path::from(""), query_code).await
    }

    async fn open_on(backend: Backend, root: Path, query_code: &str) -> Result<Self> {
        let layout = backend.layout();
        let key = root.clone().join("manifest.json");
        let found = match backend.get(&key).await? {
            Some(bytes) => {
                Some(serde_json::from_slice::<Manifest>(&bytes).map_err(|e| corrupt(&key, e))?)
            }
            None => None,
        };
        let manifest = match found {
            Some(m) if m.query_code != query_code => {
                return Err(EngineError::Context(format!(
                    "the checkpoint store {root} belongs to query {}, not this query ({query_code}): \
                     the query text changed; give another checkpoint directory or remove this one",
                    m.query_code
                )));
            }
            Some(m) if m.layout != layout => {
                return Err(EngineError::Context(format!(
                    "the checkpoint store {root} was written by another version of Skein (layout {}, \
                     this one reads layout {layout}); give another checkpoint directory or remove \
                     this one",
                    m.layout
                )));
            }
            Some(m) => m,
            None => {
                let m = Manifest {
                    query_code: query_code.to_string(),
                    run: fresh_run(query_code),
                    layout,
                    described: None,
                };
                let bytes = serde_json::to_vec(&m).map_err(|e| corrupt(&key, e))?;
                backend.put(&key, bytes).await?;
                m
            }
        };
        Ok(Self::with(backend, root, manifest))
    }

    fn with(backend: Backend, root: Path, manifest: Manifest) -> Self {
        CheckpointStore {
            backend,
            root,
            manifest,
            counts: Default::default(),
            forgot_at: Default::default(),
        }
    }

    /// A store whose manifest is known (a function instance: the driver
    /// opened the store and its lineage travels in the context).
    pub fn attach(store: Arc<dyn ObjectStore>, root: Path, query_code: &str, run: &str) -> Self {
        Self::attach_on(Backend::Objects(store), root, query_code, run)
    }

    /// [`Self::attach`] to a local directory.
    pub fn attach_dir(dir: PathBuf, query_code: &str, run: &str) -> Self {
        Self::attach_on(Backend::dir(dir), Path::from(""), query_code, run)
    }

    fn attach_on(backend: Backend, root: Path, query_code: &str, run: &str) -> Self {
        let manifest = Manifest {
            query_code: query_code.to_string(),
            run: run.to_string(),
            layout: backend.layout(),
            described: None,
        };
        Self::with(backend, root, manifest)
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
        // Like the manifest's first write, not a checkpoint's cost.
        let key = self.key(&["manifest.json"]);
        let bytes = serde_json::to_vec(&self.manifest).map_err(|e| corrupt(&key, e))?;
        self.backend.put(&key, bytes).await
    }

    /// The manifest as the store holds it, if there is one.
    pub async fn read_manifest(&self) -> Result<Option<Manifest>> {
        self.get_json(&self.key(&["manifest.json"])).await
    }

    /// The store's root path in its object store.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Bytes written through this handle so far.
    pub fn bytes_written(&self) -> u64 {
        self.counts.bytes.load(Ordering::Relaxed)
    }

    /// Objects written through this handle so far.
    pub fn puts(&self) -> u64 {
        self.put_counts().total()
    }

    /// Objects written through this handle so far, by kind.
    pub fn put_counts(&self) -> PutCounts {
        let c = &self.counts;
        PutCounts {
            entries: c.entries.load(Ordering::Relaxed),
            states: c.states.load(Ordering::Relaxed),
            driver: c.driver.load(Ordering::Relaxed),
            other: c.other.load(Ordering::Relaxed),
        }
    }

    fn counted(&self, kind: Kind, len: usize, started: std::time::Instant) {
        crate::metrics::checkpoint_write(len, started.elapsed());
        let c = &self.counts;
        c.bytes.fetch_add(len as u64, Ordering::Relaxed);
        let counter = match kind {
            Kind::Entry => &c.entries,
            Kind::State => &c.states,
            Kind::Driver => &c.driver,
            Kind::Other => &c.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    async fn put(&self, kind: Kind, key: &Path, bytes: Vec<u8>) -> Result<()> {
        let (len, started) = (bytes.len(), std::time::Instant::now());
        self.backend.put(key, bytes).await?;
        self.counted(kind, len, started);
        Ok(())
    }

    /// Write unless an object is there: `false` if one was.
    async fn put_new(&self, kind: Kind, key: &Path, bytes: Vec<u8>) -> Result<bool> {
        let (len, started) = (bytes.len(), std::time::Instant::now());
        let created = self.backend.put_new(key, bytes).await?;
        self.counted(kind, len, started);
        Ok(created)
    }

    async fn put_json<T: Serialize>(&self, kind: Kind, key: &Path, value: &T) -> Result<()> {
        let bytes = serde_json::to_vec(value).map_err(|e| corrupt(key, e))?;
        self.put(kind, key, bytes).await
    }

    async fn get_json<T: DeserializeOwned>(&self, key: &Path) -> Result<Option<T>> {
        match self.backend.get(key).await? {
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| corrupt(key, e)),
            None => Ok(None),
        }
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

    /// The (stage, member) a directory named by [`Self::member_dir`] is for.
    fn member_of_dir(dir: &str) -> Option<(u32, u32)> {
        let (stage, member) = dir.split_once('-')?;
        Some((stage.parse().ok()?, member.parse().ok()?))
    }

    /// The objects under a directory whose names start with an epoch, with
    /// that epoch and their size.
    async fn list_epochs(&self, parts: &[&str]) -> Result<Vec<(Path, u64, u64)>> {
        Ok(self
            .backend
            .list(&self.key(parts))
            .await?
            .into_iter()
            .filter_map(|o| Some((o.key.clone(), epoch_of(&o.key)?, o.size)))
            .collect())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn a_store_remembers_its_query_and_refuses_another_or_an_old_layout() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let a = CheckpointStore::open(store.clone(), Path::from("q"), "abc")
            .await
            .unwrap();
        let again = CheckpointStore::open(store.clone(), Path::from("q"), "abc")
            .await
            .unwrap();
        assert_eq!(a.manifest(), again.manifest());
        assert_eq!(a.manifest().layout, LAYOUT);
        let err = CheckpointStore::open(store.clone(), Path::from("q"), "other")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("belongs to query abc"), "{err}");
        let old = br#"{"query_code":"abc","run":"r"}"#.to_vec();
        let backend = Backend::Objects(store.clone());
        backend
            .put(&Path::from("old/manifest.json"), old)
            .await
            .unwrap();
        let err = CheckpointStore::open(store, Path::from("old"), "abc")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("another version of Skein (layout 0"), "{err}");
    }
}
