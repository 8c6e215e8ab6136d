//! Classifying stages: which hold state, their kind, mode and members.

use std::sync::Arc;

use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::repartition::RepartitionExec;

use crate::context::EdgeWindow;
use crate::error::{EngineError, Result};
use crate::exec::StageInputExec;
use crate::exec::passes_batches_through;
use crate::window::has_session_column;

use super::window_edges::{edge_window, leaf_schema, session_over_leaf};
use super::*;

impl Cutter {
    /// Feed stage `id` all of each hash input: its senders gather into it.
    fn gather_hash_inputs(&mut self, id: u32) {
        let ups: Vec<u32> = self.stages[&id]
            .inputs
            .iter()
            .filter(|(_, e)| matches!(e, Exchange::Hash(_)))
            .map(|(up, _)| *up)
            .collect();
        for up in &ups {
            if let Some(sender) = self.stages.get_mut(up) {
                sender.output = Exchange::Single;
            }
        }
        let stage = self.stages.get_mut(&id).expect("stage");
        for (up, e) in stage.inputs.iter_mut() {
            if ups.contains(up) {
                *e = Exchange::Single;
            }
        }
    }

    /// Classify stages, split what a function cannot run, and link consumers.
    pub(super) fn finish(mut self, window_sizes: &[i64]) -> Result<Vec<Stage>> {
        // A stateful source stage would keep per-epoch state in many
        // instances; instead its scans become stages of their own that gather
        // into it. Same for scans beside exchanges in a gathering stage.
        let ids: Vec<u32> = self.stages.keys().copied().collect();
        for id in ids {
            let (needs_split, has_hash_input) = {
                let s = &self.stages[&id];
                let mixed = !s.sources.is_empty() && !s.inputs.is_empty();
                let stateful_source =
                    !s.sources.is_empty() && s.inputs.is_empty() && is_stateful(&s.plan);
                (
                    mixed || stateful_source,
                    s.inputs.iter().any(|(_, e)| matches!(e, Exchange::Hash(_))),
                )
            };
            if needs_split {
                if has_hash_input {
                    // A scan beside a hash exchange (a subquery's table
                    // joined to an aggregate, NOT IN): the scan's rows would
                    // need to reach every member. The stage gathers instead:
                    // one member, with all of each input.
                    self.gather_hash_inputs(id);
                }
                self.split_scans(id)?;
            }
        }
        // A stage fed both by a hash exchange and by a gathering one (a
        // join of an aggregate with a global aggregate, as a scalar
        // subquery makes) gathers all of it into one member.
        let ids: Vec<u32> = self.stages.keys().copied().collect();
        for id in ids {
            let inputs = &self.stages[&id].inputs;
            let hashed = inputs.iter().any(|(_, e)| matches!(e, Exchange::Hash(_)));
            let gathered = inputs.iter().any(|(_, e)| *e == Exchange::Single);
            if hashed && gathered {
                self.gather_hash_inputs(id);
            }
        }
        // Consumers.
        let links: Vec<(u32, u32)> = self
            .stages
            .values()
            .flat_map(|s| s.inputs.iter().map(move |(up, _)| (*up, s.id)))
            .collect();
        for (up, down) in links {
            self.stages.get_mut(&up).expect("stage").consumer = Some(down);
        }
        // Kinds, sizes, state.
        let ids: Vec<u32> = self.stages.keys().copied().collect();
        for id in &ids {
            let s = self.stages.get_mut(id).expect("stage");
            s.stateful = is_stateful(&s.plan);
            if !s.sources.is_empty() {
                let p = s.sources[0].parallelism;
                if s.sources.iter().any(|x| x.parallelism != p) {
                    return Err(EngineError::plan(format!(
                        "stage {id} reads sources of different parallelism: {:?}",
                        s.sources
                            .iter()
                            .map(|x| (&x.table, x.parallelism))
                            .collect::<Vec<_>>()
                    )));
                }
                s.kind = StageKind::Source;
                s.members = p as u32;
            } else if s.inputs.iter().all(|(_, e)| matches!(e, Exchange::Hash(_)))
                && !s.inputs.is_empty()
            {
                let n = match s.inputs[0].1 {
                    Exchange::Hash(n) => n,
                    _ => unreachable!("all inputs are hash exchanges"),
                };
                if s.inputs.iter().any(|(_, e)| *e != Exchange::Hash(n)) {
                    return Err(EngineError::plan(format!(
                        "stage {id} has hash inputs of different sizes"
                    )));
                }
                s.kind = StageKind::Group;
                s.members = n as u32;
            } else if s.inputs.iter().all(|(_, e)| *e == Exchange::Single) && !s.inputs.is_empty() {
                s.kind = StageKind::Single;
                s.members = 1;
            } else if s.inputs.is_empty() {
                // Constant input (VALUES, generate_series, SELECT 1): one
                // function, triggered like a source; it emits its rows in
                // the first epoch and nothing after.
                s.kind = StageKind::Source;
                s.members = 1;
                s.stateful = false;
            } else {
                return Err(EngineError::plan(format!(
                    "stage {id} mixes hash and gathering inputs"
                )));
            }
            // A function that receives payloads collects each epoch in its
            // arena, which lives in one instance: a second instance would
            // hold part of an epoch that never completes. Only source
            // functions, which receive triggers, can run many at once.
            s.concurrency = if s.kind == StageKind::Source {
                STATELESS_CONCURRENCY
            } else {
                1
            };
        }
        // Window columns of each input edge, from the leaves' schemas.
        for id in &ids {
            let s = self.stages.get_mut(id).expect("stage");
            let mut windows = vec![];
            for (up, _) in &s.inputs {
                let schema = leaf_schema(&s.plan, *up);
                let fixed = schema
                    .as_ref()
                    .and_then(|sch| edge_window(sch, window_sizes))
                    .map(EdgeWindow::Fixed);
                let window = fixed
                    .or_else(|| session_over_leaf(&s.plan, *up).map(EdgeWindow::Session))
                    .or_else(|| {
                        schema
                            .filter(|sch| has_session_column(sch))
                            .map(|_| EdgeWindow::SessionStarts)
                    });
                windows.push(window);
            }
            s.windows = windows;
        }
        for id in &ids {
            if let Some(s) = self.stages.get(id)
                && s.kind == StageKind::Source
                && s.stateful
            {
                return Err(EngineError::plan(format!("source stage {id} is stateful")));
            }
        }
        self.assign_modes();
        self.rewrite_aggregates_over_changes()?;
        for id in &ids {
            let tables = self.stages[id]
                .inputs
                .iter()
                .map(|(up, _)| self.tables_behind(*up))
                .collect();
            self.stages.get_mut(id).expect("stage").input_tables = tables;
        }
        self.merge_scans_of_one_table();
        Ok(self.stages.into_values().collect())
    }
}

pub(super) fn is_ordered(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Sort(_) => true,
        LogicalPlan::Projection(p) => is_ordered(&p.input),
        LogicalPlan::Limit(l) => is_ordered(&l.input),
        _ => false,
    }
}

/// Whether a sub-plan holds state beyond one batch (and so beyond one epoch).
pub fn is_stateful(plan: &Arc<dyn ExecutionPlan>) -> bool {
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    use datafusion::physical_plan::union::UnionExec;
    use datafusion::physical_plan::unnest::UnnestExec;
    let stateless = plan.downcast_ref::<ProjectionExec>().is_some()
        || plan.downcast_ref::<FilterExec>().is_some()
        || plan.downcast_ref::<StageInputExec>().is_some()
        || plan.downcast_ref::<RepartitionExec>().is_some()
        || plan.downcast_ref::<UnnestExec>().is_some()
        || plan.downcast_ref::<UnionExec>().is_some()
        || plan.downcast_ref::<EmptyExec>().is_some()
        || plan.downcast_ref::<PlaceholderRowExec>().is_some()
        // Fetches by key per batch; its cache is no state of the query.
        || plan.downcast_ref::<crate::lookup::exec::LookupJoinExec>().is_some()
        || passes_batches_through(plan);
    if super::static_join::is_static_build(plan) {
        // Its build side is computed afresh each epoch: no state of the query.
        return is_stateful(&plan.children()[1].clone());
    }
    let own = if let Some(agg) = plan.downcast_ref::<AggregateExec>() {
        *agg.mode() != AggregateMode::Partial
    } else {
        !stateless
    };
    own || plan.children().into_iter().any(is_stateful)
}
