//! The cloud context: everything one function needs to run its part of a
//! query, carried in its environment. It is JSON, zstd-compressed and base64
//! encoded. Lambda caps a function's whole environment at 4 KB, so a larger
//! context is written to the object store under its content hash and the
//! environment holds only a reference to it.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{EngineError, Result};
use crate::payload::Encoding;
use crate::sink::SinkConfig;
use crate::source::SourceConfig;
use crate::window::{SessionSpec, WindowColumn};

/// The environment variable that holds the context (or its reference).
pub const CONTEXT_ENV: &str = "SKEIN_CONTEXT";
/// Lambda's limit on the total size of a function's environment variables.
pub const LAMBDA_ENV_LIMIT: usize = 4096;
/// Prefix of a context reference, `store:<key>`: the environment value of
/// a context spilled to the object store.
pub const STORE_REF: &str = "store:";

/// How a stage runs its epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageMode {
    /// No state: runs every epoch on that epoch's input.
    Stream,
    /// The first stateful stage on a path: keeps its input across epochs and
    /// runs on windows the watermark has closed (or on everything at the end).
    Accumulate,
    /// Stateful, fed by an accumulating stage that hands over whole windows.
    Complete,
    /// Stateful, but no watermark closes its state (an aggregate without a
    /// window, a join of two streams, a top-N) or its input updates: keeps
    /// its input across epochs and emits, each epoch, the changes of its
    /// result as a changelog (see [`crate::changelog`] and
    /// [`crate::updating`]).
    Updating,
}

/// Where a stage's output goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NextHop {
    /// Hash-partitioned over a group; partition i goes to ring member i.
    Group {
        /// The stage of the group.
        stage: u32,
        /// How many members it has.
        members: u32,
    },
    /// Everything to one function.
    Single {
        /// That function's stage.
        stage: u32,
    },
    /// The query's sink.
    Sink(SinkConfig),
}

/// One source table read by a source stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceBinding {
    /// The table's name in the query.
    pub table: String,
    /// How to open the table's source.
    pub config: SourceConfig,
    /// The table's declared schema, as an Arrow IPC schema message.
    #[serde(with = "b64_bytes")]
    pub schema: Vec<u8>,
}

/// An input edge of a stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputEdge {
    /// The edge id: the stage that sends on it.
    pub shuffle_id: u32,
    /// How many upstream instances send on this edge (seq_len).
    pub senders: u32,
    /// The stage that sends on it (a group can change size, and with it
    /// `senders`). Absent in contexts written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_stage: Option<u32>,
    /// How rows on this edge group into windows, if they do.
    pub window: Option<EdgeWindow>,
    /// The source tables this edge's rows come from (late rows count there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
    /// The table whose dead-letter destination takes this edge's late rows,
    /// when it declares `'late' 'dead-letter'`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_letters: Option<SourceConfig>,
    /// Its rows are a changelog: each carries its kind in
    /// [`crate::changelog::OP_COLUMN`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub updating: bool,
    /// The columns the sender hash-partitioned its rows by (the key every
    /// row of one member's share has in common with the rows it meets), when
    /// they are plain columns; `None` for a gathering edge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Vec<usize>>,
}

/// A further output of a source stage: one read of a table feeds several
/// consumers (a table scanned twice is pulled once per epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtraOutput {
    /// The edge id its payloads carry (what its consumer's leaf names).
    pub shuffle_id: u32,
    /// The output's sub-plan, serialized with datafusion-proto.
    #[serde(with = "b64_bytes")]
    pub plan: Vec<u8>,
    /// Where the output goes.
    pub next: NextHop,
}

/// How the rows of an input edge group into event-time windows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeWindow {
    /// Tumbling or sliding windows: a window-start column and the size.
    Fixed(WindowColumn),
    /// Session windows computed in this stage, per key.
    Session(SessionSpec),
    /// Rows carry the start of their (already closed) session.
    SessionStarts,
}

/// Everything one function needs to run its part of a query: what it runs,
/// what it reads and where its output goes. It travels in the function's
/// environment (see the module).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudContext {
    /// Hash digest of the query text.
    pub query_code: String,
    /// The stage this function runs.
    pub stage: u32,
    /// Which member of the stage it is.
    pub member: u32,
    /// How many functions run this stage.
    pub members: u32,
    /// The key groups its hash-partitioned inputs are cut into (the
    /// partitions every sender hashes to): fixed for the query's life, so
    /// a group can change size by moving whole key groups between members.
    /// 0 in contexts written before: then as many as `members`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub key_groups: u32,
    /// When the stage runs: each epoch, or on closed windows.
    pub mode: StageMode,
    /// The stage's sub-plan, serialized with datafusion-proto.
    #[serde(with = "b64_bytes")]
    pub plan: Vec<u8>,
    /// The exchange edges it receives payloads on.
    pub inputs: Vec<InputEdge>,
    /// The source tables it reads (source stages).
    pub sources: Vec<SourceBinding>,
    /// Where its output goes.
    pub next: NextHop,
    /// Source stages: more outputs from the same read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_outputs: Vec<ExtraOutput>,
    /// How payloads it sends are compressed.
    pub encoding: Encoding,
    /// Call the next hop asynchronously (Event) rather than synchronously.
    pub invoke_async: bool,
    /// Epochs of a bounded run, if any (sources slice their input by it).
    pub epochs: Option<u64>,
    /// The run's lineage: the same for every restart of a query from its
    /// checkpoint store, new when the query starts afresh. Sinks key their
    /// epoch markers by it, so a fresh start is never taken for a replay.
    #[serde(default)]
    pub run: String,
    /// Where members keep their state and how often, when the query
    /// checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
    /// An updating stage: how it emits and how long it keeps state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updating: Option<UpdatingSpec>,
}

/// How an updating stage emits its changelog and keeps its state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdatingSpec {
    /// Emit the changes every this many epochs (and at the end of a
    /// bounded run): 1 emits every epoch; more gathers several epochs'
    /// changes into one (the sink's `'emit.interval'`).
    pub emit_every: u64,
    /// Per input edge, in input order: rows of a key that no row of the
    /// edge touched for this many epochs are dropped from the state
    /// (`'state.ttl'` over the run's epoch interval), if set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ttl_epochs: Vec<Option<u64>>,
    /// Bytes of an aggregate's groups a member keeps in memory; past them,
    /// the groups no epoch touched lately go to local disk. `None` keeps
    /// every group in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
}

/// How a query checkpoints (see `crate::checkpoint`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSpec {
    /// Members write their state at the end of every `interval`-th epoch
    /// (and of the last one).
    pub interval: u64,
}

/// The function name of a stage member: `<query-code>-<stage:02>-<member:02>`.
pub fn function_name(query_code: &str, stage: u32, member: u32) -> String {
    format!("{query_code}-{stage:02}-{member:02}")
}

impl CloudContext {
    /// The same context with the group sizes of `layout` (a commit's or a
    /// rescale's): its own stage's size, its consumers' and its senders'.
    /// Only sizes change; a function deployed for a bigger group reads its
    /// share of the key groups from the ring at the smaller size.
    pub fn with_layout(mut self, layout: &crate::checkpoint::Layout) -> Self {
        if let Some(&n) = layout.get(&self.stage) {
            self.members = n;
        }
        let resize = |next: &mut NextHop| {
            if let NextHop::Group { stage, members } = next
                && let Some(&n) = layout.get(stage)
            {
                *members = n;
            }
        };
        resize(&mut self.next);
        for extra in &mut self.extra_outputs {
            resize(&mut extra.next);
        }
        for edge in &mut self.inputs {
            if let Some(&n) = edge.sender_stage.and_then(|s| layout.get(&s)) {
                edge.senders = n;
            }
        }
        self
    }

    /// This function's name.
    pub fn function_name(&self) -> String {
        function_name(&self.query_code, self.stage, self.member)
    }

    /// This stage's name, `<query-code>-<stage:02>`.
    pub fn stage_name(&self) -> String {
        format!("{}-{:02}", self.query_code, self.stage)
    }

    /// JSON, zstd, base64: what the environment variable holds.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("context serialises");
        B64.encode(zstd::bulk::compress(&json, 9).expect("zstd of memory"))
    }

    /// A context from its encoded text: base64 of zstd of JSON (see the
    /// module).
    pub fn decode(text: &str) -> Result<Self> {
        let bad = |what: &str, e: String| EngineError::Context(format!("{what}: {e}"));
        let bytes = B64
            .decode(text.trim())
            .map_err(|e| bad("not base64", e.to_string()))?;
        let json = zstd::stream::decode_all(&bytes[..])
            .map_err(|e| bad("not a zstd frame", e.to_string()))?;
        serde_json::from_slice(&json).map_err(|e| bad("not a context", e.to_string()))
    }

    /// The value for [`CONTEXT_ENV`]: the context itself, or a reference to
    /// it in `store` when it would not fit Lambda's environment limit
    /// beside `other_env` bytes of other variables.
    pub async fn to_env(&self, store: &Arc<dyn ObjectStore>, other_env: usize) -> Result<String> {
        let encoded = self.encode();
        if encoded.len() + CONTEXT_ENV.len() + other_env < LAMBDA_ENV_LIMIT {
            return Ok(encoded);
        }
        let key = format!(
            "skein/contexts/{}",
            hex::encode(Sha256::digest(encoded.as_bytes()))
        );
        store
            .put(&StorePath::from(key.as_str()), encoded.into_bytes().into())
            .await?;
        Ok(format!("{STORE_REF}{key}"))
    }

    /// Read the context from an environment value, following a reference.
    pub async fn from_env(value: &str, store: Option<&Arc<dyn ObjectStore>>) -> Result<Self> {
        match value.strip_prefix(STORE_REF) {
            None => Self::decode(value),
            Some(key) => {
                let store = store.ok_or_else(|| {
                    EngineError::Context(format!(
                        "context was spilled to {key} but no object store is configured"
                    ))
                })?;
                let bytes = store.get(&StorePath::from(key)).await?.bytes().await?;
                let text =
                    std::str::from_utf8(&bytes).map_err(|e| EngineError::Context(e.to_string()))?;
                Self::decode(text)
            }
        }
    }
}

mod b64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD as B64;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&B64.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        B64.decode(text).map_err(serde::de::Error::custom)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use rand::RngCore;

    fn context(plan: Vec<u8>) -> CloudContext {
        CloudContext {
            query_code: "abc123".into(),
            stage: 2,
            member: 5,
            members: 8,
            key_groups: 8,
            mode: StageMode::Accumulate,
            plan,
            inputs: vec![InputEdge {
                shuffle_id: 1,
                senders: 2,
                sender_stage: Some(1),
                window: None,
                tables: vec![],
                late_letters: None,
                updating: false,
                key: None,
            }],
            sources: vec![],
            next: NextHop::Single { stage: 3 },
            extra_outputs: vec![],
            encoding: Encoding::Zstd,
            invoke_async: false,
            epochs: Some(4),
            run: "r1".into(),
            checkpoint: None,
            updating: None,
        }
    }

    #[test]
    fn a_layout_resizes_the_stage_its_consumer_and_its_senders_only() {
        let mut ctx = context(vec![]);
        ctx.next = NextHop::Group {
            stage: 3,
            members: 8,
        };
        let layout = crate::checkpoint::Layout::from([(1, 3), (2, 4), (3, 2), (9, 1)]);
        let resized = ctx.clone().with_layout(&layout);
        assert_eq!((resized.member, resized.members), (5, 4));
        assert_eq!(resized.key_groups, 8, "key groups never change");
        assert_eq!(
            resized.next,
            NextHop::Group {
                stage: 3,
                members: 2
            }
        );
        assert_eq!(resized.inputs[0].senders, 3);
        // A context written before senders named their stage keeps its count.
        ctx.inputs[0].sender_stage = None;
        assert_eq!(ctx.with_layout(&layout).inputs[0].senders, 2);
    }

    #[tokio::test]
    async fn small_context_stays_inline() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let ctx = context(vec![1, 2, 3]);
        let env = ctx.to_env(&store, 0).await.unwrap();
        assert!(!env.starts_with(STORE_REF));
        let beside = ctx.to_env(&store, LAMBDA_ENV_LIMIT).await.unwrap();
        assert!(
            beside.starts_with(STORE_REF),
            "spilled beside a large environment"
        );
        assert!(env.len() < LAMBDA_ENV_LIMIT);
        assert_eq!(CloudContext::from_env(&env, None).await.unwrap(), ctx);
        assert_eq!(ctx.function_name(), "abc123-02-05");
    }

    #[tokio::test]
    async fn large_context_is_spilled_and_read_back() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut plan = vec![0u8; 16 * 1024];
        rand::rng().fill_bytes(&mut plan);
        let ctx = context(plan);
        let env = ctx.to_env(&store, 0).await.unwrap();
        assert!(env.starts_with(STORE_REF), "{}", &env[..40]);
        assert!(env.len() < 200);
        assert_eq!(
            CloudContext::from_env(&env, Some(&store)).await.unwrap(),
            ctx
        );
        let err = CloudContext::from_env(&env, None)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("spilled"), "{err}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(CloudContext::decode("%%%").is_err());
        assert!(CloudContext::decode(&B64.encode(b"not zstd")).is_err());
    }
}
