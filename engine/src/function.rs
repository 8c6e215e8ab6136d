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

use datafusion::arrow::array::{Array, BooleanArray, TimestampMillisecondArray};
use datafusion::arrow::compute::{cast, filter_record_batch, max as arrow_max};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use futures::future::try_join_all;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::arena::{Arena, Collected, EpochInput};
use crate::codec::{plan_from_bytes, schema_from_bytes};
use crate::context::{CloudContext, EdgeWindow, NextHop, StageMode, function_name};
use crate::error::{EngineError, Result};
use crate::exec::{OPT_EVENT_TIME, OPT_LATENESS_MS, StageInput, StageInputExec, rewrite_leaves};
use crate::invoke::{InvocationType, Invoker, invoke_with_retry};
use crate::payload::{
    ASYNC_PAYLOAD_LIMIT, Payload, PayloadHeader, SYNC_PAYLOAD_LIMIT, SourceOffset, encode_payloads,
};
use crate::planner::session;
use crate::ring::HashRing;
use crate::sink::{Sink, SinkRegistry, SinkWrite};
use crate::source::{EpochSpec, PushedRecord, Source, SourceRegistry};
use crate::window::{SessionSpec, window_ends};

/// What a function instance needs from the world it runs in.
#[derive(Clone)]
pub struct FunctionEnv {
    pub sources: SourceRegistry,
    pub sinks: SinkRegistry,
    /// Where spilled contexts live.
    pub store: Option<Arc<dyn ObjectStore>>,
    pub invoker: Arc<dyn Invoker>,
    pub max_backoff: Duration,
}

/// The request a function receives.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// Run a source stage for one epoch.
    Trigger(Trigger),
    /// Data from an upstream stage.
    Data(Payload),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trigger {
    pub qid: String,
    pub epoch: u64,
    pub last: bool,
}

impl Request {
    pub fn to_json(&self) -> Vec<u8> {
        match self {
            // Data payloads travel as the bare envelope.
            Request::Data(p) => p.to_json(),
            Request::Trigger(t) => {
                serde_json::to_vec(&serde_json::json!({ "trigger": t })).expect("json")
            }
        }
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| EngineError::BadEnvelope(e.to_string()))?;
        if let Some(t) = v.get("trigger") {
            let t: Trigger = serde_json::from_value(t.clone())
                .map_err(|e| EngineError::BadEnvelope(format!("trigger: {e}")))?;
            return Ok(Request::Trigger(t));
        }
        let p: Payload = serde_json::from_value(v)
            .map_err(|e| EngineError::BadEnvelope(format!("payload: {e}")))?;
        Ok(Request::Data(p))
    }
}

/// The function's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// `ran`, `not_ready` or `duplicate`.
    pub status: String,
    /// Records a source pulled.
    #[serde(default)]
    pub events: u64,
    #[serde(default)]
    pub rows_out: u64,
}

struct SourceReader {
    table: String,
    source: Arc<dyn Source>,
    event_time: Option<usize>,
    lateness_ms: i64,
}

#[derive(Default)]
struct StageState {
    arena: Option<Arena>,
    ready: BTreeMap<u64, EpochInput>,
    next_epoch: u64,
    /// Accumulated input per edge (stateful stages).
    buffered: BTreeMap<u32, Vec<RecordBatch>>,
    /// Highest event time a source instance has seen.
    max_event_time: Option<i64>,
}

pub struct StageFunction {
    ctx: CloudContext,
    name: String,
    plan: Arc<dyn ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
    readers: Vec<SourceReader>,
    sink: Option<Arc<dyn Sink>>,
    ring: Option<HashRing>,
    input_schemas: BTreeMap<u32, SchemaRef>,
    env: FunctionEnv,
    state: Mutex<StageState>,
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
        let session: SessionContext = session(&env.sources, 1);
        let task_ctx = session.task_ctx();
        let plan = plan_from_bytes(&ctx.plan, &task_ctx)
            .map_err(|e| EngineError::Context(format!("{name}: plan does not decode: {e}")))?;
        let mut readers = vec![];
        for b in &ctx.sources {
            let schema = schema_from_bytes(&b.schema)?;
            let event_time = b
                .config
                .option(OPT_EVENT_TIME)
                .and_then(|c| schema.index_of(c).ok());
            let lateness_ms = b
                .config
                .option(OPT_LATENESS_MS)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let source = env.sources.create(&b.config, schema)?;
            readers.push(SourceReader {
                table: b.table.clone(),
                source,
                event_time,
                lateness_ms,
            });
        }
        let sink = match &ctx.next {
            NextHop::Sink(cfg) => Some(env.sinks.create(cfg)?),
            _ => None,
        };
        let ring = match &ctx.next {
            NextHop::Group { members, .. } => Some(HashRing::new(*members as usize)),
            _ => None,
        };
        let mut input_schemas = BTreeMap::new();
        collect_leaf_schemas(&plan, &mut input_schemas);
        let state = StageState {
            arena: (!ctx.inputs.is_empty()).then(|| {
                Arena::new(
                    name.clone(),
                    ctx.inputs.iter().map(|e| e.shuffle_id).collect(),
                )
            }),
            ..Default::default()
        };
        Ok(StageFunction {
            ctx,
            name,
            plan,
            task_ctx,
            readers,
            sink,
            ring,
            input_schemas,
            env,
            state: Mutex::new(state),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn context(&self) -> &CloudContext {
        &self.ctx
    }

    /// Serve one invocation. Errors name the function (stage) and payload.
    pub async fn handle(&self, bytes: &[u8]) -> Result<Response> {
        match Request::from_json(bytes)? {
            Request::Trigger(t) => self.run_source(t).await,
            Request::Data(p) => self.take_payload(p).await,
        }
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

    async fn run_source(&self, t: Trigger) -> Result<Response> {
        if !self.ctx.inputs.is_empty() {
            return Err(EngineError::Invocation {
                name: self.name.clone(),
                reason: "a trigger reached a stage that takes payloads".into(),
            });
        }
        if self.readers.is_empty() {
            return self.run_constant(t).await;
        }
        let mut state = self.state.lock().await;
        let mut bound: BTreeMap<String, Vec<RecordBatch>> = BTreeMap::new();
        let mut offsets = vec![];
        let mut events = 0u64;
        let mut watermark: Option<i64> = None;
        for r in &self.readers {
            let spec = EpochSpec {
                instance: self.ctx.member as usize,
                instances: self.ctx.members as usize,
                epoch: t.epoch,
                epochs: self.ctx.epochs,
            };
            let mb = r.source.pull(spec).await.map_err(|e| EngineError::Source {
                source_name: r.table.clone(),
                reason: format!("{}: {e}", self.name),
            })?;
            events += mb.batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
            if let Some(col) = r.event_time {
                for b in &mb.batches {
                    if let Some(m) = max_time_ms(b.column(col).as_ref())? {
                        state.max_event_time = Some(state.max_event_time.map_or(m, |x| x.max(m)));
                    }
                }
                if let Some(m) = state.max_event_time {
                    let w = m - r.lateness_ms;
                    watermark = Some(watermark.map_or(w, |x: i64| x.min(w)));
                }
            }
            offsets.extend(mb.offsets);
            bound.insert(r.table.clone(), mb.batches);
        }
        drop(state);
        let plan = self.bind_sources(&bound)?;
        let header = self.header(&t.qid, t.epoch, watermark, t.last, offsets);
        let rows_out = self.run_and_route(plan, header).await?;
        Ok(Response {
            status: "ran".into(),
            events,
            rows_out,
        })
    }

    /// The stage's plan with its source leaves bound to `bound` (per table).
    fn bind_sources(
        &self,
        bound: &BTreeMap<String, Vec<RecordBatch>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        bind_leaves(&self.plan, &mut |input| match input {
            StageInput::Source { table, projection } => {
                let batches = bound.get(table).cloned().unwrap_or_default();
                match projection {
                    Some(p) => batches
                        .iter()
                        .map(|b| b.project(p).map_err(EngineError::from))
                        .collect(),
                    None => Ok(batches),
                }
            }
            StageInput::Shuffle { shuffle_id } => Err(EngineError::plan(format!(
                "source stage has a shuffle input {shuffle_id}"
            ))),
        })
    }

    /// Run this source stage on records a platform pushed to it (one batch
    /// of a Lambda Kinesis event-source mapping) instead of pulling.
    ///
    /// Pushed batches arrive per shard, independently, with no epoch that
    /// every source instance shares; later stages count epochs from all
    /// instances, so only a stage that writes the sink itself (filters and
    /// projections) takes pushes. `batch_id` names the batch (a retried
    /// batch keeps it) and is the epoch of the sink write, so a sink that
    /// names its writes by epoch (files) replaces a retried batch's output.
    pub async fn run_pushed(&self, batch_id: u64, records: &[PushedRecord]) -> Result<Response> {
        let refuse = |reason: &str| EngineError::Invocation {
            name: self.name.clone(),
            reason: reason.to_string(),
        };
        if !matches!(self.ctx.next, NextHop::Sink(_)) {
            return Err(refuse(
                "pushed records need a query whose source stage writes the sink \
                 (no shuffle, window or aggregate after the source)",
            ));
        }
        let [reader] = self.readers.as_slice() else {
            return Err(refuse(
                "pushed records need a stage that reads exactly one source table",
            ));
        };
        let mb = reader
            .source
            .decode_pushed(records)
            .await
            .map_err(|e| EngineError::Source {
                source_name: reader.table.clone(),
                reason: format!("{}: {e}", self.name),
            })?;
        let events = mb.batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
        let bound: BTreeMap<String, Vec<RecordBatch>> =
            [(reader.table.clone(), mb.batches)].into_iter().collect();
        let plan = self.bind_sources(&bound)?;
        let header = self.header("pushed", batch_id, None, false, mb.offsets);
        let rows_out = self.run_and_route(plan, header).await?;
        Ok(Response {
            status: "ran".into(),
            events,
            rows_out,
        })
    }

    /// A stage with no input at all: its rows go out with the first epoch;
    /// later epochs send empty payloads so downstream counts complete.
    async fn run_constant(&self, t: Trigger) -> Result<Response> {
        let header = self.header(&t.qid, t.epoch, None, t.last, vec![]);
        if t.epoch > 0 {
            self.route(header, None).await?;
            return Ok(Response {
                status: "ran".into(),
                events: 0,
                rows_out: 0,
            });
        }
        let plan = bind_leaves(&self.plan, &mut |input| {
            Err(EngineError::plan(format!(
                "constant stage has an input {input:?}"
            )))
        })?;
        let rows_out = self.run_and_route(plan, header).await?;
        Ok(Response {
            status: "ran".into(),
            events: 0,
            rows_out,
        })
    }

    async fn take_payload(&self, p: Payload) -> Result<Response> {
        p.validate(&self.name)?;
        let expected = self.input_schemas.get(&p.shuffle_id);
        let batches = p.decode_batches(&self.name, expected)?;
        let mut state = self.state.lock().await;
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
            events: 0,
            rows_out,
        })
    }

    async fn run_epoch(&self, state: &mut StageState, input: EpochInput) -> Result<u64> {
        let qid = self.ctx.query_code.clone();
        let header = self.header(
            &qid,
            input.epoch,
            input.watermark,
            input.last,
            input.offsets.clone(),
        );
        let windows: BTreeMap<u32, Option<EdgeWindow>> = self
            .ctx
            .inputs
            .iter()
            .map(|e| (e.shuffle_id, e.window.clone()))
            .collect();
        let windowed = !windows.is_empty() && windows.values().all(Option::is_some);
        let has_rows = input.edges.values().flatten().any(|b| b.num_rows() > 0);
        let to_run: Option<BTreeMap<u32, Vec<RecordBatch>>> = match self.ctx.mode {
            StageMode::Stream => has_rows.then_some(input.edges),
            StageMode::Complete if windowed => has_rows.then_some(input.edges),
            StageMode::Complete | StageMode::Accumulate => {
                for (edge, batches) in input.edges {
                    state
                        .buffered
                        .entry(edge)
                        .or_default()
                        .extend(batches.into_iter().filter(|b| b.num_rows() > 0));
                }
                if input.last {
                    Some(std::mem::take(&mut state.buffered))
                } else if self.ctx.mode == StageMode::Accumulate && windowed {
                    match input.watermark {
                        Some(wm) => Some(take_closed_windows(&mut state.buffered, &windows, wm)?),
                        None => None,
                    }
                } else {
                    None
                }
            }
        };
        let to_run = to_run.filter(|edges| edges.values().flatten().any(|b| b.num_rows() > 0));
        match to_run {
            None => {
                self.route(header, None).await?;
                Ok(0)
            }
            Some(mut edges) => {
                let plan = bind_leaves(&self.plan, &mut |input| match input {
                    StageInput::Shuffle { shuffle_id } => {
                        Ok(edges.remove(shuffle_id).unwrap_or_default())
                    }
                    StageInput::Source { table, .. } => Err(EngineError::plan(format!(
                        "stage {} has a source leaf {table} beside exchanges",
                        self.name
                    ))),
                })?;
                self.run_and_route(plan, header).await
            }
        }
    }

    fn header(
        &self,
        qid: &str,
        epoch: u64,
        watermark: Option<i64>,
        last: bool,
        offsets: Vec<SourceOffset>,
    ) -> PayloadHeader {
        PayloadHeader {
            qid: qid.to_string(),
            seq_num: self.ctx.member,
            seq_len: self.ctx.members,
            epoch,
            shuffle_id: self.ctx.stage,
            encoding: self.ctx.encoding,
            watermark,
            last,
            offsets,
        }
    }

    /// Execute the bound plan and send its output on.
    async fn run_and_route(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        header: PayloadHeader,
    ) -> Result<u64> {
        let partitions = plan.properties().output_partitioning().partition_count();
        let outputs = try_join_all((0..partitions).map(|i| {
            let plan = plan.clone();
            let ctx = self.task_ctx.clone();
            async move {
                let stream = plan.execute(i, ctx)?;
                datafusion::physical_plan::common::collect(stream).await
            }
        }))
        .await?;
        let rows: u64 = outputs.iter().flatten().map(|b| b.num_rows() as u64).sum();
        self.route(header, Some((plan.schema(), outputs))).await?;
        Ok(rows)
    }

    /// Send output (per output partition) to the next hop; `None` sends the
    /// metadata-only payloads that let downstream counts complete.
    async fn route(
        &self,
        header: PayloadHeader,
        output: Option<(SchemaRef, Vec<Vec<RecordBatch>>)>,
    ) -> Result<()> {
        let (schema, parts) = match output {
            Some((s, p)) => (Some(s), p),
            None => (None, vec![]),
        };
        match &self.ctx.next {
            NextHop::Sink(_) => {
                let sink = self.sink.as_ref().expect("sink stage has a sink");
                let schema = schema.unwrap_or_else(|| self.plan.schema());
                sink.write(SinkWrite {
                    query: &self.ctx.query_code,
                    epoch: header.epoch,
                    member: self.ctx.member,
                    schema,
                    batches: parts.into_iter().flatten().collect(),
                    offsets: header.offsets.clone(),
                    last: header.last,
                })
                .await
            }
            NextHop::Single { stage } => {
                let batches: Vec<RecordBatch> = parts.into_iter().flatten().collect();
                self.send(*stage, 0, &header, schema, batches).await
            }
            NextHop::Group { stage, members } => {
                let ring = self.ring.as_ref().expect("group hop has a ring");
                let mut per_member: Vec<Vec<RecordBatch>> = vec![vec![]; *members as usize];
                for (partition, batches) in parts.into_iter().enumerate() {
                    per_member[ring.member_for(partition)].extend(batches);
                }
                try_join_all(per_member.into_iter().enumerate().map(|(m, batches)| {
                    self.send(*stage, m as u32, &header, schema.clone(), batches)
                }))
                .await
                .map(|_| ())
            }
        }
    }

    async fn send(
        &self,
        stage: u32,
        member: u32,
        header: &PayloadHeader,
        schema: Option<SchemaRef>,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        let kind = if self.ctx.invoke_async {
            InvocationType::Async
        } else {
            InvocationType::Sync
        };
        let limit = match kind {
            InvocationType::Sync => SYNC_PAYLOAD_LIMIT,
            InvocationType::Async => ASYNC_PAYLOAD_LIMIT,
        };
        let schema = schema.unwrap_or_else(|| self.plan.schema());
        let payloads = encode_payloads(header, &schema, &batches, limit)?;
        let target = function_name(&self.ctx.query_code, stage, member);
        for p in payloads {
            invoke_with_retry(
                self.env.invoker.as_ref(),
                &target,
                p.to_json(),
                kind,
                self.env.max_backoff,
                50,
            )
            .await?;
        }
        Ok(())
    }
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

fn max_time_ms(col: &dyn Array) -> Result<Option<i64>> {
    let ms = cast(col, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
    let ms = ms
        .as_any()
        .downcast_ref::<TimestampMillisecondArray>()
        .ok_or_else(|| EngineError::plan("event time column is not a timestamp"))?;
    Ok(arrow_max(ms))
}

/// Remove and return the buffered rows whose window ended at or before the
/// watermark; rows of open windows stay buffered.
fn take_closed_windows(
    buffered: &mut BTreeMap<u32, Vec<RecordBatch>>,
    windows: &BTreeMap<u32, Option<EdgeWindow>>,
    watermark: i64,
) -> Result<BTreeMap<u32, Vec<RecordBatch>>> {
    let mut closed = BTreeMap::new();
    for (edge, batches) in buffered.iter_mut() {
        let closed_keys = match windows.get(edge) {
            Some(Some(EdgeWindow::Session(spec))) => {
                Some(closed_session_keys(batches, spec, watermark)?)
            }
            Some(Some(EdgeWindow::Fixed(_))) => None,
            _ => continue,
        };
        let mut keep = vec![];
        let mut out = vec![];
        for b in batches.drain(..) {
            let is_closed: BooleanArray = match (windows.get(edge), &closed_keys) {
                (Some(Some(EdgeWindow::Fixed(w))), _) => {
                    let ends = window_ends(b.column(w.index).as_ref(), w.size_ms)?;
                    ends.iter()
                        .map(|e| Some(e.is_some_and(|e| e <= watermark)))
                        .collect()
                }
                (Some(Some(EdgeWindow::Session(spec))), Some(keys)) => {
                    let rows = session_keys(&b, spec)?;
                    rows.iter().map(|k| Some(keys.contains(k))).collect()
                }
                _ => unreachable!("only fixed and session edges release rows"),
            };
            let is_open: BooleanArray = is_closed.iter().map(|c| c.map(|c| !c)).collect();
            let c = filter_record_batch(&b, &is_closed)?;
            let o = filter_record_batch(&b, &is_open)?;
            if c.num_rows() > 0 {
                out.push(c);
            }
            if o.num_rows() > 0 {
                keep.push(o);
            }
        }
        *batches = keep;
        closed.insert(*edge, out);
    }
    Ok(closed)
}

/// The key of every row of a batch, as text (keys are compared, not used).
fn session_keys(batch: &RecordBatch, spec: &SessionSpec) -> Result<Vec<String>> {
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let opts = FormatOptions::default();
    let formatters = spec
        .keys
        .iter()
        .map(|i| ArrayFormatter::try_new(batch.column(*i).as_ref(), &opts))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((0..batch.num_rows())
        .map(|r| {
            formatters
                .iter()
                .map(|f| f.value(r).to_string())
                .collect::<Vec<_>>()
                .join("\u{1f}")
        })
        .collect())
}

/// Keys whose last row is more than the gap behind the watermark: no later
/// row can extend their sessions, so all their rows can be released.
fn closed_session_keys(
    batches: &[RecordBatch],
    spec: &SessionSpec,
    watermark: i64,
) -> Result<std::collections::HashSet<String>> {
    let mut last: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    for b in batches {
        let keys = session_keys(b, spec)?;
        let times = cast(
            b.column(spec.time).as_ref(),
            &DataType::Timestamp(TimeUnit::Millisecond, None),
        )?;
        let times = times
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .ok_or_else(|| EngineError::plan("session time column is not a timestamp"))?;
        for (k, t) in keys.into_iter().zip(times.iter()) {
            if let Some(t) = t {
                let e = last.entry(k).or_insert(t);
                *e = (*e).max(t);
            }
        }
    }
    Ok(last
        .into_iter()
        .filter(|(_, t)| t + spec.gap_ms < watermark)
        .map(|(k, _)| k)
        .collect())
}
