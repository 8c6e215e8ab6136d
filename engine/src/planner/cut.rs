//! Cutting the physical plan into stages where data moves between
//! functions, and splitting off the scans of a stateful source stage.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;

use super::classify::is_stateful;
use crate::context::StageMode;
use crate::error::Result;
use crate::exec::recompute;
use crate::exec::{SourceScanExec, StageInput, StageInputExec};

use super::*;

#[derive(Default)]
pub(super) struct Cutter {
    pub(super) stages: BTreeMap<u32, Stage>,
    pub(super) next_id: u32,
}

pub(super) struct Collected {
    pub(super) inputs: Vec<(u32, Exchange)>,
    pub(super) sources: Vec<SourceLeaf>,
}

impl Cutter {
    /// Make a stage whose output leaves by `output`. `keep_top`: the top node
    /// is the hash repartition that stays in this stage.
    pub(super) fn build_stage(
        &mut self,
        top: Arc<dyn ExecutionPlan>,
        output: Exchange,
        keep_top: bool,
    ) -> Result<u32> {
        let mut found = Collected {
            inputs: vec![],
            sources: vec![],
        };
        let body = if keep_top {
            let children = top
                .children()
                .into_iter()
                .map(|c| self.cut(c.clone(), &mut found))
                .collect::<Result<Vec<_>>>()?;
            top.replace_children(children, recompute())?
        } else {
            self.cut(top, &mut found)?
        };
        self.next_id += 1;
        let id = self.next_id;
        let stage = Stage::as_cut(id, body, found.inputs, found.sources, output);
        self.stages.insert(id, stage);
        Ok(id)
    }

    pub(super) fn cut(
        &mut self,
        plan: Arc<dyn ExecutionPlan>,
        found: &mut Collected,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(r) = plan.downcast_ref::<RepartitionExec>() {
            return match r.partitioning() {
                Partitioning::Hash(_, n) => {
                    let n = *n;
                    let child = self.build_stage(plan.clone(), Exchange::Hash(n), true)?;
                    found.inputs.push((child, Exchange::Hash(n)));
                    Ok(Arc::new(StageInputExec::new(
                        StageInput::Shuffle { shuffle_id: child },
                        plan.schema(),
                    )))
                }
                _ => self.cut(r.input().clone(), found),
            };
        }
        if let Some(c) = plan.downcast_ref::<CoalescePartitionsExec>() {
            let fetch = c.fetch();
            let leaf = self.gather(c.input().clone(), found)?;
            return Ok(match fetch {
                Some(n) => Arc::new(GlobalLimitExec::new(leaf, 0, Some(n))),
                None => leaf,
            });
        }
        if let Some(m) = plan.downcast_ref::<SortPreservingMergeExec>() {
            let (expr, fetch) = (m.expr().clone(), m.fetch());
            // The merge becomes a whole sort in the function it gathers
            // into, so sorting each partition before sending is work (and
            // state, across epochs) for nothing.
            let input = match m.input().downcast_ref::<SortExec>() {
                Some(sort) if sort.preserve_partitioning() => sort.input().clone(),
                _ => m.input().clone(),
            };
            let leaf = self.gather(input, found)?;
            return Ok(Arc::new(SortExec::new(expr, leaf).with_fetch(fetch)));
        }
        if let Some(scan) = plan.downcast_ref::<SourceScanExec>() {
            found.sources.push(SourceLeaf {
                table: scan.table.clone(),
                config: scan.config.clone(),
                schema: scan.source.schema(),
                parallelism: scan.source.parallelism(),
                parallelism_why: scan.parallelism_why.clone(),
                changelog: scan.source.changelog(),
            });
            return Ok(Arc::new(StageInputExec::new(
                StageInput::Source {
                    table: scan.table.clone(),
                    projection: scan.projection.clone(),
                },
                plan.schema(),
            )));
        }
        if plan.children().is_empty() {
            return Ok(plan);
        }
        let children = plan
            .children()
            .into_iter()
            .map(|c| self.cut(c.clone(), found))
            .collect::<Result<Vec<_>>>()?;
        Ok(plan.replace_children(children, recompute())?)
    }

    pub(super) fn gather(
        &mut self,
        input: Arc<dyn ExecutionPlan>,
        found: &mut Collected,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = input.schema();
        let child = self.build_stage(input, Exchange::Single, false)?;
        found.inputs.push((child, Exchange::Single));
        Ok(Arc::new(StageInputExec::new(
            StageInput::Shuffle { shuffle_id: child },
            schema,
        )))
    }

    /// Classify stages, split what a function cannot run, and link consumers.
    /// The source tables whose rows reach stage `id`'s output.
    pub(super) fn tables_behind(&self, id: u32) -> Vec<SourceLeaf> {
        let s = &self.stages[&id];
        let mut out = s.sources.clone();
        for (up, _) in &s.inputs {
            for t in self.tables_behind(*up) {
                if !out.iter().any(|o| o.table == t.table) {
                    out.push(t);
                }
            }
        }
        out
    }

    /// A table scanned in several places (a self-join) would otherwise be
    /// pulled by several source stages, each with a consumer of its own that
    /// stops at different offsets: windows would split between epochs, and
    /// events would be counted twice. Source stages that read the same table
    /// become one, which pulls once and feeds every consumer.
    pub(super) fn merge_scans_of_one_table(&mut self) {
        let mut by_table: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for s in self.stages.values() {
            let mergeable = s.kind == StageKind::Source
                && s.inputs.is_empty()
                && s.sources.len() == 1
                && s.consumer.is_some()
                && s.output != Exchange::Sink;
            if mergeable {
                let src = &s.sources[0];
                let key = format!("{}\u{1f}{:?}", src.table, src.config);
                by_table.entry(key).or_default().push(s.id);
            }
        }
        for ids in by_table.into_values().filter(|ids| ids.len() > 1) {
            let (primary, others) = ids.split_first().expect("two or more");
            for other in others {
                let s = self.stages.remove(other).expect("stage");
                let p = self.stages.get_mut(primary).expect("stage");
                p.extra_outputs.push(MergedOutput {
                    shuffle_id: s.id,
                    plan: s.plan,
                    output: s.output,
                    consumer: s.consumer,
                });
            }
        }
    }

    /// Stages are created children-first, so upstream modes are known.
    pub(super) fn any_upstream(&self, id: u32, pred: &dyn Fn(&Stage) -> bool) -> bool {
        self.stages[&id]
            .inputs
            .iter()
            .any(|(up, _)| pred(&self.stages[up]) || self.any_upstream(*up, pred))
    }

    /// Splits a stage that reads sources beside its state: each largest
    /// stateless part over one source scan (the scan with its filters and
    /// projections, which so run where the rows are read) becomes a
    /// source stage of its own that gathers into this one.
    pub(super) fn split_scans(&mut self, id: u32) -> Result<()> {
        let stage = self.stages.remove(&id).expect("stage");
        let mut inputs = stage.inputs.clone();
        let mut new_stages = vec![];
        let plan = self.cut_stateless_scans(&stage.plan, &stage.sources, id, &mut |s| {
            inputs.push((s.id, Exchange::Single));
            new_stages.push(s);
        })?;
        for s in new_stages {
            self.stages.insert(s.id, s);
        }
        self.stages.insert(
            id,
            Stage {
                plan,
                inputs,
                sources: vec![],
                ..stage
            },
        );
        Ok(())
    }

    fn cut_stateless_scans(
        &mut self,
        plan: &Arc<dyn ExecutionPlan>,
        sources: &[SourceLeaf],
        consumer: u32,
        found: &mut dyn FnMut(Stage),
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut tables = vec![];
        let shuffles = leaf_inputs(plan, &mut tables);
        if !is_stateful(plan) && tables.len() == 1 && shuffles == 0 {
            self.next_id += 1;
            let scan_id = self.next_id;
            let source = sources
                .iter()
                .find(|s| s.table == tables[0])
                .cloned()
                .expect("leaf of a known source");
            let mut scan = Stage::as_cut(
                scan_id,
                plan.clone(),
                vec![],
                vec![source],
                Exchange::Single,
            );
            scan.consumer = Some(consumer);
            found(scan);
            return Ok(Arc::new(StageInputExec::new(
                StageInput::Shuffle {
                    shuffle_id: scan_id,
                },
                plan.schema(),
            )));
        }
        if plan.children().is_empty() {
            return Ok(plan.clone());
        }
        let children = plan
            .children()
            .into_iter()
            .map(|c| self.cut_stateless_scans(c, sources, consumer, found))
            .collect::<Result<Vec<_>>>()?;
        Ok(plan.clone().replace_children(children, recompute())?)
    }
}

/// The source tables read under `plan` (into `tables`) and how many
/// exchange leaves it has.
fn leaf_inputs(plan: &Arc<dyn ExecutionPlan>, tables: &mut Vec<String>) -> usize {
    if let Some(leaf) = plan.downcast_ref::<StageInputExec>() {
        return match &leaf.input {
            StageInput::Source { table, .. } => {
                tables.push(table.clone());
                0
            }
            StageInput::Shuffle { .. } => 1,
        };
    }
    plan.children()
        .into_iter()
        .map(|c| leaf_inputs(c, tables))
        .sum()
}

impl Stage {
    /// A stage as the cut leaves it: a stateless source stage of one member
    /// with no consumer yet, until classifying gives it its kind and mode.
    fn as_cut(
        id: u32,
        plan: Arc<dyn ExecutionPlan>,
        inputs: Vec<(u32, Exchange)>,
        sources: Vec<SourceLeaf>,
        output: Exchange,
    ) -> Stage {
        Stage {
            id,
            kind: StageKind::Source,
            plan,
            members: 1,
            inputs,
            sources,
            output,
            consumer: None,
            stateful: false,
            mode: StageMode::Stream,
            updating: false,
            concurrency: STATELESS_CONCURRENCY,
            windows: vec![],
            input_tables: vec![],
            extra_outputs: vec![],
        }
    }
}
