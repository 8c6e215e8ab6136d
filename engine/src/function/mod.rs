//! The generic function: `payload in -> run sub-plan -> invocations out`.
//!
//! One [`StageFunction`] is one function instance. It is built once from its
//! cloud context (a cold start) and then serves invocations: a trigger for a
//! source stage, or a data payload for every other stage. Aggregating members
//! collect payloads in their arena and run an epoch only when all of it is
//! there, and strictly in epoch order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};

pub use crate::request::{Request, Trigger};

use crate::catalog::Catalog;
use crate::checkpoint::CheckpointStore;
use crate::context::{CloudContext, NextHop, StageMode};
use crate::dead_letter::DeadLetterSink;
use crate::error::{EngineError, Result};
use crate::exec::{StageInput, rewrite_leaves};
use crate::invoke::Invoker;
use crate::payload::{PayloadHeader, SourceOffset};
use crate::ring::HashRing;
use crate::source::Source;
use crate::usage::Usage;
use crate::watermark::Watermark;

mod build;
mod changes;
mod member_state;
mod payload_stage;
mod pushed;
mod rescaled;
mod routing;
mod sink_write;
mod source_log;
mod source_note;
mod source_stage;
mod updating;
mod updating_join;
mod windowed;

/// What a function instance needs from the world it runs in.
#[derive(Clone)]
pub struct FunctionEnv {
    /// The table kinds a context can name.
    pub catalog: Catalog,
    /// Where spilled contexts live.
    pub store: Option<Arc<dyn ObjectStore>>,
    /// Invokes the next hop's functions.
    pub invoker: Arc<dyn Invoker>,
    /// The longest wait between retries of a throttled invocation.
    pub max_backoff: Duration,
    /// Where this process counts late rows.
    pub late: Arc<LateCounts>,
    /// Where members keep durable state, when the query checkpoints (its
    /// context says so too).
    pub checkpoints: Option<Arc<CheckpointStore>>,
    /// What the run's bound means for sink writes (see
    /// [`crate::sink_health`]).
    pub bound: crate::sink_health::RunBound,
}

/// The function's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// `ran`, `not_ready` or `duplicate`.
    pub status: String,
    /// Records a source pulled.
    #[serde(default)]
    pub events: u64,
    /// Rows the function sent on.
    #[serde(default)]
    pub rows_out: u64,
    /// A source stage: every partition it reads reached the end it had when
    /// the source was opened.
    #[serde(default)]
    pub drained: bool,
    /// A source stage: every partition it reads is exhausted for good (a
    /// bounded source).
    #[serde(default)]
    pub finished: bool,
    /// A source stage: records between where it stopped and its
    /// partitions' ends, where the source can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    /// A source stage: the watermark it sent, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_ms: Option<i64>,
    /// A source stage: the largest event time it has read, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_event_ms: Option<i64>,
    /// A pushed batch: its records that could not be taken, in order; the
    /// first is reported to the platform as the batch's first failure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub poison: Vec<crate::checkpoint::PoisonRecord>,
    /// The synchronous invocations this one made, with theirs; the
    /// bootstrap adds this invocation's own (crate::usage).
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
}

/// Late rows counted by the functions of one process, per table.
#[derive(Debug, Default)]
pub struct LateCounts {
    by_table: std::sync::Mutex<BTreeMap<String, u64>>,
}

impl LateCounts {
    /// Count `n` for `table`.
    pub fn add(&self, table: &str, n: u64) {
        *self
            .by_table
            .lock()
            .expect("late counts")
            .entry(table.to_string())
            .or_default() += n;
    }

    /// The counts, per table.
    pub fn by_table(&self) -> BTreeMap<String, u64> {
        self.by_table.lock().expect("late counts").clone()
    }
}

struct SourceReader {
    table: String,
    source: Arc<dyn Source>,
}

/// One output of a stage: a sub-plan and where its rows go. A source stage
/// that feeds several consumers from one read has several.
struct StageOutput {
    /// The edge id its payloads carry.
    shuffle_id: u32,
    plan: Arc<dyn ExecutionPlan>,
    next: NextHop,
    ring: Option<HashRing>,
}

/// How late rows of one input edge are handled.
struct LateHandling {
    /// The table(s) the edge's rows come from, as counted.
    table: String,
    dead_letters: Option<Arc<dyn DeadLetterSink>>,
}

/// The kinds of stage, each holding its own state across invocations.
enum Stage {
    /// No input at all: its rows go out with the first epoch.
    Constant,
    /// Reads its tables: a pull per trigger, or a platform's pushed batches.
    Source(Box<source_stage::SourceStage>),
    /// Takes the payloads of the stages before it.
    Payload(Box<payload_stage::PayloadStage>),
}

/// The one generic function: built once per instance from its cloud
/// context (the cold start), then serves triggers and payloads for its stage.
pub struct StageFunction {
    ctx: CloudContext,
    name: String,
    /// The first output is the stage's own (its id is the edge id).
    outputs: Vec<StageOutput>,
    task_ctx: Arc<TaskContext>,
    sink: Option<sink_write::SinkOutput>,
    env: FunctionEnv,
    stage: Stage,
    /// Dead letters, late rows and sink errors, for `skein status`.
    tally: crate::checkpoint::MemberTally,
}

impl std::fmt::Debug for StageFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StageFunction({})", self.name)
    }
}

impl StageFunction {
    /// This function's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The context it was built from.
    pub fn context(&self) -> &CloudContext {
        &self.ctx
    }

    /// Serve one invocation as it came over the wire. Errors name the
    /// function (stage) and payload.
    pub async fn handle(&self, bytes: &[u8]) -> Result<Response> {
        self.serve(Request::from_json(bytes)?).await
    }

    /// Serve one parsed request: a trigger or a data payload.
    pub async fn serve(&self, request: Request) -> Result<Response> {
        let started = std::time::Instant::now();
        let (response, callees, waited) = crate::usage::collecting(async {
            match request {
                Request::Trigger(t) => self.trigger(t).await,
                Request::Data(p) => match &self.stage {
                    Stage::Payload(stage) => stage.take(self, *p).await,
                    _ => Err(EngineError::BadPayload {
                        uuid: p.uuid_string(),
                        stage: self.name.clone(),
                        reason: "this stage takes no payloads (it reads a source)".into(),
                    }),
                },
                other => Err(EngineError::invocation_failed(
                    self.name.clone(),
                    format!("a {} is not a stage request", other.kind()),
                )),
            }
        })
        .await;
        self.tally.measure(|l| {
            l.invocation(started.elapsed());
            if let Ok(r) = &response {
                l.rows_out += r.rows_out;
            }
        });
        self.save_tally().await;
        // Its own work: the time its callees took is theirs.
        let busy = started.elapsed().saturating_sub(waited);
        response.map(|mut r| {
            r.usage.add(&callees);
            *r.usage.busy_ms_by_stage.entry(self.ctx.stage).or_default() +=
                busy.as_micros().div_ceil(1000) as u64;
            r
        })
    }

    /// A trigger: a source stage reads its epoch.
    async fn trigger(&self, t: Trigger) -> Result<Response> {
        if t.qid != self.ctx.query_code {
            return Err(EngineError::invocation_failed(
                self.name.clone(),
                format!(
                    "a trigger for query {:?}, not this function's {}",
                    t.qid, self.ctx.query_code
                ),
            ));
        }
        match &self.stage {
            Stage::Constant => self.run_constant(t).await,
            Stage::Source(stage) => stage.run(self, t).await,
            Stage::Payload(_) => Err(EngineError::invocation_failed(
                self.name.clone(),
                "a trigger reached a stage that takes payloads",
            )),
        }
    }

    /// Write this member's counts for `skein status` if they changed and
    /// it has no object of its own to carry them in. A failure only costs
    /// the status a count, so it does not fail the invocation.
    pub(super) async fn save_tally(&self) {
        let Some(cs) = &self.env.checkpoints else {
            return;
        };
        if self.tally_rides_along() {
            return;
        }
        if let Err(e) = self.tally.save(cs, self.ctx.stage, self.ctx.member).await {
            tracing::warn!(stage = %self.name, error = %e, "writing the member's counts");
        }
    }

    /// Whether this member's counts ride in objects it writes anyway: a
    /// source member's log entries, a stateful member's states.
    fn tally_rides_along(&self) -> bool {
        let reads = matches!(&self.stage, Stage::Source(s) if s.reads());
        self.checkpoints().is_some() && (self.ctx.mode != StageMode::Stream || reads)
    }

    /// Bytes of the rows this instance holds across epochs (its windows);
    /// none while an invocation holds them.
    pub fn state_bytes(&self) -> Option<usize> {
        match &self.stage {
            Stage::Payload(stage) => stage.state_bytes(),
            _ => Some(0),
        }
    }

    /// What this instance still waits for (empty when nothing is pending).
    pub async fn pending(&self) -> Vec<String> {
        match &self.stage {
            Stage::Payload(stage) => stage.pending(&self.name).await,
            _ => vec![],
        }
    }

    fn header(
        &self,
        output: &StageOutput,
        qid: &str,
        epoch: u64,
        watermark: Watermark,
        marks: EpochMarks,
        offsets: Vec<SourceOffset>,
    ) -> PayloadHeader {
        PayloadHeader {
            qid: qid.to_string(),
            seq_num: self.ctx.member,
            seq_len: self.ctx.members,
            epoch,
            shuffle_id: output.shuffle_id,
            encoding: self.ctx.encoding,
            watermark: watermark.value,
            idle: watermark.idle,
            last: marks.last,
            checkpoint: marks.checkpoint,
            offsets,
        }
    }
}

impl Response {
    /// An answer that is only a status.
    fn status(status: &str) -> Self {
        Response {
            status: status.into(),
            ..Default::default()
        }
    }
}

/// What the driver said of an epoch; every payload of the epoch carries it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EpochMarks {
    /// The run's last epoch: stateful stages flush.
    last: bool,
    /// The epoch will be committed: stateful stages keep their state.
    checkpoint: bool,
}

/// A fresh copy of `plan` whose leaves hold the given data.
fn bind_leaves(
    plan: &Arc<dyn ExecutionPlan>,
    data: &mut dyn FnMut(&StageInput) -> Result<Vec<RecordBatch>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    rewrite_leaves(plan, &mut |leaf, _| {
        Ok(Arc::new(leaf.bind(data(&leaf.input)?)) as Arc<dyn ExecutionPlan>)
    })
}
