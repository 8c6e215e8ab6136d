//! Decoded columns into the table's column types. A decoder yields the
//! types of the writer's schema (an Avro `int`, a `timestamp-millis` in
//! UTC, an enum); the table declares its own. Only conversions that lose
//! nothing are allowed (Avro's promotions, string kinds, timestamps), and
//! they are chosen once per writer schema, so a record never fails on one.

use datafusion::arrow::array::{ArrayRef, new_null_array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

use skein_clients::error::Result;

/// How one decoded column becomes the table's.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Conversion {
    /// Already the column's type.
    Same,
    /// An Arrow cast that cannot fail (a promotion, a string kind, a
    /// timestamp unit or zone, an enum's symbols).
    Cast(DataType),
    /// An integer of milliseconds since the epoch into a timestamp, as
    /// Skein's JSON decoder reads one.
    Millis(DataType),
}

/// The conversion of a decoded `from` into a column `to`, or why there is none.
pub(crate) fn conversion(
    from: &DataType,
    to: &DataType,
) -> std::result::Result<Conversion, String> {
    use DataType::*;
    if from == to {
        return Ok(Conversion::Same);
    }
    let ok = match (from, to) {
        (Int8 | Int16 | Int32, Int16 | Int32 | Int64) => integer_width(from) <= integer_width(to),
        (UInt8 | UInt16, Int32 | Int64) | (UInt32, Int64) => true,
        (Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32, Float64) => true,
        (Int8 | Int16 | Int32, Float32) | (Float32, Float64) => true,
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => true,
        (Binary | LargeBinary | BinaryView, Binary | LargeBinary | BinaryView) => true,
        // Avro's `fixed` and `uuid`, which a table without columns declares
        // as `BYTEA`.
        (FixedSizeBinary(_), Binary | LargeBinary | BinaryView) => true,
        (Dictionary(_, v), Utf8 | LargeUtf8 | Utf8View) => {
            matches!(**v, Utf8 | LargeUtf8 | Utf8View)
        }
        (Timestamp(..), Timestamp(_, None)) => true,
        (Date32, Timestamp(_, None)) => true,
        (Int32 | Int64, Timestamp(_, None)) => return Ok(Conversion::Millis(to.clone())),
        _ => false,
    };
    if ok {
        Ok(Conversion::Cast(to.clone()))
    } else {
        Err(format!("its {from} does not convert to the column's {to}"))
    }
}

fn integer_width(t: &DataType) -> u8 {
    match t {
        DataType::Int8 => 8,
        DataType::Int16 => 16,
        DataType::Int32 => 32,
        _ => 64,
    }
}

/// `array` as its column's type.
pub(crate) fn apply(conversion: &Conversion, array: &ArrayRef) -> Result<ArrayRef> {
    Ok(match conversion {
        Conversion::Same => array.clone(),
        Conversion::Cast(to) => cast(array, to)?,
        Conversion::Millis(to) => {
            let ms = cast(array, &DataType::Int64)?;
            let ms = cast(&ms, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
            cast(&ms, to)?
        }
    })
}

/// A column that the writer does not have: all null.
pub(crate) fn nulls(field: &Field, rows: usize) -> ArrayRef {
    new_null_array(field.data_type(), rows)
}

/// The table column types a decoded type is declared as when a table
/// takes its columns from the writer's schema.
pub(crate) fn declared_type(from: &DataType) -> std::result::Result<DataType, String> {
    use DataType::*;
    Ok(match from {
        Boolean | Int32 | Int64 | Float64 | Utf8 | Binary | Date32 => from.clone(),
        Int8 | Int16 => Int32,
        UInt8 | UInt16 => Int32,
        UInt32 => Int64,
        Float32 => Float64,
        LargeUtf8 | Utf8View => Utf8,
        LargeBinary | BinaryView | FixedSizeBinary(_) => Binary,
        Dictionary(_, v) if matches!(**v, Utf8 | LargeUtf8 | Utf8View) => Utf8,
        Timestamp(unit, _) => Timestamp(*unit, None),
        other => {
            return Err(format!(
                "{other} has no column type here; declare the columns the table reads"
            ));
        }
    })
}

/// A table schema from the decoded fields of a writer's schema.
pub(crate) fn declared_schema(fields: &[Field]) -> std::result::Result<Schema, String> {
    fields
        .iter()
        .map(|f| {
            declared_type(f.data_type())
                .map(|t| Field::new(f.name(), t, f.is_nullable()))
                .map_err(|why| format!("field {:?}: {why}", f.name()))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map(Schema::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, Int32Array, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::TimestampNanosecondType;
    use std::sync::Arc;

    #[test]
    fn promotions_and_timestamps_convert_and_narrowing_does_not() {
        use DataType::*;
        let ns = Timestamp(TimeUnit::Nanosecond, None);
        assert_eq!(conversion(&Int32, &Int64), Ok(Conversion::Cast(Int64)));
        assert_eq!(conversion(&Int64, &ns), Ok(Conversion::Millis(ns.clone())));
        assert!(conversion(&Int64, &Int32).unwrap_err().contains("Int64"));
        assert!(conversion(&Utf8, &Int64).is_err());
        let utc = Timestamp(TimeUnit::Millisecond, Some("+00:00".into()));
        let a: ArrayRef =
            Arc::new(TimestampMillisecondArray::from(vec![1_500]).with_timezone("+00:00"));
        let c = conversion(&utc, &ns).unwrap();
        let out = apply(&c, &a).unwrap();
        assert_eq!(
            out.as_primitive::<TimestampNanosecondType>().value(0),
            1_500_000_000
        );
        let ms: ArrayRef = Arc::new(Int32Array::from(vec![2]));
        let out = apply(&Conversion::Millis(ns), &ms).unwrap();
        assert_eq!(
            out.as_primitive::<TimestampNanosecondType>().value(0),
            2_000_000
        );
    }
}
