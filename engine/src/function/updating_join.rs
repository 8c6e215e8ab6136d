//! An updating stage's join, run on its changes (the formulas are in
//! `crate::updating::join`): each epoch's changed rows meet the other
//! side's rows of their keys, and an outer join's padding is worked out
//! again only for the keys whose other side went from no rows to some or
//! back.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::ExecutionPlan;

use super::updating::UpdatingStep;
use super::{StageFunction, bind_leaves};
use crate::changelog;
use crate::changelog::row_key::RowEncoder;
use crate::error::{EngineError, Result};
use crate::exec::StageInput;
use crate::payload::{Arrived, batches_of};
use crate::updating::UpdatingState;
use crate::updating::join::IncrementalJoin;
use crate::updating::keyed::{Key, concat};

/// An epoch's output rows of a join, by kind.
#[derive(Default)]
struct Pairs {
    retract: Vec<RecordBatch>,
    insert: Vec<RecordBatch>,
}

impl UpdatingStep {
    /// Keep an epoch's changed rows of a join, and return the changes of
    /// its result as `(retractions, inserts)`.
    pub(super) async fn join_changes(
        &mut self,
        f: &StageFunction,
        core: &Arc<dyn ExecutionPlan>,
        join: &IncrementalJoin,
        edges: BTreeMap<u32, Vec<Arrived>>,
    ) -> Result<(RecordBatch, RecordBatch)> {
        let mut new: BTreeMap<u32, Vec<RecordBatch>> = BTreeMap::new();
        for (edge, arrived) in edges {
            new.entry(edge).or_default().extend(batches_of(arrived));
        }
        // P: the side an outer join pads (the left of an inner one); O: the other.
        let (p, o) = match &join.outer {
            Some(side) => (side.preserved, side.other),
            None => (join.left, join.right),
        };
        let u = &mut self.state;
        let o_keys = match new.get(&o) {
            Some(batches) if !batches.is_empty() => {
                let plain = plain_rows(f, o, batches)?;
                u.keys_in(o, &plain)?
            }
            _ => HashSet::new(),
        };
        // Both sides as they were, for the keys ΔO touched.
        let p_old = u.rows_of(p, &o_keys)?;
        let o_old = match &join.outer {
            Some(_) => u.rows_of(o, &o_keys)?,
            None => RecordBatch::new_empty(p_old.schema()),
        };
        let (o_out, o_in) = take(f, u, &new, o)?;
        let (p_out, p_in) = take(f, u, &new, p)?;
        let mut p_keys = u.keys_in(p, &p_out)?;
        p_keys.extend(u.keys_in(p, &p_in)?);
        let o_now = u.rows_of(o, &p_keys)?;

        let pads = join.outer.is_some();
        let pairs_only = join.outer.as_ref().map_or(core, |side| &side.pairs_only);
        let run =
            |plan, p_rows, o_rows, pads| join_run(f, core, plan, (p, o), p_rows, o_rows, pads);
        let mut out = Pairs::default();
        // ΔP with O as it is now: pairs, and padding where nothing matches.
        out.insert
            .extend(run(core, p_in, o_now.clone(), pads).await?);
        out.retract.extend(run(core, p_out, o_now, pads).await?);
        // P as it was with ΔO: pairs alone.
        out.insert
            .extend(run(pairs_only, p_old.clone(), o_in, false).await?);
        out.retract
            .extend(run(pairs_only, p_old.clone(), o_out, false).await?);

        if let Some(side) = &join.outer {
            let had: HashSet<Key> = u.keys_in(o, &o_old)?;
            let flipped: HashSet<Key> = o_keys
                .into_iter()
                .filter(|k| side.filtered || u.holds(o, k) != had.contains(k))
                .collect();
            let p_was = u.rows_with_keys(p, &p_old, &flipped)?;
            if p_was.num_rows() > 0 {
                let o_was = u.rows_with_keys(o, &o_old, &flipped)?;
                let o_is = u.rows_of(o, &flipped)?;
                // pad(P, O) = P ⟕ O - P ⋈ O, after minus before.
                let mut padding = Pairs::default();
                padding
                    .insert
                    .extend(run(core, p_was.clone(), o_is.clone(), true).await?);
                padding
                    .insert
                    .extend(run(pairs_only, p_was.clone(), o_was.clone(), false).await?);
                padding
                    .retract
                    .extend(run(pairs_only, p_was.clone(), o_is, false).await?);
                padding.retract.extend(run(core, p_was, o_was, true).await?);
                let schema = core.schema();
                let (retract, insert) = changelog::diff::diff(
                    &RowEncoder::whole(&schema)?,
                    &concat(&schema, &padding.retract)?,
                    &concat(&schema, &padding.insert)?,
                )?;
                out.retract.push(retract);
                out.insert.push(insert);
            }
        }
        let schema = core.schema();
        Ok((
            concat(&schema, &out.retract)?,
            concat(&schema, &out.insert)?,
        ))
    }
}

/// The rows of `batches` of `edge`, without a changelog's op column.
fn plain_rows(f: &StageFunction, edge: u32, batches: &[RecordBatch]) -> Result<RecordBatch> {
    let batch = concat(&batches[0].schema(), batches)?;
    if f.edge_updates(edge) {
        changelog::strip(&batch)
    } else {
        Ok(batch)
    }
}

/// Keep `edge`'s new rows: the rows it took back and the rows it added.
fn take(
    f: &StageFunction,
    u: &mut UpdatingState,
    new: &BTreeMap<u32, Vec<RecordBatch>>,
    edge: u32,
) -> Result<(RecordBatch, RecordBatch)> {
    let schema = u
        .edge_schema(edge)
        .ok_or_else(|| EngineError::Context(format!("{}: no input edge {edge}", f.name)))?;
    match new.get(&edge).filter(|b| !b.is_empty()) {
        Some(batches) => {
            let batch = concat(&batches[0].schema(), batches)?;
            u.take_input_changes(edge, batch, f.edge_updates(edge))
        }
        None => Ok((
            RecordBatch::new_empty(schema.clone()),
            RecordBatch::new_empty(schema),
        )),
    }
}

/// The rows `plan` (the stage's core, or it made inner) makes of `p_rows`
/// and `o_rows`, in the core's schema. An inner run of nothing is nothing;
/// an outer one (`pads`) of P rows alone is their padding.
async fn join_run(
    f: &StageFunction,
    core: &Arc<dyn ExecutionPlan>,
    plan: &Arc<dyn ExecutionPlan>,
    (p, o): (u32, u32),
    p_rows: RecordBatch,
    o_rows: RecordBatch,
    pads: bool,
) -> Result<Vec<RecordBatch>> {
    if p_rows.num_rows() == 0 || (o_rows.num_rows() == 0 && !pads) {
        return Ok(vec![]);
    }
    let mut sides = BTreeMap::from([(p, vec![p_rows]), (o, vec![o_rows])]);
    let bound = bind_leaves(plan, &mut |leaf| match leaf {
        StageInput::Shuffle { shuffle_id } => Ok(sides.remove(shuffle_id).unwrap_or_default()),
        StageInput::Source { table, .. } => Err(f.source_beside_exchanges(table)),
    })?;
    let schema = core.schema();
    f.execute(&bound)
        .await?
        .into_iter()
        .flatten()
        .filter(|b| b.num_rows() > 0)
        // A pairs-only run's columns are nullable where the core's are.
        .map(|b| Ok(RecordBatch::try_new(schema.clone(), b.columns().to_vec())?))
        .collect()
}
