//! Scalar functions of ours beyond DataFusion's own, registered in every
//! session (planning and every function's plan decoding): `count_char`,
//! the UDF NEXMark q14 is defined with.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Int64Array, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, Result as DfResult, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};

/// `count_char(text, c)`: how many times the character `c` occurs in `text`
/// (null where `text` is null).
pub fn count_char_udf() -> ScalarUDF {
    ScalarUDF::from(CountChar {
        signature: Signature::new(
            TypeSignature::Exact(vec![DataType::Utf8, DataType::Utf8]),
            Volatility::Immutable,
        ),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CountChar {
    signature: Signature,
}

impl ScalarUDFImpl for CountChar {
    fn name(&self) -> &str {
        "count_char"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Int64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let needle = match &args.args[1] {
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(s))) if s.chars().count() == 1 => {
                s.chars().next().expect("one character")
            }
            other => {
                return Err(DataFusionError::Plan(format!(
                    "count_char: the second argument must be one character as a literal, not {other:?}"
                )));
            }
        };
        let text = args.args[0].clone().into_array(args.number_rows)?;
        let text = cast(&text, &DataType::Utf8)?;
        let text = text
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("cast to Utf8");
        let counts: Int64Array = text
            .iter()
            .map(|t| t.map(|t| t.chars().filter(|c| *c == needle).count() as i64))
            .collect();
        Ok(ColumnarValue::Array(Arc::new(counts) as ArrayRef))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn count_char_counts_one_character() {
        let ctx = SessionContext::new();
        ctx.register_udf(count_char_udf());
        let batches = ctx
            .sql("SELECT count_char('acbcc', 'c') AS n, count_char(NULL, 'c') AS m")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let n = batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(n.value(0), 3);
        assert!(batches[0].column(1).is_null(0));
    }
}
