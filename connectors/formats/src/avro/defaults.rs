//! Field defaults of the reader schema. A table that takes its columns from
//! an Avro schema (the registry's latest) keeps each field's `default` in
//! its column's metadata ([`DEFAULT_KEY`], the default's JSON text), so the
//! columns stay the reader schema wherever the plan goes (the functions get
//! the table's schema with its metadata). By Avro's resolution rules, a
//! record whose writer schema lacks a reader field takes the reader field's
//! default: [`Fill::Default`] makes that column.
//!
//! A default is JSON of the field's type, or of a union's first branch:
//! a string for `string` and enum symbols, a number for `int`, `long`,
//! `float`, `double`, dates and timestamps (in the logical type's unit), a
//! boolean, a string of code points 0–255 for `bytes` and `fixed`, and null
//! for a union whose first branch is `null`.

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::common::ScalarValue;
use serde_json::Value;

use crate::conform::{Conversion, apply, nulls};
use skein_clients::error::{ConnectorError, Result};

/// The column metadata key of a field's Avro default (JSON text).
pub const DEFAULT_KEY: &str = "skein.avro.default";

/// How one column of the table is made from a decoded batch.
#[derive(Debug, Clone)]
pub(crate) enum Fill {
    /// The decoded field at this position, converted.
    Read(usize, Conversion),
    /// The writer lacks the field and the column has a default: every row
    /// takes it.
    Default(ScalarValue),
    /// The writer lacks the field: null (the column is nullable).
    Null,
}

impl Fill {
    /// The column for a writer schema that lacks `column`'s field: its
    /// default if it has one, else null if it may be, else why not.
    pub(crate) fn missing(column: &Field) -> std::result::Result<Fill, String> {
        match column.metadata().get(DEFAULT_KEY) {
            Some(text) => {
                let json: Value = serde_json::from_str(text).map_err(|e| {
                    format!(
                        "column {}: its default {text:?} is not JSON: {e}",
                        column.name()
                    )
                })?;
                default_value(&json, column)
                    .map(Fill::Default)
                    .map_err(|why| format!("column {}: {why}", column.name()))
            }
            None if column.is_nullable() => Ok(Fill::Null),
            None => Err(format!(
                "column {} is NOT NULL and the writer schema has no such field",
                column.name()
            )),
        }
    }

    /// The column `field` of `rows` rows; `decoded(k)` is the decoded
    /// field at position `k`.
    pub(crate) fn column<'a>(
        &self,
        field: &Field,
        rows: usize,
        decoded: impl Fn(usize) -> &'a ArrayRef,
    ) -> Result<ArrayRef> {
        Ok(match self {
            Fill::Read(k, conversion) => apply(conversion, decoded(*k))?,
            Fill::Null => nulls(field, rows),
            // Of the column's type: checked by `default_value`.
            Fill::Default(value) => value.to_array_of_size(rows).map_err(|e| {
                ConnectorError::Decode(format!("column {}: its default: {e}", field.name()))
            })?,
        })
    }
}

/// `default` (the JSON of an Avro field default) as a value of `column`.
pub(crate) fn default_value(
    default: &Value,
    column: &Field,
) -> std::result::Result<ScalarValue, String> {
    use DataType::*;
    let t = column.data_type();
    if default.is_null() {
        if !column.is_nullable() {
            return Err("its default is null and the column is NOT NULL".into());
        }
        return ScalarValue::try_from(t).map_err(|e| format!("a null of {t}: {e}"));
    }
    let value = match t {
        Boolean => default.as_bool().map(|b| ScalarValue::Boolean(Some(b))),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => {
            default.as_i64().map(|n| ScalarValue::Int64(Some(n)))
        }
        Float32 | Float64 => float(default).map(|x| ScalarValue::Float64(Some(x))),
        Utf8 | LargeUtf8 | Utf8View => default.as_str().map(|s| ScalarValue::Utf8(Some(s.into()))),
        Dictionary(_, v) if matches!(**v, Utf8 | LargeUtf8 | Utf8View) => {
            default.as_str().map(|s| ScalarValue::Utf8(Some(s.into())))
        }
        Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => default
            .as_str()
            .and_then(code_points)
            .map(|b| ScalarValue::Binary(Some(b))),
        Date32 => default
            .as_i64()
            .and_then(|d| i32::try_from(d).ok())
            .map(|d| ScalarValue::Date32(Some(d))),
        Timestamp(unit, zone) => default.as_i64().map(|n| {
            let (n, zone) = (Some(n), zone.clone());
            match unit {
                TimeUnit::Second => ScalarValue::TimestampSecond(n, zone),
                TimeUnit::Millisecond => ScalarValue::TimestampMillisecond(n, zone),
                TimeUnit::Microsecond => ScalarValue::TimestampMicrosecond(n, zone),
                TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(n, zone),
            }
        }),
        other => return Err(format!("a default for a {other} column is not supported")),
    };
    let value = value.ok_or_else(|| format!("its default {default} is not a {t} value"))?;
    // Of the column's type exactly, so its rows need no conversion.
    if value.data_type() != *t {
        value
            .cast_to(t)
            .map_err(|e| format!("its default {default} does not fit the column's {t}: {e}"))
    } else {
        Ok(value)
    }
}

/// A float default: a JSON number, or the names Avro's JSON encoding
/// gives the values JSON has no number for.
fn float(v: &Value) -> Option<f64> {
    match v.as_str() {
        Some("NaN") => Some(f64::NAN),
        Some("Infinity") => Some(f64::INFINITY),
        Some("-Infinity") => Some(f64::NEG_INFINITY),
        Some(_) => None,
        None => v.as_f64(),
    }
}

/// The bytes of a `bytes` or `fixed` default: a string whose characters
/// are the byte values (U+0000 to U+00FF).
fn code_points(s: &str) -> Option<Vec<u8>> {
    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

/// Whether an Avro field type is a `string` with the `uuid` logical type
/// (or a union whose first branch is, the branch a default is of).
pub(crate) fn is_string_uuid(t: &Value) -> bool {
    let t = match t {
        Value::Array(branches) => branches.first().unwrap_or(&Value::Null),
        t => t,
    };
    t.get("type").and_then(Value::as_str) == Some("string")
        && t.get("logicalType").and_then(Value::as_str) == Some("uuid")
}

/// The default of a `uuid` field (its text, `8-4-4-4-12` hex digits) in
/// the form of a `bytes` default, since the column holds the 16 bytes.
pub(crate) fn uuid_default(default: &Value) -> Option<Value> {
    let text = default.as_str()?;
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || text.len() != 36 {
        return None;
    }
    let bytes = (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(Value::String(bytes.into_iter().map(char::from).collect()))
}

#[cfg(test)]
#[path = "defaults_tests.rs"]
mod tests;
