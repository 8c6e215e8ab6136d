//! Building a function instance from its cloud context (the cold start):
//! decode its plans, open its sources, sink and dead letters, size its state.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::prelude::SessionContext;

use super::{
    FunctionEnv, LateHandling, SourceReader, StageFunction, StageOutput, StageState, sink_write,
};
use crate::arena::Arena;
use crate::codec::{plan_from_bytes, schema_from_bytes};
use crate::compaction::Compactor;
use crate::context::{CloudContext, NextHop, StageMode};
use crate::error::{EngineError, Result};
use crate::ring::HashRing;
use crate::session::session;
use crate::watermark::{EventTimeOptions, SourceClock};
use crate::window_state::WindowBuffer;
use tokio::sync::Mutex;

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
        let input_schemas = crate::updating::leaf_schemas(&outputs[0].plan);
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
}
