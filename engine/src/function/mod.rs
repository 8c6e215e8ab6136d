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

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};

pub use crate::request::{Request, Trigger};
use tokio::sync::Mutex;

use crate::admit::admit;
use crate::arena::{Arena, Collected, EpochInput};
use crate::catalog::Catalog;
use crate::checkpoint::CheckpointStore;
use crate::codec::{plan_from_bytes, schema_from_bytes};
use crate::compaction::Compactor;
use crate::context::{CloudContext, NextHop, StageMode};
use crate::error::{EngineError, Result};
use crate::exec::{StageInput, StageInputExec, rewrite_leaves};
use crate::invoke::Invoker;
use crate::payload::{Payload, PayloadHeader, SourceOffset};
use crate::ring::HashRing;
use crate::session::session;
use crate::source::{DeadLetter, DeadLetterSink, Source};
use crate::usage::Usage;
use crate::watermark::{EventTimeOptions, SourceClock, Watermark};
use crate::window_state::{LateRows, WindowBuffer, rows_as_json};

mod member_state;
mod pushed;
mod routing;
mod sink_write;
mod source_stage;
mod updating;

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

#[derive(Default)]
struct StageState {
    arena: Option<Arena>,
    ready: BTreeMap<u64, EpochInput>,
    next_epoch: u64,
    /// Rows of open windows (or, in a stage without windows, everything
    /// until the end of a bounded run).
    windows: WindowBuffer,
    /// This stage's watermark: it only moves forward.
    watermark: Watermark,
    /// Per source reader: its per-partition event-time clock.
    clocks: Vec<Option<SourceClock>>,
    /// This instance took its state from the checkpoint store (or had
    /// nothing to take): done once, before its first epoch.
    restored: bool,
    /// The states this member wrote (or restored), that the next
    /// checkpoint may build on.
    saved: member_state::SavedChain,
    /// A pushed source: where each shard's taken records end, and the
    /// next epoch a push takes.
    pushed: pushed::PushedLog,
    /// An updating stage's rows by key, and what it emitted.
    updating: Option<crate::updating::UpdatingState>,
}

/// The one generic function: built once per instance from its cloud
/// context (the cold start), then serves triggers and payloads for its stage.
pub struct StageFunction {
    ctx: CloudContext,
    name: String,
    /// The first output is the stage's own (its id is the edge id).
    outputs: Vec<StageOutput>,
    task_ctx: Arc<TaskContext>,
    readers: Vec<SourceReader>,
    sink: Option<sink_write::SinkOutput>,
    input_schemas: BTreeMap<u32, SchemaRef>,
    /// Per input edge: the schema its payloads carry (the leaf's, with the
    /// op column on an edge that carries a changelog).
    wire_schemas: BTreeMap<u32, SchemaRef>,
    /// An updating stage's plan, split to compute changes.
    updating: Option<Arc<crate::updating::UpdatingPlan>>,
    /// Per input edge of partial aggregate rows: how to merge them.
    compactors: BTreeMap<u32, Compactor>,
    late: BTreeMap<u32, LateHandling>,
    env: FunctionEnv,
    state: Mutex<StageState>,
    /// Dead letters, late rows and sink errors, for `skein status`.
    tally: crate::checkpoint::MemberTally,
}

impl std::fmt::Debug for StageFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StageFunction({})", self.name)
    }
}

impl StageFunction {
    /// Build the instance from its context: decode the plan, open sources
    /// and sink. Done once per instance.
    pub fn new(ctx: CloudContext, env: FunctionEnv) -> Result<Self> {
        let name = ctx.function_name();
        let session: SessionContext = session(&env.catalog, 1);
        let task_ctx = session.task_ctx();
        let decode = |bytes: &[u8]| {
            plan_from_bytes(bytes, &task_ctx, &env.catalog)
                .map_err(|e| EngineError::Context(format!("{name}: plan does not decode: {e}")))
        };
        let mut outputs = vec![StageOutput {
            shuffle_id: ctx.stage,
            plan: decode(&ctx.plan)?,
            next: ctx.next.clone(),
            ring: None,
        }];
        for extra in &ctx.extra_outputs {
            if matches!(extra.next, NextHop::Sink(_)) {
                return Err(EngineError::Context(format!(
                    "{name}: only a stage's own output may write the sink"
                )));
            }
            outputs.push(StageOutput {
                shuffle_id: extra.shuffle_id,
                plan: decode(&extra.plan)?,
                next: extra.next.clone(),
                ring: None,
            });
        }
        for o in &mut outputs {
            if let NextHop::Group { members, .. } = o.next {
                o.ring = Some(HashRing::new(members as usize));
            }
        }
        let mut readers = vec![];
        let mut clocks = vec![];
        for b in &ctx.sources {
            let schema = schema_from_bytes(&b.schema)?;
            let event_time = EventTimeOptions::from_config(&b.config, &schema)?;
            clocks.push(
                event_time
                    .column
                    .map(|c| SourceClock::new(c, event_time.lateness_ms, event_time.idle_timeout)),
            );
            let source = env.catalog.create_source(&b.config, schema)?;
            readers.push(SourceReader {
                table: b.table.clone(),
                source,
            });
        }
        let sink = match &ctx.next {
            NextHop::Sink(cfg) => Some(sink_write::SinkOutput::new(
                env.catalog.create_sink(cfg)?,
                cfg,
            )),
            _ => None,
        };
        let mut input_schemas = BTreeMap::new();
        collect_leaf_schemas(&outputs[0].plan, &mut input_schemas);
        let wire_schemas = input_schemas
            .iter()
            .map(|(edge, schema)| {
                let changes = ctx
                    .inputs
                    .iter()
                    .any(|e| e.shuffle_id == *edge && e.updating);
                let wire = if changes {
                    crate::changelog::with_op(schema)
                } else {
                    schema.clone()
                };
                (*edge, wire)
            })
            .collect();
        let compactors = match ctx.mode {
            StageMode::Stream => BTreeMap::new(),
            // Partial rows that a retraction may name must stay as they came.
            StageMode::Updating => Compactor::for_plan(&outputs[0].plan)
                .into_iter()
                .filter(|(edge, _)| {
                    !ctx.inputs
                        .iter()
                        .any(|e| e.shuffle_id == *edge && e.updating)
                })
                .collect(),
            StageMode::Accumulate | StageMode::Complete => Compactor::for_plan(&outputs[0].plan),
        };
        let (updating, updating_state) = if ctx.mode == StageMode::Updating {
            let plan =
                crate::updating::UpdatingPlan::new(&outputs[0].plan, &ctx.inputs, &input_schemas)?;
            tracing::debug!(
                function = %name,
                keys = ?plan.edge_keys,
                out_key = ?plan.out_key,
                tail = plan.tail.is_some(),
                "updating stage"
            );
            let mut state = crate::updating::UpdatingState::new(&plan, &input_schemas)?;
            if let Some(spec) = &ctx.updating {
                for (edge, ttl) in ctx.inputs.iter().zip(&spec.ttl_epochs) {
                    if let Some(epochs) = ttl {
                        state.set_ttl(edge.shuffle_id, *epochs);
                    }
                }
            }
            (Some(Arc::new(plan)), Some(state))
        } else {
            (None, None)
        };
        let mut late = BTreeMap::new();
        for e in &ctx.inputs {
            let dead_letters = match &e.late_letters {
                Some(config) => Some(env.catalog.dead_letters(config)?.ok_or_else(|| {
                    EngineError::plan(format!(
                        "table {}: 'late' 'dead-letter' needs a dead-letter destination, \
                         and its source kind {} declares none",
                        config.location, config.kind
                    ))
                })?),
                None => None,
            };
            let table = if e.tables.is_empty() {
                format!("edge {}", e.shuffle_id)
            } else {
                e.tables.join("+")
            };
            late.insert(
                e.shuffle_id,
                LateHandling {
                    table,
                    dead_letters,
                },
            );
        }
        let windows = ctx
            .inputs
            .iter()
            .map(|e| (e.shuffle_id, e.window.clone()))
            .collect();
        let state = StageState {
            arena: (!ctx.inputs.is_empty()).then(|| {
                Arena::new(
                    name.clone(),
                    ctx.inputs.iter().map(|e| e.shuffle_id).collect(),
                )
            }),
            windows: WindowBuffer::new(windows),
            clocks,
            updating: updating_state,
            ..Default::default()
        };
        Ok(StageFunction {
            ctx,
            name,
            outputs,
            task_ctx,
            readers,
            sink,
            input_schemas,
            wire_schemas,
            updating,
            compactors,
            late,
            env,
            state: Mutex::new(state),
            tally: Default::default(),
        })
    }

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
        let (response, callees) = crate::usage::collecting(async {
            match request {
                Request::Trigger(t) => self.run_source(t).await,
                Request::Data(p) => self.take_payload(*p).await,
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
        response.map(|mut r| {
            r.usage.add(&callees);
            r
        })
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
        self.checkpoints().is_some()
            && (self.ctx.mode != StageMode::Stream || !self.readers.is_empty())
    }

    /// Bytes of the rows this instance holds across epochs (its windows);
    /// none while an invocation holds them.
    pub fn state_bytes(&self) -> Option<usize> {
        let state = self.state.try_lock().ok()?;
        Some(state.windows.bytes() + state.updating.as_ref().map_or(0, |u| u.bytes()))
    }

    /// What this instance still waits for (empty when nothing is pending).
    pub async fn pending(&self) -> Vec<String> {
        let state = self.state.lock().await;
        let mut out = state.arena.as_ref().map(Arena::pending).unwrap_or_default();
        for epoch in state.ready.keys() {
            out.push(format!(
                "{}: epoch {epoch} is complete but waits for epoch {}",
                self.name, state.next_epoch
            ));
        }
        out
    }

    async fn take_payload(&self, p: Payload) -> Result<Response> {
        admit(&p, &self.ctx, &self.name)?;
        let expected =
            self.wire_schemas
                .get(&p.shuffle_id)
                .ok_or_else(|| EngineError::BadPayload {
                    uuid: p.uuid_string(),
                    stage: self.name.clone(),
                    reason: format!("no leaf of this stage reads edge {}", p.shuffle_id),
                })?;
        let batches = p.decode_batches(&self.name, expected)?;
        let mut state = self.state.lock().await;
        if !state.restored {
            self.restore(&mut state).await?;
            state.restored = true;
        }
        if p.epoch < state.next_epoch {
            // Already run (and committed, for a restored member): a retry.
            return Ok(Response {
                status: "duplicate".into(),
                ..Default::default()
            });
        }
        let arena = state
            .arena
            .as_mut()
            .ok_or_else(|| EngineError::BadPayload {
                uuid: p.uuid_string(),
                stage: self.name.clone(),
                reason: "this stage takes no payloads (it reads a source)".into(),
            })?;
        match arena.collect(&p, batches)? {
            Collected::Duplicate => {
                return Ok(Response {
                    status: "duplicate".into(),
                    ..Default::default()
                });
            }
            Collected::NotReady => {
                return Ok(Response {
                    status: "not_ready".into(),
                    ..Default::default()
                });
            }
            Collected::Complete(input) => {
                state.ready.insert(input.epoch, input);
            }
        }
        // Run every epoch that is complete and next in line; the state lock
        // keeps epochs in order even where concurrency is above one.
        let mut rows_out = 0;
        loop {
            let next = state.next_epoch;
            let Some(input) = state.ready.remove(&next) else {
                break;
            };
            rows_out += self.run_epoch(&mut state, input).await?;
            state.next_epoch += 1;
        }
        Ok(Response {
            status: "ran".into(),
            rows_out,
            ..Default::default()
        })
    }

    async fn run_epoch(&self, state: &mut StageState, input: EpochInput) -> Result<u64> {
        let qid = self.ctx.query_code.clone();
        let epoch = input.epoch;
        // The stage's watermark never goes back.
        state.watermark = Watermark {
            value: match (state.watermark.value, input.watermark.value) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            idle: input.watermark.idle,
        };
        crate::metrics::watermark(&self.ctx.stage_name(), state.watermark.value);
        let output = &self.outputs[0];
        let marks = EpochMarks {
            last: input.last,
            checkpoint: input.checkpoint,
        };
        if self.ctx.mode == StageMode::Updating {
            let header = self.header(
                output,
                &qid,
                epoch,
                state.watermark,
                marks,
                input.offsets.clone(),
            );
            return self.run_updating(state, input, header).await;
        }
        // A stateful stage without windows holds its rows until the end of
        // the run: its output must hold the watermark back too, or the rows
        // it emits then would be behind the watermark downstream (late).
        let holds_rows = self.ctx.mode != StageMode::Stream && !state.windows.is_windowed();
        let out_watermark = if holds_rows && !input.last {
            Watermark {
                value: Some(i64::MIN),
                idle: false,
            }
        } else {
            state.watermark
        };
        let header = self.header(
            output,
            &qid,
            epoch,
            out_watermark,
            marks,
            input.offsets.clone(),
        );
        let to_run: Option<BTreeMap<u32, Vec<RecordBatch>>> = match self.ctx.mode {
            StageMode::Stream => Some(input.edges),
            // Handled above.
            StageMode::Updating => None,
            StageMode::Complete | StageMode::Accumulate => {
                for (edge, batches) in input.edges {
                    let late = state.windows.add(edge, batches)?;
                    self.set_aside_late(epoch, late).await?;
                }
                if input.last {
                    Some(state.windows.take_all())
                } else if state.windows.is_windowed() {
                    // Every input's senders have passed the watermark, so a
                    // window it closes is complete on every side.
                    match state.watermark.value {
                        Some(wm) => Some(state.windows.release(wm)?),
                        None => None,
                    }
                } else {
                    None
                }
            }
        };
        for c in self.compactors.values() {
            if c.wants(state.windows.held_batches(c.edge())) {
                let held = state.windows.take_edge(c.edge());
                let merged = c.merge(held, self.task_ctx.clone()).await?;
                state.windows.put_back(c.edge(), merged);
            }
        }
        crate::metrics::state_bytes(&self.name, state.windows.bytes());
        let watermark_ms = state.watermark.value.filter(|w| *w > i64::MIN);
        self.tally.measure(|l| {
            l.state_bytes = state.windows.bytes() as u64;
            l.watermark_ms = watermark_ms.or(l.watermark_ms);
            l.epoch = Some(epoch);
        });
        // The state is encoded now and written while the epoch's output is
        // computed and sent: both finish before the invocation answers, and
        // so before the epoch can be committed.
        let to_save = self.state_to_save(state, epoch, input.last || input.checkpoint)?;
        let to_run = to_run.filter(|edges| edges.values().flatten().any(|b| b.num_rows() > 0));
        let run = async {
            match to_run {
                None => {
                    self.route(output, header, None).await?;
                    Ok(0)
                }
                Some(edges) if self.takes_changes() => {
                    self.run_changes(output, edges, header).await
                }
                Some(mut edges) => {
                    let plan = bind_leaves(&output.plan, &mut |input| match input {
                        StageInput::Shuffle { shuffle_id } => {
                            Ok(edges.remove(shuffle_id).unwrap_or_default())
                        }
                        StageInput::Source { table, .. } => Err(EngineError::plan(format!(
                            "stage {} has a source leaf {table} beside exchanges",
                            self.name
                        ))),
                    })?;
                    self.run_and_route(output, plan, header).await
                }
            }
        };
        let (written, rows) = tokio::join!(self.write_state(to_save), run);
        if let Some(w) = written? {
            state.saved.note(w);
        }
        rows
    }

    /// Count late rows per table and send them to their table's dead-letter
    /// destination where it asks for that; they are never emitted.
    async fn set_aside_late(&self, epoch: u64, late: Vec<LateRows>) -> Result<()> {
        for l in late {
            let Some(handling) = self.late.get(&l.edge) else {
                continue;
            };
            let n = l.batch.num_rows();
            self.env.late.add(&handling.table, n as u64);
            self.tally.count(|t| t.late_rows += n as u64);
            if let Some((start, end)) = l.windows.last() {
                let text = format!("{n} rows after their window [{start}, {end}) ms was emitted");
                self.tally
                    .measure(|m| m.reason("late", &handling.table, text));
            }
            crate::metrics::late_rows(&handling.table, n as u64);
            tracing::debug!(stage = %self.name, table = %handling.table, rows = n, "late rows");
            let Some(dlq) = &handling.dead_letters else {
                continue;
            };
            let letters: Vec<DeadLetter> = rows_as_json(&l.batch)?
                .into_iter()
                .zip(l.windows)
                .enumerate()
                .map(|(i, (row, window))| DeadLetter {
                    table: handling.table.clone(),
                    reason: "late".into(),
                    window: Some(window),
                    row,
                    // The same on a replay of this epoch.
                    key: format!(
                        "{}/late/{}/{epoch}/{}/{i}",
                        handling.table, self.name, l.edge
                    ),
                    offsets: vec![],
                })
                .collect();
            dlq.send(&letters).await?;
        }
        Ok(())
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

/// What the driver said of an epoch; every payload of the epoch carries it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EpochMarks {
    /// The run's last epoch: stateful stages flush.
    last: bool,
    /// The epoch will be committed: stateful stages keep their state.
    checkpoint: bool,
}

fn collect_leaf_schemas(plan: &Arc<dyn ExecutionPlan>, out: &mut BTreeMap<u32, SchemaRef>) {
    if let Some(leaf) = plan.downcast_ref::<StageInputExec>()
        && let StageInput::Shuffle { shuffle_id } = leaf.input
    {
        out.insert(shuffle_id, plan.schema());
    }
    for c in plan.children() {
        collect_leaf_schemas(c, out);
    }
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
