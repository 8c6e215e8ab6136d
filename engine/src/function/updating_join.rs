//! An updating stage's join, run on its changes (the formulas are in
//! `crate::updating::join`): each epoch's changed rows meet the other
//! side's rows of their keys, and an outer join's padding is worked out
//! again only for the keys whose other side went from no rows to some or
//! back; a semi or anti join's old rows are run again only for the keys
//! where whether they have a match may have changed.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
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
use crate::updating::join::{ExistsSide, IncrementalJoin};
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
        let mut new = epoch_rows(edges)?;
        if let Some(side) = &join.exists {
            return self.exists_changes(f, core, side, new).await;
        }
        // P: the side an outer join pads (the left of an inner one); O: the other.
        let (p, o) = match &join.outer {
            Some(side) => (side.preserved, side.other),
            None => (join.left, join.right),
        };
        let u = &mut self.state;
        // An inner join's pairs need no padding: no key's match is watched.
        let filtered = join.outer.as_ref().is_none_or(|side| side.filtered);
        let o_keys = OtherKeys::before(f, u, &new, o, filtered)?;
        let (o_out, o_in) = take(f, u, new.remove(&o), o)?;
        // P as it was (ΔP is taken below), for the keys ΔO touched.
        let p_old = u.rows_of(p, &o_keys.touched)?;
        let (p_out, p_in) = take(f, u, new.remove(&p), p)?;
        let o_now = u.rows_of(o, &keys_of_both(u, p, &p_out, &p_in)?)?;

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
            .extend(run(pairs_only, p_old.clone(), o_in.clone(), false).await?);
        out.retract
            .extend(run(pairs_only, p_old.clone(), o_out.clone(), false).await?);

        if join.outer.is_some() {
            let flipped = o_keys.flipped(u, o);
            let p_was = match flipped.is_empty() {
                true => RecordBatch::new_empty(p_old.schema()),
                false => u.rows_with_keys(p, &p_old, &flipped)?,
            };
            if p_was.num_rows() > 0 {
                let o_is = u.rows_of(o, &flipped)?;
                let o_was = o_as_it_was(u, o, &flipped, &o_is, &o_out, &o_in)?;
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
                let (retract, insert) = changed(&core.schema(), &padding.retract, &padding.insert)?;
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

    /// [`Self::join_changes`] of a semi or anti join: `ΔP` against the
    /// other side as it is now, and the old `P` rows again only where
    /// whether they have a match may have changed.
    async fn exists_changes(
        &mut self,
        f: &StageFunction,
        core: &Arc<dyn ExecutionPlan>,
        side: &ExistsSide,
        mut new: BTreeMap<u32, RecordBatch>,
    ) -> Result<(RecordBatch, RecordBatch)> {
        let (p, o) = (side.preserved, side.other);
        let u = &mut self.state;
        let o_keys = OtherKeys::before(f, u, &new, o, side.filtered)?;
        let (o_out, o_in) = take(f, u, new.remove(&o), o)?;
        // The keys whose P rows may now come out differently, and their P
        // rows as they were (ΔP is taken below).
        let flipped = o_keys.flipped(u, o);
        let p_was = u.rows_of(p, &flipped)?;
        let (p_out, p_in) = take(f, u, new.remove(&p), p)?;
        let o_now = u.rows_of(o, &keys_of_both(u, p, &p_out, &p_in)?)?;

        // A run with no O rows still has output: an anti join's P rows.
        let run = |p_rows, o_rows| join_run(f, core, core, (p, o), p_rows, o_rows, true);
        let schema = core.schema();
        let mut retract = run(p_out, o_now.clone()).await?;
        let mut insert = run(p_in, o_now).await?;
        if p_was.num_rows() > 0 {
            let o_is = u.rows_of(o, &flipped)?;
            let o_was = o_as_it_was(u, o, &flipped, &o_is, &o_out, &o_in)?;
            let before = run(p_was.clone(), o_was).await?;
            let after = run(p_was, o_is).await?;
            let (gone, came) = changed(&schema, &before, &after)?;
            retract.push(gone);
            insert.push(came);
        }
        Ok((concat(&schema, &retract)?, concat(&schema, &insert)?))
    }
}

/// The keys an epoch's rows of the other side touch, and which of them
/// held rows before it, where that tells whether a row's match changed:
/// not with a filter beyond the keys, nor where the rows are all kept
/// under one key (then any change may flip any row).
struct OtherKeys {
    touched: HashSet<Key>,
    had: Option<HashSet<Key>>,
}

impl OtherKeys {
    /// Before `edge`'s rows of the epoch (in `new`) are taken.
    fn before(
        f: &StageFunction,
        u: &UpdatingState,
        new: &BTreeMap<u32, RecordBatch>,
        edge: u32,
        filtered: bool,
    ) -> Result<Self> {
        let touched = match new.get(&edge) {
            Some(batch) if f.edge_updates(edge) => u.keys_in(edge, &changelog::strip(batch)?)?,
            Some(batch) => u.keys_in(edge, batch)?,
            None => HashSet::new(),
        };
        let had = (!filtered && u.by_key(edge)).then(|| {
            touched
                .iter()
                .filter(|k| u.holds(edge, k))
                .cloned()
                .collect()
        });
        Ok(OtherKeys { touched, had })
    }

    /// After they are taken: the keys whose rows on the other side may
    /// now match differently (those that went from none to some or back;
    /// with a filter, every key touched).
    fn flipped(self, u: &UpdatingState, edge: u32) -> HashSet<Key> {
        match self.had {
            None => self.touched,
            Some(had) => self
                .touched
                .into_iter()
                .filter(|k| u.holds(edge, k) != had.contains(k))
                .collect(),
        }
    }
}

/// The keys of `edge`'s rows taken back and added this epoch.
fn keys_of_both(
    u: &UpdatingState,
    edge: u32,
    out: &RecordBatch,
    came: &RecordBatch,
) -> Result<HashSet<Key>> {
    let mut keys = u.keys_in(edge, out)?;
    keys.extend(u.keys_in(edge, came)?);
    Ok(keys)
}

/// `after` less `before` as `(retractions, inserts)`, rows of `schema`.
fn changed(
    schema: &SchemaRef,
    before: &[RecordBatch],
    after: &[RecordBatch],
) -> Result<(RecordBatch, RecordBatch)> {
    changelog::diff::diff(
        &RowEncoder::whole(schema)?,
        &concat(schema, before)?,
        &concat(schema, after)?,
    )
}

/// Each edge's rows of the epoch, as one batch.
fn epoch_rows(edges: BTreeMap<u32, Vec<Arrived>>) -> Result<BTreeMap<u32, RecordBatch>> {
    let mut new = BTreeMap::new();
    for (edge, arrived) in edges {
        let batches = batches_of(arrived);
        if let Some(first) = batches.first() {
            new.insert(edge, concat(&first.schema(), &batches)?);
        }
    }
    Ok(new)
}

/// `edge`'s rows of `keys` before this epoch: as they are now, plus those
/// it took back (`gone`), less those it added (`came`).
fn o_as_it_was(
    u: &UpdatingState,
    edge: u32,
    keys: &HashSet<Key>,
    now: &RecordBatch,
    gone: &RecordBatch,
    came: &RecordBatch,
) -> Result<RecordBatch> {
    let schema = now.schema();
    let gone = u.rows_with_keys(edge, gone, keys)?;
    let came = u.rows_with_keys(edge, came, keys)?;
    let with_gone = concat(&schema, &[now.clone(), gone])?;
    let (_, was) = changelog::diff::diff(&RowEncoder::whole(&schema)?, &came, &with_gone)?;
    Ok(was)
}

/// Keep `edge`'s new rows: the rows it took back and the rows it added.
fn take(
    f: &StageFunction,
    u: &mut UpdatingState,
    batch: Option<RecordBatch>,
    edge: u32,
) -> Result<(RecordBatch, RecordBatch)> {
    match batch {
        Some(batch) => u.take_input_changes(edge, batch, f.edge_updates(edge)),
        None => {
            let schema = u
                .edge_schema(edge)
                .ok_or_else(|| EngineError::Context(format!("{}: no input edge {edge}", f.name)))?;
            Ok((
                RecordBatch::new_empty(schema.clone()),
                RecordBatch::new_empty(schema),
            ))
        }
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
