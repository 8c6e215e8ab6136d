//! Event-time windows in SQL.
//!
//! * `tumble(ts, INTERVAL '10' SECOND)` is the start of the tumbling window
//!   that holds `ts`; group by it.
//! * `hop(ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)` (slide, then size)
//!   is the list of starts of every sliding window that holds `ts`; unnest
//!   it, e.g. `SELECT unnest(hop(...)) AS window_start, ...`, and group by it.
//!
//! Both results are `Timestamp(ms)` fields whose metadata records the window
//! size. Some operators (`unnest`) drop field metadata; name such a column
//! `window_start` and the planner finds it by name. The planner finds that metadata in the schema of an exchange, which
//! tells a stateful stage which column says what window a row belongs to and
//! when the watermark has closed it.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Int64Array, ListBuilder, TimestampMillisecondArray,
    TimestampMillisecondBuilder,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema, TimeUnit};
use datafusion::common::{DataFusionError, Result as DfResult, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

/// Field metadata key: the window size in milliseconds.
pub const WINDOW_SIZE_KEY: &str = "skein.window.size_ms";

/// The column name that marks a window start where metadata is lost.
pub const WINDOW_START: &str = "window_start";

/// Milliseconds of a constant interval, if it is one.
pub fn literal_interval_ms(v: &ScalarValue) -> Option<i64> {
    interval_ms(Some(v), "window").ok()
}

/// Where the window of each row is, and how long windows are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WindowColumn {
    /// The column's index.
    pub index: usize,
    /// The window size, in ms.
    pub size_ms: i64,
}

/// The first column of `schema` that carries window metadata.
pub fn find_window_column(schema: &Schema) -> Option<WindowColumn> {
    schema.fields().iter().enumerate().find_map(|(index, f)| {
        let size_ms = f.metadata().get(WINDOW_SIZE_KEY)?.parse().ok()?;
        Some(WindowColumn { index, size_ms })
    })
}

fn interval_ms(v: Option<&ScalarValue>, what: &str) -> DfResult<i64> {
    let ms = match v {
        Some(ScalarValue::IntervalMonthDayNano(Some(i))) => {
            if i.months != 0 {
                return plan_err!("{what}: month intervals have no fixed length");
            }
            i64::from(i.days) * 86_400_000 + i.nanoseconds / 1_000_000
        }
        Some(ScalarValue::IntervalDayTime(Some(i))) => {
            i64::from(i.days) * 86_400_000 + i64::from(i.milliseconds)
        }
        Some(ScalarValue::Int64(Some(ms))) => *ms,
        Some(other) => return plan_err!("{what} must be a constant INTERVAL, got {other:?}"),
        None => return plan_err!("{what} must be a constant INTERVAL"),
    };
    if ms <= 0 {
        return plan_err!("{what} must be positive, got {ms} ms");
    }
    Ok(ms)
}

fn timestamps_ms(arg: &ColumnarValue, rows: usize) -> DfResult<TimestampMillisecondArray> {
    let array = arg.to_array(rows)?;
    let as_ms = match array.data_type() {
        DataType::Int64 => cast(&array, &DataType::Timestamp(TimeUnit::Millisecond, None))?,
        DataType::Timestamp(_, _) => {
            cast(&array, &DataType::Timestamp(TimeUnit::Millisecond, None))?
        }
        other => {
            return exec_err!("window time column must be a timestamp or epoch ms, got {other}");
        }
    };
    Ok(as_ms
        .as_any()
        .downcast_ref::<TimestampMillisecondArray>()
        .ok_or_else(|| DataFusionError::Internal("cast to ms timestamps".into()))?
        .clone())
}

fn scalar_arg(args: &ScalarFunctionArgs, i: usize) -> Option<ScalarValue> {
    match &args.args[i] {
        ColumnarValue::Scalar(s) => Some(s.clone()),
        ColumnarValue::Array(_) => None,
    }
}

fn window_field(name: &str, size_ms: i64) -> Field {
    Field::new(name, DataType::Timestamp(TimeUnit::Millisecond, None), true)
        .with_metadata([(WINDOW_SIZE_KEY.to_string(), size_ms.to_string())].into())
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Tumble {
    signature: Signature,
}

impl ScalarUDFImpl for Tumble {
    fn name(&self) -> &str {
        "tumble"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Timestamp(TimeUnit::Millisecond, None))
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        let size = interval_ms(
            args.scalar_arguments.get(1).copied().flatten(),
            "tumble size",
        )?;
        Ok(Arc::new(window_field(self.name(), size)))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let size = interval_ms(scalar_arg(&args, 1).as_ref(), "tumble size")?;
        let ts = timestamps_ms(&args.args[0], args.number_rows)?;
        let starts: TimestampMillisecondArray = ts.unary_opt(|t| Some(t - t.rem_euclid(size)));
        Ok(ColumnarValue::Array(Arc::new(starts) as ArrayRef))
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Hop {
    signature: Signature,
}

impl ScalarUDFImpl for Hop {
    fn name(&self) -> &str {
        "hop"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::List(Arc::new(Field::new_list_field(
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        ))))
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        let slide = interval_ms(args.scalar_arguments.get(1).copied().flatten(), "hop slide")?;
        let size = interval_ms(args.scalar_arguments.get(2).copied().flatten(), "hop size")?;
        check_hop(slide, size)?;
        let item = window_field("item", size);
        Ok(Arc::new(Field::new(
            self.name(),
            DataType::List(Arc::new(item)),
            true,
        )))
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let slide = interval_ms(scalar_arg(&args, 1).as_ref(), "hop slide")?;
        let size = interval_ms(scalar_arg(&args, 2).as_ref(), "hop size")?;
        check_hop(slide, size)?;
        let ts = timestamps_ms(&args.args[0], args.number_rows)?;
        let item = match args.return_field.data_type() {
            DataType::List(f) => f.clone(),
            _ => Arc::new(window_field("item", size)),
        };
        let mut out = ListBuilder::new(TimestampMillisecondBuilder::new()).with_field(item);
        for t in ts.iter() {
            match t {
                None => out.append_null(),
                Some(t) => {
                    // The latest window holding t starts at the slide boundary at or
                    // before t; earlier ones start a slide apart while still covering t.
                    let last = t - t.rem_euclid(slide);
                    let mut start = last - size + slide;
                    while start <= last {
                        out.values().append_value(start);
                        start += slide;
                    }
                    out.append(true);
                }
            }
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

/// The most windows one row may fall in with `hop`: each is a row of the
/// unnested output, so a 1 ms slide over a 30-day window would turn every
/// input row into billions.
pub const MAX_HOP_WINDOWS_PER_ROW: i64 = 1000;

fn check_hop(slide: i64, size: i64) -> DfResult<()> {
    if size % slide != 0 {
        return plan_err!("hop size ({size} ms) must be a multiple of its slide ({slide} ms)");
    }
    if size / slide > MAX_HOP_WINDOWS_PER_ROW {
        return plan_err!(
            "hop size ({size} ms) over slide ({slide} ms) puts each row in {} windows; \
             at most {MAX_HOP_WINDOWS_PER_ROW} are allowed (use a longer slide)",
            size / slide
        );
    }
    Ok(())
}

/// The `tumble(ts, size)` function.
pub fn tumble_udf() -> ScalarUDF {
    ScalarUDF::from(Tumble {
        signature: Signature::any(2, Volatility::Immutable),
    })
}

/// The `hop(ts, slide, size)` function.
pub fn hop_udf() -> ScalarUDF {
    ScalarUDF::from(Hop {
        signature: Signature::any(3, Volatility::Immutable),
    })
}

/// Ends of the windows of the rows: start + size.
pub fn window_ends(starts: &dyn Array, size_ms: i64) -> DfResult<Int64Array> {
    let ms = cast(starts, &DataType::Int64)?;
    let ms = ms
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| DataFusionError::Internal("window starts".into()))?;
    Ok(ms.unary(|s| s + size_ms))
}

/// Field metadata key on a session start column.
pub const SESSION_KEY: &str = "skein.window.session";

/// How a stateful stage tells when a session is over: the rows of one key
/// (the `keys` columns) form sessions over the `time` column; a key's
/// sessions are closed once the watermark is `gap_ms` past its last row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionSpec {
    /// The key columns.
    pub keys: Vec<usize>,
    /// The time column.
    pub time: usize,
    /// The session gap, in ms.
    pub gap_ms: i64,
}

/// Whether a schema has a session start column (from `session(...) OVER`).
pub fn has_session_column(schema: &Schema) -> bool {
    schema
        .fields()
        .iter()
        .any(|f| f.metadata().contains_key(SESSION_KEY))
}

/// `session(ts, INTERVAL '10' SECOND) OVER (PARTITION BY key ORDER BY ts)`:
/// the start of the session each row belongs to, where a session ends when
/// the key is quiet for longer than the gap.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Session {
    signature: Signature,
}

#[derive(Debug)]
struct SessionEvaluator {
    gap_ms: i64,
}

impl datafusion::logical_expr::PartitionEvaluator for SessionEvaluator {
    fn evaluate_all(&mut self, values: &[ArrayRef], num_rows: usize) -> DfResult<ArrayRef> {
        let ts = timestamps_ms(&ColumnarValue::Array(values[0].clone()), num_rows)?;
        let mut out = TimestampMillisecondBuilder::with_capacity(num_rows);
        let mut start: Option<i64> = None;
        let mut prev: Option<i64> = None;
        for t in ts.iter() {
            match t {
                None => out.append_null(),
                Some(t) => {
                    if prev.is_none_or(|p| t - p > self.gap_ms) {
                        start = Some(t);
                    }
                    prev = Some(t);
                    out.append_option(start);
                }
            }
        }
        Ok(Arc::new(out.finish()))
    }
}

impl datafusion::logical_expr::WindowUDFImpl for Session {
    fn name(&self) -> &str {
        "session"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn partition_evaluator(
        &self,
        args: datafusion::logical_expr::function::PartitionEvaluatorArgs,
    ) -> DfResult<Box<dyn datafusion::logical_expr::PartitionEvaluator>> {
        let gap = args
            .input_exprs()
            .get(1)
            .and_then(|e| e.downcast_ref::<datafusion::physical_expr::expressions::Literal>())
            .map(|l| l.value().clone());
        let gap_ms = interval_ms(gap.as_ref(), "session gap")?;
        Ok(Box::new(SessionEvaluator { gap_ms }))
    }
    fn field(
        &self,
        args: datafusion::logical_expr::function::WindowUDFFieldArgs,
    ) -> DfResult<FieldRef> {
        Ok(Arc::new(
            Field::new(
                args.name(),
                DataType::Timestamp(TimeUnit::Millisecond, None),
                true,
            )
            .with_metadata([(SESSION_KEY.to_string(), "1".to_string())].into()),
        ))
    }
}

/// The `session(ts, gap)` window function.
pub fn session_udwf() -> datafusion::logical_expr::WindowUDF {
    datafusion::logical_expr::WindowUDF::from(Session {
        signature: Signature::any(2, Volatility::Immutable),
    })
}

/// The session gap of a physical `session(...)` window expression's arguments.
pub fn session_gap_ms(args: &[Arc<dyn datafusion::physical_expr::PhysicalExpr>]) -> Option<i64> {
    let lit = args
        .get(1)?
        .downcast_ref::<datafusion::physical_expr::expressions::Literal>()?;
    interval_ms(Some(lit.value()), "session gap").ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_refuses_more_windows_per_row_than_the_cap() {
        assert!(check_hop(1_000, 1_000_000).is_ok());
        let err = check_hop(1, 30 * 86_400_000).unwrap_err().to_string();
        assert!(err.contains("2592000000 windows; at most 1000"), "{err}");
        assert!(
            check_hop(3, 10)
                .unwrap_err()
                .to_string()
                .contains("multiple")
        );
    }
}
