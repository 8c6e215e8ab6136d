//! Accumulators per group against answers computed by hand.

use std::collections::BTreeMap;

use datafusion::arrow::array::{Float64Array, StringArray};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::functions_aggregate::average::avg_udaf;
use datafusion::functions_aggregate::count::count_udaf;
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::AggregateUDF;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateExprBuilder;
use datafusion::physical_expr::expressions::{cast, col};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::aggregates::{AggregateMode, PhysicalGroupBy};

use super::*;
use crate::context::InputEdge;
use crate::exec::{StageInput, StageInputExec};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

fn rows(keys: &[&str], values: &[Option<i64>]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from(keys.to_vec())),
            Arc::new(Int64Array::from(values.to_vec())),
        ],
    )
    .unwrap()
}

fn edge(updating: bool) -> InputEdge {
    InputEdge {
        shuffle_id: 1,
        senders: 1,
        sender_stage: None,
        window: None,
        tables: vec![],
        late_letters: None,
        updating,
        key: Some(vec![0]),
    }
}

/// `SELECT k, f(v) ... GROUP BY k` over edge 1, in one step.
fn aggregate(functions: &[(Arc<AggregateUDF>, bool)]) -> Arc<dyn ExecutionPlan> {
    let s = schema();
    aggregate_by(
        functions,
        PhysicalGroupBy::new_single(vec![(col("k", &s).unwrap(), "k".into())]),
    )
}

/// `SELECT f(v) ...` (no `GROUP BY`) over edge 1.
fn global_aggregate(functions: &[(Arc<AggregateUDF>, bool)]) -> Arc<dyn ExecutionPlan> {
    aggregate_by(functions, PhysicalGroupBy::new_single(vec![]))
}

fn aggregate_by(
    functions: &[(Arc<AggregateUDF>, bool)],
    group_by: PhysicalGroupBy,
) -> Arc<dyn ExecutionPlan> {
    let s = schema();
    let leaf: Arc<dyn ExecutionPlan> = Arc::new(StageInputExec::new(
        StageInput::Shuffle { shuffle_id: 1 },
        s.clone(),
    ));
    let aggs = functions
        .iter()
        .enumerate()
        .map(|(i, (f, distinct))| {
            Arc::new(
                AggregateExprBuilder::new(f.clone(), vec![argument(f, &s)])
                    .schema(s.clone())
                    .alias(format!("a{i}"))
                    .with_distinct(*distinct)
                    .build()
                    .unwrap(),
            )
        })
        .collect::<Vec<_>>();
    let filters = vec![None; aggs.len()];
    Arc::new(
        AggregateExec::try_new(
            AggregateMode::SinglePartitioned,
            group_by,
            aggs,
            filters,
            leaf,
            s,
        )
        .unwrap(),
    )
}

/// `v`, as SQL's type coercion gives it to the function: `avg` reads
/// floats.
fn argument(f: &AggregateUDF, s: &SchemaRef) -> Arc<dyn PhysicalExpr> {
    let v = col("v", s).unwrap();
    if f.name() == "avg" {
        return cast(v, s, DataType::Float64).unwrap();
    }
    v
}

/// Each group's row as text, by key.
fn table(batch: &RecordBatch) -> BTreeMap<String, Vec<String>> {
    let keys = batch
        .column(0)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    (0..batch.num_rows())
        .map(|r| {
            let values = (1..batch.num_columns())
                .map(|c| {
                    datafusion::arrow::util::display::array_value_to_string(batch.column(c), r)
                        .unwrap()
                })
                .collect();
            (keys.value(r).to_string(), values)
        })
        .collect()
}

fn expect(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
        .collect()
}

#[test]
fn groups_take_new_rows_and_only_touched_groups_are_evaluated() {
    let core = aggregate(&[
        (count_udaf(), false),
        (sum_udaf(), false),
        (max_udaf(), false),
    ]);
    let plan = Arc::new(AggregatePlan::of(&core, &[edge(false)]).expect("runs on accumulators"));
    let mut groups = GroupAccumulators::new(plan).unwrap();
    groups
        .apply(
            &rows(&["a", "b", "a"], &[Some(1), Some(5), Some(7)]),
            false,
            1,
        )
        .unwrap();
    let touched = groups
        .apply(&rows(&["a", "c"], &[None, Some(2)]), false, 2)
        .unwrap();
    assert_eq!(touched.len(), 2);
    assert_eq!(
        table(&groups.evaluate(touched.iter()).unwrap()),
        expect(&[("a", &["2", "8", "7"]), ("c", &["1", "2", "2"])]),
        "count skips the null; b was not touched"
    );
    assert_eq!(groups.len(), 3);
    // Taking back rows of an aggregate over appended rows is refused.
    assert!(groups.apply(&rows(&["a"], &[Some(1)]), true, 3).is_err());
}

#[test]
fn a_changelog_retracts_and_an_emptied_group_is_gone() {
    let core = aggregate(&[
        (count_udaf(), false),
        (sum_udaf(), false),
        (avg_udaf(), false),
    ]);
    let plan = Arc::new(AggregatePlan::of(&core, &[edge(true)]).expect("retractable"));
    let mut groups = GroupAccumulators::new(plan).unwrap();
    groups
        .apply(
            &rows(&["a", "a", "b"], &[Some(2), Some(4), Some(10)]),
            false,
            1,
        )
        .unwrap();
    groups
        .apply(&rows(&["a", "b"], &[Some(2), Some(10)]), true, 2)
        .unwrap();
    assert_eq!(groups.len(), 1, "b lost its only row");
    assert_eq!(
        table(&groups.evaluate_all().unwrap()),
        expect(&[("a", &["1", "4", "4.0"])])
    );
}

#[test]
fn min_max_and_distinct_over_a_changelog_count_their_values_and_restore_exactly() {
    let core = aggregate(&[
        (min_udaf(), false),
        (max_udaf(), false),
        (count_udaf(), true),
    ]);
    let plan = Arc::new(AggregatePlan::of(&core, &[edge(true)]).expect("runs on value counts"));
    assert!(
        plan.describe().contains("max as a count per value"),
        "{}",
        plan.describe()
    );
    let mut groups = GroupAccumulators::new(plan.clone()).unwrap();
    groups
        .apply(
            &rows(&["a", "a", "a", "b"], &[Some(4), Some(9), Some(9), Some(2)]),
            false,
            1,
        )
        .unwrap();
    // One 9 goes: the other 9 keeps the max and the distinct count.
    groups.apply(&rows(&["a"], &[Some(9)]), true, 2).unwrap();
    assert_eq!(
        table(&groups.evaluate_all().unwrap()),
        expect(&[("a", &["4", "9", "2"]), ("b", &["2", "2", "1"])])
    );
    // A checkpoint taken now, restored, goes on like the original.
    let mut after = GroupAccumulators::new(plan).unwrap();
    for b in &groups.whole().unwrap() {
        after.restore(b, 2).unwrap();
    }
    for g in [&mut groups, &mut after] {
        g.apply(&rows(&["a", "b"], &[Some(9), Some(7)]), false, 3)
            .unwrap();
        g.apply(
            &rows(&["a", "a", "b"], &[Some(9), Some(9), Some(2)]),
            true,
            4,
        )
        .unwrap();
    }
    // a's 9s are gone; b's first minimum went, its 7 stays.
    let want = expect(&[("a", &["4", "4", "1"]), ("b", &["7", "7", "1"])]);
    assert_eq!(table(&groups.evaluate_all().unwrap()), want);
    assert_eq!(table(&after.evaluate_all().unwrap()), want);
}

#[test]
fn other_aggregates_over_a_changelog_keep_the_recompute_path() {
    assert!(AggregatePlan::of(&aggregate(&[(sum_udaf(), true)]), &[edge(true)]).is_none());
    assert!(AggregatePlan::of(&aggregate(&[(count_udaf(), true)]), &[edge(false)]).is_some());
}

#[test]
fn a_checkpoint_of_the_groups_restores_them_exactly() {
    for updating in [false, true] {
        let functions: Vec<(Arc<AggregateUDF>, bool)> = if updating {
            vec![
                (count_udaf(), false),
                (sum_udaf(), false),
                (avg_udaf(), false),
            ]
        } else {
            vec![
                (count_udaf(), true),
                (max_udaf(), false),
                (avg_udaf(), false),
            ]
        };
        let core = aggregate(&functions);
        let plan = Arc::new(AggregatePlan::of(&core, &[edge(updating)]).unwrap());
        let mut before = GroupAccumulators::new(plan.clone()).unwrap();
        before
            .apply(
                &rows(&["a", "a", "b", "a"], &[Some(3), Some(3), Some(8), Some(5)]),
                false,
                1,
            )
            .unwrap();
        let saved = before.whole().unwrap();
        assert_eq!(saved[0].schema(), *plan.saved_schema());
        let mut after = GroupAccumulators::new(plan.clone()).unwrap();
        for b in &saved {
            after.restore(b, 1).unwrap();
        }
        // Both go on alike from here, and the saved one was not emptied.
        let more = rows(&["a", "b"], &[Some(9), Some(1)]);
        before.apply(&more, false, 2).unwrap();
        after.apply(&more, false, 2).unwrap();
        if updating {
            before.apply(&rows(&["a"], &[Some(3)]), true, 3).unwrap();
            after.apply(&rows(&["a"], &[Some(3)]), true, 3).unwrap();
        }
        let (b, a) = (
            before.evaluate_all().unwrap(),
            after.evaluate_all().unwrap(),
        );
        assert_eq!(table(&b), table(&a), "updating {updating}");
        let avg = a.column(3).as_any().downcast_ref::<Float64Array>().unwrap();
        let want = if updating {
            (3.0 + 5.0 + 9.0) / 3.0
        } else {
            5.0
        };
        assert_eq!(avg.value(0), want, "group a, updating {updating}");
    }
}

#[test]
fn a_global_aggregate_has_its_row_over_no_rows_and_after_every_row_is_taken_back() {
    let core = global_aggregate(&[(count_udaf(), false), (sum_udaf(), false)]);
    let plan = Arc::new(AggregatePlan::of(&core, &[edge(true)]).expect("retractable"));
    let mut groups = GroupAccumulators::new(plan).unwrap();
    let text = |b: &RecordBatch| {
        (0..b.num_rows())
            .map(|r| {
                (0..b.num_columns())
                    .map(|c| {
                        datafusion::arrow::util::display::array_value_to_string(b.column(c), r)
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect::<Vec<_>>()
    };
    // SQL: count 0 and sum NULL over no rows, one row.
    assert_eq!(text(&groups.evaluate_all().unwrap()), ["0,"]);
    groups
        .apply(&rows(&["a", "b"], &[Some(2), Some(5)]), false, 1)
        .unwrap();
    assert_eq!(text(&groups.evaluate_all().unwrap()), ["2,7"]);
    let touched = groups
        .apply(&rows(&["a", "b"], &[Some(2), Some(5)]), true, 2)
        .unwrap();
    assert_eq!(text(&groups.evaluate(touched.iter()).unwrap()), ["0,"]);
    assert!(
        groups.idle(100, 1).is_empty(),
        "its one group never expires"
    );
}

/// `aggregate`, with `count(v) FILTER (WHERE v > 3)` as a last aggregate
/// (`count(DISTINCT v) FILTER (...)` too, when `distinct`).
fn with_a_filtered_count(
    functions: &[(Arc<AggregateUDF>, bool)],
    distinct: bool,
) -> Arc<dyn ExecutionPlan> {
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{binary, lit};
    let plain = aggregate(functions);
    let agg = plain.downcast_ref::<AggregateExec>().unwrap();
    let s = schema();
    let mut aggs = agg.aggr_expr().to_vec();
    aggs.push(Arc::new(
        AggregateExprBuilder::new(count_udaf(), vec![col("v", &s).unwrap()])
            .schema(s.clone())
            .alias("filtered")
            .build()
            .unwrap(),
    ));
    let mut filters = agg.filter_expr().to_vec();
    let over_3 = binary(col("v", &s).unwrap(), Operator::Gt, lit(3i64), &s).unwrap();
    filters.push(Some(over_3.clone()));
    if distinct {
        aggs.push(Arc::new(
            AggregateExprBuilder::new(count_udaf(), vec![col("v", &s).unwrap()])
                .schema(s.clone())
                .alias("filtered_distinct")
                .with_distinct(true)
                .build()
                .unwrap(),
        ));
        filters.push(Some(over_3));
    }
    Arc::new(
        AggregateExec::try_new(
            AggregateMode::SinglePartitioned,
            agg.group_expr().clone(),
            aggs,
            filters,
            agg.input().clone(),
            s,
        )
        .unwrap(),
    )
}

/// The typed columns against DataFusion's own accumulators (the same plan
/// with every aggregate boxed), over random rows with NULLs, a FILTER,
/// retractions of rows added before, and checkpoints written by one and
/// read by the other.
#[test]
fn typed_columns_agree_with_datafusions_accumulators() {
    use rand::{Rng, SeedableRng};
    for updating in [false, true] {
        let mut functions: Vec<(Arc<AggregateUDF>, bool)> = vec![
            (count_udaf(), false),
            (sum_udaf(), false),
            (avg_udaf(), false),
        ];
        if !updating {
            functions.push((min_udaf(), false));
            functions.push((max_udaf(), false));
            functions.push((count_udaf(), true));
        }
        let core = with_a_filtered_count(&functions, !updating);
        let typed = AggregatePlan::of(&core, &[edge(updating)]).unwrap();
        assert!(typed.columns.iter().all(Option::is_some), "{typed:?}");
        assert!(typed.describe().contains("each a typed column"));
        assert_eq!(
            typed.families,
            usize::from(!updating),
            "one set for both distinct counts"
        );
        let mut boxed = AggregatePlan::of(&core, &[edge(updating)]).unwrap();
        boxed.columns = vec![None; boxed.columns.len()];
        let (typed, boxed) = (Arc::new(typed), Arc::new(boxed));
        let mut a = GroupAccumulators::new(typed.clone()).unwrap();
        let mut b = GroupAccumulators::new(boxed.clone()).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(37);
        let names = ["a", "b", "c", "d", "e", "f", "g"];
        let mut held: Vec<(&str, Option<i64>)> = vec![];
        for epoch in 1..=60u64 {
            let added: Vec<(&str, Option<i64>)> = (0..rng.random_range(1..40))
                .map(|_| {
                    let v = rng.random_range(-5..50);
                    (
                        names[rng.random_range(0..names.len())],
                        (v >= 0).then_some(v),
                    )
                })
                .collect();
            let batch = |these: &[(&str, Option<i64>)]| {
                let (k, v): (Vec<&str>, Vec<Option<i64>>) = these.iter().cloned().unzip();
                rows(&k, &v)
            };
            let touched = a.apply(&batch(&added), false, epoch).unwrap();
            b.apply(&batch(&added), false, epoch).unwrap();
            held.extend(added);
            let mut keys: Vec<Key> = touched;
            if updating && held.len() > 10 {
                let gone: Vec<(&str, Option<i64>)> = (0..rng.random_range(1..10))
                    .map(|_| held.swap_remove(rng.random_range(0..held.len())))
                    .collect();
                keys.extend(a.apply(&batch(&gone), true, epoch).unwrap());
                b.apply(&batch(&gone), true, epoch).unwrap();
            }
            assert_eq!(
                table(&a.evaluate(keys.iter()).unwrap()),
                table(&b.evaluate(keys.iter()).unwrap()),
                "epoch {epoch}, updating {updating}"
            );
            if epoch % 13 == 0 {
                // Each restores the other's checkpoint: the state is the same.
                let (from_a, from_b) = (a.whole().unwrap(), b.whole().unwrap());
                a = GroupAccumulators::new(typed.clone()).unwrap();
                b = GroupAccumulators::new(boxed.clone()).unwrap();
                for batch in &from_b {
                    a.restore(batch, epoch).unwrap();
                }
                for batch in &from_a {
                    b.restore(batch, epoch).unwrap();
                }
            }
        }
        assert_eq!(a.len(), b.len());
        assert_eq!(
            table(&a.evaluate_all().unwrap()),
            table(&b.evaluate_all().unwrap()),
            "updating {updating}"
        );
    }
}

/// `spilled` and `kept` agree on an epoch that touched `keys`: the rows
/// they had emitted before it, and what the keys evaluate to now.
fn same_epoch(
    spilled: &mut GroupAccumulators,
    kept: &mut GroupAccumulators,
    keys: &[Key],
    at: &str,
) {
    assert_eq!(
        table(&spilled.take_before().unwrap()),
        table(&kept.take_before().unwrap()),
        "rows before, {at}"
    );
    assert_eq!(
        table(&spilled.evaluate(keys.iter()).unwrap()),
        table(&kept.evaluate(keys.iter()).unwrap()),
        "{at}"
    );
}

/// Groups moved to local disk past a tiny memory budget against the same
/// groups kept in memory: each epoch's results and rows before, whole
/// checkpoints, and a restore from one, over typed columns and boxed
/// accumulators, rows that append and a changelog.
/// `spilled`'s whole checkpoint holds the same groups as `kept`'s (a set's
/// order in a state may differ: compare what they evaluate to); a member
/// restarted from it, reading it into memory, with a budget of one byte.
fn restarted_from_whole(
    spilled: &mut GroupAccumulators,
    kept: &mut GroupAccumulators,
    epoch: u64,
    case: &str,
) -> GroupAccumulators {
    let plan = spilled.plan().clone();
    let whole = spilled.whole().unwrap();
    let read = |batches: &[RecordBatch]| {
        let mut g = GroupAccumulators::new(plan.clone()).unwrap();
        for b in batches {
            g.restore(b, epoch).unwrap();
        }
        table(&g.evaluate_all().unwrap())
    };
    assert_eq!(read(&whole), read(&kept.whole().unwrap()), "{case}");
    let mut restarted = GroupAccumulators::new(plan.clone()).unwrap();
    restarted.keep_rows_before();
    assert!(restarted.spill_past(1, None).unwrap());
    for b in &whole {
        restarted.restore(b, epoch).unwrap();
    }
    restarted.take_before().unwrap();
    restarted
}

#[test]
fn groups_on_disk_come_back_as_they_were() {
    use rand::{Rng, SeedableRng};
    for updating in [false, true] {
        let mut functions: Vec<(Arc<AggregateUDF>, bool)> = vec![
            (count_udaf(), false),
            (sum_udaf(), false),
            (avg_udaf(), false),
            (min_udaf(), false),
        ];
        if !updating {
            functions.push((count_udaf(), true));
        }
        let core = with_a_filtered_count(&functions, !updating);
        for boxed in [false, true] {
            let mut plan = AggregatePlan::of(&core, &[edge(updating)]).unwrap();
            if boxed {
                plan.columns = vec![None; plan.columns.len()];
            }
            let plan = Arc::new(plan);
            let mut kept = GroupAccumulators::new(plan.clone()).unwrap();
            let mut spilled = GroupAccumulators::new(plan.clone()).unwrap();
            kept.keep_rows_before();
            spilled.keep_rows_before();
            assert!(spilled.spill_past(1, None).unwrap());
            let mut rng = rand::rngs::StdRng::seed_from_u64(42);
            let names: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
            let mut held: Vec<(String, Option<i64>)> = vec![];
            let mut most_on_disk = 0;
            let case = format!("updating {updating}, boxed {boxed}");
            for epoch in 1..=80u64 {
                // Mostly recent keys, now and then an old one.
                let added: Vec<(String, Option<i64>)> = (0..rng.random_range(1..30))
                    .map(|_| {
                        let k = if rng.random_bool(0.8) {
                            (epoch as usize * 3 + rng.random_range(0..5)) % names.len()
                        } else {
                            rng.random_range(0..names.len())
                        };
                        let v = rng.random_range(-5..50);
                        (names[k].clone(), (v >= 0).then_some(v))
                    })
                    .collect();
                let batch = |these: &[(String, Option<i64>)]| {
                    let k: Vec<&str> = these.iter().map(|(k, _)| k.as_str()).collect();
                    let v: Vec<Option<i64>> = these.iter().map(|(_, v)| *v).collect();
                    rows(&k, &v)
                };
                let mut keys = spilled.apply(&batch(&added), false, epoch).unwrap();
                kept.apply(&batch(&added), false, epoch).unwrap();
                held.extend(added);
                if updating && held.len() > 10 {
                    let gone: Vec<(String, Option<i64>)> = (0..rng.random_range(1..10))
                        .map(|_| held.swap_remove(rng.random_range(0..held.len())))
                        .collect();
                    keys.extend(spilled.apply(&batch(&gone), true, epoch).unwrap());
                    kept.apply(&batch(&gone), true, epoch).unwrap();
                }
                same_epoch(
                    &mut spilled,
                    &mut kept,
                    &keys,
                    &format!("epoch {epoch}, {case}"),
                );
                spilled.spill_cold(epoch).unwrap();
                most_on_disk = most_on_disk.max(spilled.spilled());
                assert_eq!(spilled.len(), kept.len(), "epoch {epoch}, {case}");
                if epoch % 25 == 0 {
                    spilled = restarted_from_whole(&mut spilled, &mut kept, epoch, &case);
                }
            }
            assert!(
                most_on_disk > 100,
                "{case}: at most {most_on_disk} groups on disk"
            );
            assert_eq!(
                table(&spilled.evaluate_all().unwrap()),
                table(&kept.evaluate_all().unwrap()),
                "{case}"
            );
            assert_eq!(
                spilled.spilled(),
                0,
                "evaluating all brings every group back"
            );
        }
    }
}

#[test]
fn distinct_values_on_disk_are_counted_once() {
    distinct_values_through_moves(None);
}

/// A write to disk that fails (with values of earlier moves there) brings
/// every value back into memory, and the counts stay exact.
#[test]
fn a_failed_write_of_distinct_values_brings_them_all_back() {
    distinct_values_through_moves(Some(30));
}

/// Runs an aggregate with distinct values on disk against one in memory;
/// at epoch `fail_at`, the move's write fails.
fn distinct_values_through_moves(fail_at: Option<u64>) {
    use rand::{Rng, SeedableRng};
    // count(DISTINCT v), count(v) FILTER (v > 3) and count(DISTINCT v)
    // FILTER (v > 3): one family of two distinct counts.
    let core = with_a_filtered_count(&[(count_udaf(), true)], true);
    let plan = Arc::new(AggregatePlan::of(&core, &[edge(false)]).unwrap());
    let mut kept = GroupAccumulators::new(plan.clone()).unwrap();
    let mut spilled = GroupAccumulators::new(plan.clone()).unwrap();
    kept.keep_rows_before();
    spilled.keep_rows_before();
    assert!(spilled.spill_past(1, None).unwrap());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut most_on_disk = 0;
    let mut went_whole = false;
    for epoch in 1..=70u64 {
        // Three groups every epoch, mostly new values and some old ones
        // (back from disk); "cold" in its first epochs and once more late,
        // after it went to disk whole with values of its own there.
        let mut added: Vec<(&str, Option<i64>)> = vec![];
        for k in ["a", "b", "c"] {
            for _ in 0..30 {
                let top = epoch as i64 * 20;
                let v = if rng.random_bool(0.8) {
                    top + rng.random_range(0..20)
                } else {
                    rng.random_range(0..top)
                };
                added.push((k, Some(v)));
            }
        }
        if epoch <= 5 || epoch == 60 {
            added.extend((0..40).map(|i| ("cold", Some(epoch as i64 * 40 + i))));
            added.push(("cold", Some(3)));
        }
        let k: Vec<&str> = added.iter().map(|(k, _)| *k).collect();
        let v: Vec<Option<i64>> = added.iter().map(|(_, v)| *v).collect();
        let keys = spilled.apply(&rows(&k, &v), false, epoch).unwrap();
        kept.apply(&rows(&k, &v), false, epoch).unwrap();
        same_epoch(&mut spilled, &mut kept, &keys, &format!("epoch {epoch}"));
        if fail_at == Some(epoch) {
            let on_disk = spilled.spilled_values();
            assert!(on_disk > 500, "{on_disk} values on disk before the failure");
            for f in &mut spilled.families {
                f.fail_writes_after = Some(1);
            }
            let held = spilled.bytes();
            spilled.spill_cold(epoch).unwrap();
            assert_eq!(spilled.spilled_values(), 0, "every value back in memory");
            assert!(
                spilled.bytes() > held,
                "{} bytes after, {held} before",
                spilled.bytes()
            );
        } else {
            spilled.spill_cold(epoch).unwrap();
        }
        if fail_at.is_some_and(|at| epoch >= at && epoch < 40) {
            assert_eq!(spilled.spilled_values(), 0, "no value moves again");
        }
        most_on_disk = most_on_disk.max(spilled.spilled_values());
        went_whole |= spilled.spilled() > 0;
        if epoch % 20 == 0 {
            spilled = restarted_from_whole(&mut spilled, &mut kept, epoch, "distinct values");
        }
    }
    assert!(
        most_on_disk > 1_000,
        "at most {most_on_disk} values on disk"
    );
    assert!(went_whole, "a group with values on disk went to disk whole");
    assert_eq!(
        table(&spilled.evaluate_all().unwrap()),
        table(&kept.evaluate_all().unwrap())
    );
}
