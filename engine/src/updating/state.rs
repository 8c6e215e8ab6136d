//! What an updating member keeps: every input row by key, and what it has
//! emitted by key; the changes it made since its last checkpoint, so a
//! checkpoint writes those rather than everything.

use std::collections::{BTreeMap, HashMap, HashSet};

use datafusion::arrow::array::{BooleanArray, Int8Array, RecordBatch};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::SchemaRef;

use super::aggregate::GroupAccumulators;
use super::keyed::{Key, KeyedRows, concat};
use super::split::UpdatingPlan;
use crate::changelog::diff;
use crate::changelog::row_key::RowEncoder;
use crate::changelog::{self, INSERT, RETRACT};
use crate::error::{EngineError, Result};
use crate::window_state::Change;

/// The pseudo edge that the emitted rows travel under in a checkpoint.
pub const EMITTED: u32 = u32::MAX;

/// The pseudo edge an aggregate's input rows travel under in a checkpoint
/// (the rows its accumulators took since the last whole state).
pub const AGGREGATE_INPUT: u32 = u32::MAX - 2;

/// The pseudo edge an aggregate's groups travel under in a whole state.
pub const GROUPS: u32 = u32::MAX - 3;

/// Rows per batch of a whole checkpoint.
const CHECKPOINT_BATCH_ROWS: usize = 64 * 1024;

/// The keys an emission computes.
#[derive(Debug)]
pub enum Due {
    /// Nothing was touched.
    Nothing,
    /// These keys.
    Keys(HashSet<Key>),
    /// Every key (after a restore, whose untouched keys are not known).
    All,
}

/// One updating member's state.
#[derive(Debug)]
pub struct UpdatingState {
    edges: BTreeMap<u32, KeyedRows>,
    /// An aggregate kept as accumulators, in place of its input rows
    /// (`edges` is then empty).
    aggregate: Option<GroupAccumulators>,
    /// The journal cannot say what happened since the last checkpoint (an
    /// aggregate's groups expired): the next one is whole.
    whole_next: bool,
    emitted: KeyedRows,
    whole_rows: RowEncoder,
    /// Keys touched since the last emission.
    pending: HashSet<Key>,
    pending_all: bool,
    /// Changes since the last checkpoint, when checkpoints want them.
    journal: Option<Vec<Change>>,
    /// Retractions that named no kept row, since the start.
    unmatched: u64,
    /// Per edge with a state TTL: how many epochs a key's rows stay after
    /// the edge last had a row of that key.
    ttl: BTreeMap<u32, u64>,
    /// Per such edge, the epoch each key last had a row.
    touched: BTreeMap<u32, HashMap<Key, u64>>,
    /// The epoch being run.
    epoch: u64,
    /// The result is one group (no key), and it has not been computed
    /// since the state began: its first emission computes it even with no
    /// input, so a global aggregate shows its row for an empty stream.
    first_of_one_group: bool,
}

impl UpdatingState {
    /// Empty state for `plan`, whose input edges have leaf schemas
    /// `schemas` and whose core outputs `core_schema`.
    pub fn new(plan: &UpdatingPlan, schemas: &BTreeMap<u32, SchemaRef>) -> Result<Self> {
        let mut edges = BTreeMap::new();
        for (edge, key) in &plan.edge_keys {
            let schema = schemas.get(edge).ok_or_else(|| {
                EngineError::Context(format!("updating stage: no schema for edge {edge}"))
            })?;
            edges.insert(*edge, KeyedRows::new(schema.clone(), key.clone())?);
        }
        let core_schema = plan.core.schema();
        let (aggregate, emitted_key) = match &plan.aggregate {
            Some(agg) => {
                // A join's sides stay: the join needs them.
                if agg.join.is_none() {
                    edges.clear();
                }
                let g = agg.group_count();
                (
                    Some(GroupAccumulators::new(agg.clone())?),
                    (g > 0).then(|| (0..g).collect()),
                )
            }
            None => (None, plan.out_key.clone()),
        };
        let first_of_one_group = emitted_key.is_none();
        Ok(UpdatingState {
            edges,
            aggregate,
            whole_next: false,
            whole_rows: RowEncoder::whole(&core_schema)?,
            emitted: KeyedRows::new(core_schema, emitted_key)?,
            pending: HashSet::new(),
            pending_all: false,
            journal: None,
            unmatched: 0,
            ttl: BTreeMap::new(),
            touched: BTreeMap::new(),
            epoch: 0,
            first_of_one_group,
        })
    }

    /// Keep the rows of `edge` for `epochs` epochs after the edge last had
    /// a row of their key.
    pub fn set_ttl(&mut self, edge: u32, epochs: u64) {
        self.ttl.insert(edge, epochs);
        self.touched.entry(edge).or_default();
    }

    /// An aggregate that emits every epoch reads what it last emitted from
    /// its groups as they were before the epoch, and keeps no copy of it:
    /// at the end of every epoch the two are the same. (With an emit
    /// interval, groups change between emissions, and a checkpoint between
    /// them must hold what was emitted: the copy stays.)
    pub fn emit_from_groups(&mut self) {
        if let Some(agg) = &mut self.aggregate {
            agg.keep_rows_before();
        }
    }

    /// An aggregate's groups say what was emitted, and `emitted` stays
    /// empty ([`Self::emit_from_groups`]).
    /// An aggregate that emits every epoch moves its cold groups to local
    /// disk once those in memory hold more than `budget` bytes (after the
    /// TTLs are set). Whether it does: not with an emit interval, whose
    /// copy of the emitted rows stays in memory anyway.
    pub fn spill_groups_past(&mut self, budget: usize) -> Result<bool> {
        if !self.emitted_from_groups() {
            return Ok(false);
        }
        let ttl = self.ttl.values().min().copied();
        match &mut self.aggregate {
            Some(agg) => agg.spill_past(budget, ttl),
            None => Ok(false),
        }
    }

    /// After the epoch's emission: cold groups to disk, if over budget.
    /// Returns how many went.
    pub fn spill_cold(&mut self) -> Result<usize> {
        match &mut self.aggregate {
            Some(agg) => agg.spill_cold(self.epoch),
            None => Ok(0),
        }
    }

    fn emitted_from_groups(&self) -> bool {
        self.aggregate
            .as_ref()
            .is_some_and(GroupAccumulators::keeps_rows_before)
    }

    /// The epoch whose input comes next.
    pub fn begin_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Drop the rows of keys whose TTL ran out, and what was emitted for
    /// those keys, without retracting it: a key whose state expired starts
    /// afresh, and its result stays in the sink until its next row (see
    /// docs/updating.md). Returns the rows dropped.
    pub fn expire(&mut self) -> Result<usize> {
        let groups = self.expire_groups()?;
        Ok(groups + self.expire_rows()?)
    }

    /// The rows part of [`Self::expire`]: an aggregate's groups are not
    /// keyed as its (joined) input rows are, and expire apart.
    fn expire_rows(&mut self) -> Result<usize> {
        let mut dropped = 0;
        let mut gone: HashSet<Key> = HashSet::new();
        for (edge, ttl) in &self.ttl {
            let Some(touched) = self.touched.get_mut(edge) else {
                continue;
            };
            let old: HashSet<Key> = touched
                .iter()
                .filter(|(_, t)| self.epoch.saturating_sub(**t) > *ttl)
                .map(|(k, _)| k.clone())
                .collect();
            if old.is_empty() {
                continue;
            }
            touched.retain(|k, _| !old.contains(k));
            let rows = self.edges.get_mut(edge).expect("edge with a TTL");
            let expired = rows.gather(&old)?;
            dropped += expired.num_rows();
            rows.remove_keys(&old);
            if let Some(j) = &mut self.journal {
                j.push(Change::Rows {
                    edge: *edge,
                    batch: changelog::tag(&expired, RETRACT)?,
                });
            }
            gone.extend(old);
        }
        if !gone.is_empty() && self.aggregate.is_none() {
            let emitted = self.emitted.gather(&gone)?;
            self.emitted.remove_keys(&gone);
            if let Some(j) = &mut self.journal {
                j.push(Change::Rows {
                    edge: EMITTED,
                    batch: changelog::tag(&emitted, RETRACT)?,
                });
            }
            for k in &gone {
                self.pending.remove(k);
            }
        }
        Ok(dropped)
    }

    /// An aggregate's groups whose TTL ran out, as [`Self::expire`] does
    /// for rows. Returns the groups dropped.
    fn expire_groups(&mut self) -> Result<usize> {
        let Some(agg) = &mut self.aggregate else {
            return Ok(0);
        };
        let Some(ttl) = self.ttl.values().min().copied() else {
            return Ok(0);
        };
        let gone = agg.idle(self.epoch, ttl);
        if gone.is_empty() {
            return Ok(0);
        }
        agg.remove(&gone);
        self.emitted.remove_keys(&gone);
        for k in &gone {
            self.pending.remove(k);
        }
        self.whole_next = true;
        Ok(gone.len())
    }

    /// Take an epoch's rows of an aggregate's input (its edge's rows after
    /// the operators below it): rows taken back, and new rows.
    pub fn take_aggregate_input(
        &mut self,
        retract: RecordBatch,
        insert: RecordBatch,
    ) -> Result<()> {
        let agg = self
            .aggregate
            .as_mut()
            .ok_or_else(|| EngineError::Context("updating stage: no aggregate".into()))?;
        if retract.num_rows() == 0 && insert.num_rows() == 0 {
            return Ok(());
        }
        if let Some(j) = &mut self.journal {
            j.push(Change::Rows {
                edge: AGGREGATE_INPUT,
                batch: changes(&retract, &insert)?,
            });
        }
        // New rows first: a group whose rows all go in one epoch is gone,
        // not gone and back.
        self.pending.extend(agg.apply(&insert, false, self.epoch)?);
        self.pending.extend(agg.apply(&retract, true, self.epoch)?);
        Ok(())
    }

    /// Whether this state keeps an aggregate as accumulators.
    pub fn aggregates(&self) -> bool {
        self.aggregate.is_some()
    }

    /// An aggregate's output for the `due` groups now.
    pub fn aggregate_result(&mut self, due: &Due) -> Result<RecordBatch> {
        let agg = self
            .aggregate
            .as_mut()
            .ok_or_else(|| EngineError::Context("updating stage: no aggregate".into()))?;
        match due {
            Due::Keys(keys) => agg.evaluate(keys.iter()),
            Due::All | Due::Nothing => agg.evaluate_all(),
        }
    }

    /// Take an epoch's batch of one edge: a changelog, or (`updating`
    /// false) rows that are all new.
    pub fn take_input(&mut self, edge: u32, batch: RecordBatch, updating: bool) -> Result<()> {
        self.take_input_changes(edge, batch, updating).map(|_| ())
    }

    /// As [`Self::take_input`], returning the rows it took back (only those
    /// this stage held) and the rows it added.
    pub fn take_input_changes(
        &mut self,
        edge: u32,
        batch: RecordBatch,
        updating: bool,
    ) -> Result<(RecordBatch, RecordBatch)> {
        let batch = if updating {
            batch
        } else {
            changelog::tag(&batch, INSERT)?
        };
        if batch.num_rows() > 0
            && let Some(j) = &mut self.journal
        {
            j.push(Change::Rows {
                edge,
                batch: batch.clone(),
            });
        }
        self.apply_input(edge, &batch, true)
    }

    fn apply_input(
        &mut self,
        edge: u32,
        batch: &RecordBatch,
        touch: bool,
    ) -> Result<(RecordBatch, RecordBatch)> {
        let rows = self
            .edges
            .get_mut(&edge)
            .ok_or_else(|| EngineError::Context(format!("updating stage: no input edge {edge}")))?;
        if batch.num_rows() == 0 {
            let none = RecordBatch::new_empty(rows.schema().clone());
            return Ok((none.clone(), none));
        }
        let (retract, insert) = changelog::split(batch)?;
        if touch {
            let keys: Vec<Key> = rows
                .keys_of(&insert)?
                .into_iter()
                .chain(rows.keys_of(&retract)?)
                .collect();
            if let Some(touched) = self.touched.get_mut(&edge) {
                for k in &keys {
                    touched.insert(k.clone(), self.epoch);
                }
            }
            self.pending.extend(keys);
        }
        // A retraction names a row sent before it, possibly in this batch.
        rows.insert(insert.clone())?;
        let matched = rows.retract_matching(&retract)?;
        let unmatched = matched.iter().filter(|m| !**m).count();
        let retract = if unmatched > 0 {
            self.unmatched += unmatched as u64;
            tracing::warn!(
                edge,
                rows = unmatched,
                "retractions named rows this stage does not hold; they were ignored"
            );
            filter_record_batch(&retract, &BooleanArray::from(matched))?
        } else {
            retract
        };
        rows.compact_if_sparse()?;
        Ok((retract, insert))
    }

    /// Forget the keys rows touched (not a restore's "every key"): an
    /// aggregate over a join follows its groups, not the join's keys.
    pub fn forget_touched_rows(&mut self) {
        self.pending.clear();
    }

    /// The keys to compute now; they are no longer pending.
    pub fn take_due(&mut self) -> Due {
        if std::mem::take(&mut self.first_of_one_group) {
            self.pending.insert(Key::default());
        }
        if std::mem::take(&mut self.pending_all) {
            self.pending.clear();
            return Due::All;
        }
        if self.pending.is_empty() {
            return Due::Nothing;
        }
        Due::Keys(std::mem::take(&mut self.pending))
    }

    /// The input rows of `due` keys on `edge`.
    pub fn input_rows(&self, edge: u32, due: &Due) -> Result<RecordBatch> {
        let rows = &self.edges[&edge];
        match due {
            Due::Keys(keys) => rows.gather(keys),
            Due::All | Due::Nothing => rows.all(),
        }
    }

    /// `result` is the core's output for the `due` keys now: what changed
    /// since it was last emitted, as `(retractions, inserts)`, which are
    /// from now on what was emitted.
    pub fn emit(&mut self, due: &Due, result: RecordBatch) -> Result<(RecordBatch, RecordBatch)> {
        if self.emitted_from_groups()
            && let Some(agg) = &mut self.aggregate
        {
            // The rows before cover exactly the groups touched: the due
            // keys, as every epoch emits.
            let old = agg.take_before()?;
            return diff(&self.whole_rows, &old, &result);
        }
        let old = match due {
            Due::Keys(keys) => self.emitted.gather(keys)?,
            Due::All | Due::Nothing => self.emitted.all()?,
        };
        let (retract, insert) = diff(&self.whole_rows, &old, &result)?;
        match due {
            Due::Keys(keys) => self.emitted.remove_keys(keys),
            Due::All | Due::Nothing => self.emitted.clear(),
        }
        self.emitted.insert(result)?;
        self.emitted.compact_if_sparse()?;
        if let Some(j) = &mut self.journal
            && (retract.num_rows() > 0 || insert.num_rows() > 0)
        {
            j.push(Change::Rows {
                edge: EMITTED,
                batch: changes(&retract, &insert)?,
            });
        }
        Ok((retract, insert))
    }

    /// Keys of `due` whose rows on `edge` are many enough to merge.
    pub fn to_merge(&self, edge: u32, due: &Due, rows: usize) -> HashSet<Key> {
        match (due, self.edges.get(&edge)) {
            (Due::Keys(keys), Some(kept)) => kept.crowded(keys, rows),
            (Due::All, Some(kept)) => {
                let all: HashSet<Key> = kept.keys().cloned().collect();
                kept.crowded(&all, rows)
            }
            _ => HashSet::new(),
        }
    }

    /// The keys of the rows of `batch`, rows of `edge`.
    pub fn keys_in(&self, edge: u32, batch: &RecordBatch) -> Result<HashSet<Key>> {
        match self.edges.get(&edge) {
            Some(rows) => Ok(rows.keys_of(batch)?.into_iter().collect()),
            None => Ok(HashSet::new()),
        }
    }

    /// Whether `edge` keeps its rows under their keys; without keys (a
    /// stage of one member gets its input gathered, not partitioned) every
    /// row is under one.
    pub fn by_key(&self, edge: u32) -> bool {
        self.edges.get(&edge).is_some_and(KeyedRows::by_key)
    }

    /// Whether `edge` holds a row of `key`.
    pub fn holds(&self, edge: u32, key: &Key) -> bool {
        self.edges.get(&edge).is_some_and(|r| r.has_key(key))
    }

    /// The rows of `batch`, rows of `edge`, whose keys are in `keys`.
    pub fn rows_with_keys(
        &self,
        edge: u32,
        batch: &RecordBatch,
        keys: &HashSet<Key>,
    ) -> Result<RecordBatch> {
        let rows = self
            .edges
            .get(&edge)
            .ok_or_else(|| EngineError::Context(format!("updating stage: no input edge {edge}")))?;
        let wanted: BooleanArray = rows
            .keys_of(batch)?
            .iter()
            .map(|k| Some(keys.contains(k)))
            .collect();
        Ok(filter_record_batch(batch, &wanted)?)
    }

    /// The schema of `edge`'s rows.
    pub fn edge_schema(&self, edge: u32) -> Option<SchemaRef> {
        self.edges.get(&edge).map(|r| r.schema().clone())
    }

    /// The rows of `keys` on `edge`, for a merge.
    pub fn rows_of(&self, edge: u32, keys: &HashSet<Key>) -> Result<RecordBatch> {
        self.edges[&edge].gather(keys)
    }

    /// Replace the rows of `keys` on `edge` with `merged` (partial
    /// aggregates merged into one row per key: the same state in fewer
    /// rows).
    pub fn replace(&mut self, edge: u32, keys: &HashSet<Key>, merged: RecordBatch) -> Result<()> {
        let rows = self
            .edges
            .get_mut(&edge)
            .ok_or_else(|| EngineError::Context(format!("updating stage: no input edge {edge}")))?;
        let old = rows.gather(keys)?;
        rows.remove_keys(keys);
        if let Some(j) = &mut self.journal {
            j.push(Change::Rows {
                edge,
                batch: changes(&old, &merged)?,
            });
        }
        rows.insert(merged)?;
        rows.compact_if_sparse()
    }

    /// Keep of `due` keys' rows on `edge` only `kept` (rows that stay in
    /// the result, see [`super::top_n`]); nothing is written when they are
    /// all that is kept already.
    pub fn keep_only(&mut self, edge: u32, due: &Due, kept: RecordBatch) -> Result<()> {
        let Some(rows) = self.edges.get(&edge) else {
            return Ok(());
        };
        let keys: HashSet<Key> = match due {
            Due::Keys(keys) => keys.clone(),
            Due::All => rows.keys().cloned().collect(),
            Due::Nothing => return Ok(()),
        };
        if rows.count_of(&keys) == kept.num_rows() {
            return Ok(());
        }
        // The result's names for the edge's columns.
        let kept = kept
            .clone()
            .with_schema(rows.schema().clone())
            .unwrap_or(kept);
        self.replace(edge, &keys, kept)
    }

    /// Entries kept for the input: rows over every input edge, and an
    /// aggregate's groups.
    pub fn rows(&self) -> usize {
        self.aggregate.as_ref().map_or(0, GroupAccumulators::len)
            + self.edges.values().map(KeyedRows::len).sum::<usize>()
    }

    /// Of [`Self::rows`], the groups on local disk, if an aggregate may
    /// move them there.
    pub fn spilled_rows(&self) -> Option<usize> {
        self.aggregate
            .as_ref()
            .filter(|agg| agg.spills())
            .map(GroupAccumulators::spilled)
    }

    /// Distinct values on local disk, if an aggregate may move them there.
    pub fn spilled_values(&self) -> Option<usize> {
        self.aggregate
            .as_ref()
            .filter(|agg| agg.spills())
            .map(GroupAccumulators::spilled_values)
    }

    /// Rows a whole checkpoint holds: every input edge's and the emitted.
    pub fn checkpoint_rows(&self) -> usize {
        self.rows() + self.emitted.len()
    }

    /// Bytes kept, inputs and emitted rows.
    pub fn bytes(&self) -> usize {
        self.edges.values().map(KeyedRows::bytes).sum::<usize>()
            + self.aggregate.as_ref().map_or(0, GroupAccumulators::bytes)
            + self.emitted.bytes()
    }

    /// Retractions that named no kept row.
    pub fn unmatched(&self) -> u64 {
        self.unmatched
    }

    /// Keep the changes from now on, for checkpoints that write only them.
    pub fn keep_changes(&mut self) {
        self.journal.get_or_insert_with(Vec::new);
    }

    /// The changes since the last call.
    pub fn take_changes(&mut self) -> Option<Vec<Change>> {
        let changes = self.journal.as_mut().map(std::mem::take);
        if std::mem::take(&mut self.whole_next) {
            return None;
        }
        changes
    }

    /// The schema of each edge's rows in a checkpoint (with the op column),
    /// the emitted rows under [`EMITTED`].
    pub fn checkpoint_schemas(&self) -> BTreeMap<u32, SchemaRef> {
        let mut out: BTreeMap<u32, SchemaRef> = self
            .edges
            .iter()
            .map(|(e, rows)| (*e, changelog::with_op(rows.schema())))
            .collect();
        out.insert(EMITTED, changelog::with_op(self.emitted.schema()));
        if let Some(agg) = self.aggregate.as_ref().map(GroupAccumulators::plan) {
            out.insert(AGGREGATE_INPUT, changelog::with_op(&agg.input_schema));
            out.insert(GROUPS, changelog::with_op(agg.saved_schema()));
        }
        out
    }

    /// Everything kept, per edge (and [`EMITTED`]), as inserts.
    pub fn whole(&mut self) -> Result<BTreeMap<u32, Vec<RecordBatch>>> {
        let mut out = BTreeMap::new();
        if let Some(agg) = &mut self.aggregate {
            let groups = agg
                .whole()?
                .iter()
                .map(|b| changelog::tag(b, INSERT))
                .collect::<Result<Vec<_>>>()?;
            out.insert(GROUPS, groups);
        }
        for (edge, rows) in self.edges.iter().chain([(&EMITTED, &self.emitted)]) {
            let chunks = rows
                .chunks(CHECKPOINT_BATCH_ROWS)?
                .iter()
                .map(|b| changelog::tag(b, INSERT))
                .collect::<Result<Vec<_>>>()?;
            out.insert(*edge, chunks);
        }
        Ok(out)
    }

    /// Take back a whole state ([`UpdatingState::whole`]) and then the
    /// changes written on it, in order, as of the end of epoch `as_of`. What was pending when it was saved
    /// is not known: the next emission computes every key (keys that did
    /// not change give no change).
    pub fn restore(
        &mut self,
        whole: BTreeMap<u32, Vec<RecordBatch>>,
        changes: Vec<Vec<Change>>,
        as_of: u64,
    ) -> Result<()> {
        self.epoch = as_of;
        for rows in self.edges.values_mut() {
            rows.clear();
        }
        self.emitted.clear();
        if let Some(agg) = &mut self.aggregate {
            agg.clear()?;
        }
        self.whole_next = false;
        for (edge, batches) in whole {
            for b in batches {
                self.apply_saved(edge, &b)?;
            }
        }
        for change in changes.into_iter().flatten() {
            match change {
                Change::Rows { edge, batch } => self.apply_saved(edge, &batch)?,
                Change::Arrived { edge, batches, .. } => {
                    for batch in batches {
                        self.apply_saved(edge, &batch)?;
                    }
                }
                Change::Released(_) => {
                    return Err(EngineError::Context(
                        "an updating stage's checkpoint holds a window release".into(),
                    ));
                }
            }
        }
        self.pending.clear();
        if self.emitted_from_groups() {
            // Every epoch emitted, the last before the checkpoint too: the
            // groups now are what was emitted.
            self.pending_all = false;
            self.first_of_one_group = false;
            if let Some(agg) = &mut self.aggregate {
                // The replayed changes' rows before are not news.
                agg.take_before()?;
            }
        } else {
            self.pending_all = true;
        }
        if let Some(j) = &mut self.journal {
            j.clear();
        }
        // When each key was last touched is not saved: from now.
        for (edge, touched) in self.touched.iter_mut() {
            touched.clear();
            if let Some(rows) = self.edges.get(edge) {
                touched.extend(rows.keys().map(|k| (k.clone(), self.epoch)));
            }
        }
        Ok(())
    }

    fn apply_saved(&mut self, edge: u32, batch: &RecordBatch) -> Result<()> {
        if let Some(agg) = &mut self.aggregate {
            match edge {
                GROUPS => return agg.restore(&changelog::strip(batch)?, self.epoch),
                AGGREGATE_INPUT => {
                    let (retract, insert) = changelog::split(batch)?;
                    agg.apply(&insert, false, self.epoch)?;
                    agg.apply(&retract, true, self.epoch)?;
                    return Ok(());
                }
                // The emitted rows, or a join's sides (below).
                _ => {}
            }
        }
        if edge != EMITTED {
            return self.apply_input(edge, batch, false).map(|_| ());
        }
        if self.emitted_from_groups() {
            // A checkpoint written with a copy: the groups say the same.
            return Ok(());
        }
        let (retract, insert) = changelog::split(batch)?;
        self.emitted.retract(&retract)?;
        self.emitted.insert(insert)
    }
}

/// Retractions then inserts, as one changelog batch.
pub fn changes(retract: &RecordBatch, insert: &RecordBatch) -> Result<RecordBatch> {
    let schema = retract.schema();
    let rows = concat(&schema, &[retract.clone(), insert.clone()])?;
    let ops: Int8Array = std::iter::repeat_n(RETRACT, retract.num_rows())
        .chain(std::iter::repeat_n(INSERT, insert.num_rows()))
        .map(Some)
        .collect();
    changelog::tag_each(&rows, ops)
}
