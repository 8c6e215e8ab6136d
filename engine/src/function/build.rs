//! Building a function instance from its cloud context (the cold start):
//! decode its plans, open its sources, sink and dead letters, and make the
//! stage of its kind with the state that kind keeps.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use super::payload_stage::{EpochStep, PayloadStage};
use super::source_stage::SourceStage;
use super::updating::UpdatingStep;
use super::windowed::WindowedStep;
use super::{
    FunctionEnv, LateHandling, SourceReader, Stage, StageFunction, StageOutput, sink_write,
};
use crate::codec::{plan_from_bytes, schema_from_bytes};
use crate::compaction::Compactor;
use crate::context::{CloudContext, NextHop, StageMode};
use crate::error::{EngineError, Result};
use crate::ring::HashRing;
use crate::session::session;
use crate::updating::{UpdatingPlan, UpdatingState};
use crate::watermark::{EventTimeOptions, SourceClock};
use crate::window_state::WindowBuffer;

impl StageFunction {
    /// Build the instance from its context: decode the plan, open sources
    /// and sink. Done once per instance.
    pub fn new(ctx: CloudContext, env: FunctionEnv) -> Result<Self> {
        let name = ctx.function_name();
        let session: SessionContext = session(&env.catalog, 1);
        let task_ctx = session.task_ctx();
        let outputs = outputs(&ctx, &task_ctx, &env)?;
        let sink = match &ctx.next {
            NextHop::Sink(cfg) => Some(sink_write::SinkOutput::new(
                env.catalog.create_sink(cfg)?,
                cfg,
            )),
            _ => None,
        };
        let stage = if !ctx.inputs.is_empty() {
            Stage::Payload(Box::new(payload_stage(
                &ctx,
                &env,
                &name,
                &outputs[0].plan,
            )?))
        } else if ctx.sources.is_empty() {
            Stage::Constant
        } else {
            Stage::Source(Box::new(source_stage(&ctx, &env)?))
        };
        Ok(StageFunction {
            ctx,
            name,
            outputs,
            task_ctx,
            sink,
            env,
            stage,
            tally: Default::default(),
        })
    }
}

/// The stage's outputs, their plans decoded: its own first (its id is the
/// edge id), then those a source stage feeds from the same read.
fn outputs(
    ctx: &CloudContext,
    task_ctx: &Arc<TaskContext>,
    env: &FunctionEnv,
) -> Result<Vec<StageOutput>> {
    let name = ctx.function_name();
    let decode = |bytes: &[u8]| {
        plan_from_bytes(bytes, task_ctx, &env.catalog)
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
    Ok(outputs)
}

/// A source stage: its tables opened, an event-time clock per table.
fn source_stage(ctx: &CloudContext, env: &FunctionEnv) -> Result<SourceStage> {
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
    Ok(SourceStage::new(readers, clocks))
}

/// Whether the rows on `edge` are a changelog.
fn updates(ctx: &CloudContext, edge: u32) -> bool {
    ctx.inputs
        .iter()
        .any(|e| e.shuffle_id == edge && e.updating)
}

/// A stage fed by payloads, with the step its mode runs.
fn payload_stage(
    ctx: &CloudContext,
    env: &FunctionEnv,
    name: &str,
    plan: &Arc<dyn ExecutionPlan>,
) -> Result<PayloadStage> {
    let wire_schemas = crate::updating::leaf_schemas(plan)
        .iter()
        .map(|(edge, schema)| {
            let wire = match updates(ctx, *edge) {
                true => crate::changelog::with_op(schema),
                false => schema.clone(),
            };
            (*edge, wire)
        })
        .collect();
    let step = epoch_step(ctx, env, name, plan)?;
    let inputs = ctx.inputs.iter().map(|e| e.shuffle_id).collect();
    Ok(PayloadStage::new(name, inputs, wire_schemas, step))
}

impl StageFunction {
    /// An empty step of this member's stage, as a cold start builds it: a
    /// rescaled member restores each old member's state into one.
    pub(super) fn empty_step(&self) -> Result<EpochStep> {
        epoch_step(&self.ctx, &self.env, &self.name, &self.outputs[0].plan)
    }
}

/// The step a payload stage's mode runs, with its state empty.
fn epoch_step(
    ctx: &CloudContext,
    env: &FunctionEnv,
    name: &str,
    plan: &Arc<dyn ExecutionPlan>,
) -> Result<EpochStep> {
    let input_schemas = crate::updating::leaf_schemas(plan);
    Ok(match ctx.mode {
        StageMode::Stream => EpochStep::Stream,
        StageMode::Updating => {
            // Partial rows that a retraction may name must stay as they came.
            let compactors = Compactor::for_plan(plan)
                .into_iter()
                .filter(|(edge, _)| !updates(ctx, *edge))
                .collect();
            EpochStep::Updating(Box::new(updating_step(
                ctx,
                name,
                plan,
                &input_schemas,
                compactors,
            )?))
        }
        StageMode::Accumulate | StageMode::Complete => {
            let windows = ctx
                .inputs
                .iter()
                .map(|e| (e.shuffle_id, e.window.clone()))
                .collect();
            EpochStep::Windowed(Box::new(WindowedStep::new(
                WindowBuffer::new(windows),
                Compactor::for_plan(plan),
                late_handling(ctx, env)?,
                input_schemas,
            )))
        }
    })
}

/// An updating stage's plan split to compute changes, and its empty state
/// with the inputs' TTLs.
fn updating_step(
    ctx: &CloudContext,
    name: &str,
    plan: &Arc<dyn ExecutionPlan>,
    input_schemas: &BTreeMap<u32, SchemaRef>,
    compactors: BTreeMap<u32, Compactor>,
) -> Result<UpdatingStep> {
    let plan = UpdatingPlan::new(plan, &ctx.inputs, input_schemas)?;
    tracing::debug!(
        function = %name,
        keys = ?plan.edge_keys,
        out_key = ?plan.out_key,
        tail = plan.tail.is_some(),
        "updating stage"
    );
    let mut state = UpdatingState::new(&plan, input_schemas)?;
    if ctx.updating.as_ref().is_none_or(|s| s.emit_every <= 1) {
        state.emit_from_groups();
    }
    if let Some(spec) = &ctx.updating {
        for (edge, ttl) in ctx.inputs.iter().zip(&spec.ttl_epochs) {
            if let Some(epochs) = ttl {
                state.set_ttl(edge.shuffle_id, *epochs);
            }
        }
        if let Some(budget) = spec.memory {
            state.spill_groups_past(budget as usize)?;
        }
    }
    Ok(UpdatingStep::new(Arc::new(plan), state, compactors))
}

/// Per input edge: the table(s) its late rows are counted for, and their
/// dead-letter destination where the table asks for one.
fn late_handling(ctx: &CloudContext, env: &FunctionEnv) -> Result<BTreeMap<u32, LateHandling>> {
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
    Ok(late)
}
