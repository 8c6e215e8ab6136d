//! `--verify`: run the same query over the same input with plain
//! single-process DataFusion and compare the rows.

use datafusion::arrow::array::{Array, Float32Array, Float64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::prelude::SessionContext;

use crate::error::Result;
use crate::planner::QueryPlan;

pub mod tap;

/// The query's result computed in one process, in one go: over the rows
/// the run's sources read, if they were tapped ([`tap::start`]), else over
/// one pull of each source.
pub async fn single_process(ctx: &SessionContext, plan: &QueryPlan) -> Result<Vec<RecordBatch>> {
    let logical = match tap::take(&plan.query_code) {
        Some(read) => tap::over_read_rows(&plan.logical, read)?,
        None => plan.logical.clone(),
    };
    Ok(ctx.execute_logical_plan(logical).await?.collect().await?)
}

/// How a run's results compare with a reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    /// Whether they hold the same rows.
    pub equal: bool,
    /// Rows of the reference.
    pub expected_rows: usize,
    /// Rows of the run.
    pub got_rows: usize,
    /// The first differing rows, described.
    pub differences: Vec<String>,
}

/// Rows as text, floats rounded so that summation order does not matter.
pub fn rows_as_text(batches: &[RecordBatch]) -> Result<Vec<String>> {
    let opts = FormatOptions::default().with_null("NULL");
    let mut rows = vec![];
    for b in batches {
        let formatters = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for i in 0..b.num_rows() {
            let cells: Vec<String> = b
                .columns()
                .iter()
                .zip(&formatters)
                .map(|(c, f)| cell(c.as_ref(), f, i))
                .collect();
            rows.push(cells.join(" | "));
        }
    }
    Ok(rows)
}

fn cell(col: &dyn Array, f: &ArrayFormatter, i: usize) -> String {
    if col.is_null(i) {
        return "NULL".into();
    }
    match col.data_type() {
        DataType::Float64 => round(
            col.as_any()
                .downcast_ref::<Float64Array>()
                .expect("f64")
                .value(i),
        ),
        DataType::Float32 => round(
            col.as_any()
                .downcast_ref::<Float32Array>()
                .expect("f32")
                .value(i) as f64,
        ),
        _ => f.value(i).to_string(),
    }
}

fn round(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else {
        format!("{v:.9e}")
    }
}

/// Compare results; order-insensitive unless `ordered`.
pub fn compare(expected: &[RecordBatch], got: &[RecordBatch], ordered: bool) -> Result<Comparison> {
    let mut e = rows_as_text(expected)?;
    let mut g = rows_as_text(got)?;
    if !ordered {
        e.sort();
        g.sort();
    }
    let mut differences = vec![];
    let n = e.len().max(g.len());
    for i in 0..n {
        let (a, b) = (e.get(i), g.get(i));
        if a != b {
            differences.push(format!(
                "row {i}: expected {} got {}",
                a.map_or("<none>", String::as_str),
                b.map_or("<none>", String::as_str)
            ));
            if differences.len() >= 5 {
                break;
            }
        }
    }
    Ok(Comparison {
        equal: differences.is_empty(),
        expected_rows: e.len(),
        got_rows: g.len(),
        differences,
    })
}
