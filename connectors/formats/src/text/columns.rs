//! Values checked against their column types, and the Arrow columns they
//! are appended to.

use std::borrow::Cow;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder, StringViewBuilder, TimestampMicrosecondBuilder, TimestampMillisecondBuilder,
    TimestampNanosecondBuilder, TimestampSecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Schema, TimeUnit};

use super::scanned::{Raw, Scanned, TextFormat};

/// A value checked against its column type, ready to append.
#[derive(Debug)]
pub(crate) enum Typed {
    Null,
    /// `record[start..end]`, checked to be UTF-8.
    Str {
        start: u32,
        end: u32,
    },
    /// A string whose escapes were resolved.
    Owned(String),
    Bytes {
        start: u32,
        end: u32,
    },
    I64(i64),
    F64(f64),
    Bool(bool),
}

fn span(record: &[u8], start: u32, end: u32) -> &[u8] {
    &record[start as usize..end as usize]
}

pub(crate) fn typed_value(
    data_type: &DataType,
    raw: Raw,
    format: TextFormat,
    record: &[u8],
    scanned: Scanned,
) -> std::result::Result<Typed, String> {
    // A JSON string is a number only for a timestamp (YSB, for one, writes
    // its event times as strings of ms); a number column wants a number.
    if format == TextFormat::Json
        && matches!(raw, Raw::Str { .. })
        && matches!(
            data_type,
            DataType::Int32 | DataType::Int64 | DataType::Float64
        )
    {
        return Err("expected a number, got a string".into());
    }
    let text = |raw: Raw| -> std::result::Result<Cow<'_, str>, String> {
        match raw {
            Raw::Str {
                start,
                end,
                escaped,
            } => unescape(span(record, start, end), escaped),
            Raw::Num { start, end } => std::str::from_utf8(span(record, start, end))
                .map(Cow::Borrowed)
                .map_err(|e| e.to_string()),
            Raw::Bool(b) => Ok(Cow::Borrowed(if b { "true" } else { "false" })),
            Raw::Null => Ok(Cow::Borrowed("")),
            Raw::Nested { .. } => Err("expected a scalar, got an object or array".into()),
        }
    };
    Ok(match data_type {
        DataType::Binary => match raw {
            Raw::Str { start, end, .. } => Typed::Bytes { start, end },
            _ => return Err("expected bytes".into()),
        },
        DataType::Utf8 | DataType::Utf8View => match raw {
            Raw::Str {
                start,
                end,
                escaped: false,
            } => {
                if !scanned.utf8 {
                    std::str::from_utf8(span(record, start, end))
                        .map_err(|e| format!("invalid UTF-8: {e}"))?;
                }
                Typed::Str { start, end }
            }
            Raw::Str { .. } => Typed::Owned(text(raw)?.into_owned()),
            // CSV fields are all text; JSON must match.
            Raw::Num { start, end } if format != TextFormat::Json => {
                text(raw)?;
                Typed::Str { start, end }
            }
            Raw::Bool(_) if format != TextFormat::Json => Typed::Owned(text(raw)?.into_owned()),
            _ => return Err("expected a string".into()),
        },
        DataType::Int32 | DataType::Int64 | DataType::Timestamp(_, None) => {
            let n = match raw {
                Raw::Str {
                    start,
                    end,
                    escaped: false,
                }
                | Raw::Num { start, end } => plain_integer(span(record, start, end)),
                _ => None,
            };
            let n: i64 = match n {
                Some(n) => n,
                None => {
                    let t = text(raw)?;
                    t.trim()
                        .parse()
                        .map_err(|_| format!("expected an integer, got {:?}", truncate(&t)))?
                }
            };
            match data_type {
                DataType::Int32 if i32::try_from(n).is_err() => {
                    return Err(format!("{n} does not fit a 32-bit integer"));
                }
                // Integers for timestamps are milliseconds since the epoch.
                DataType::Timestamp(unit, _) => Typed::I64(
                    match unit {
                        TimeUnit::Second => Some(n / 1000),
                        TimeUnit::Millisecond => Some(n),
                        TimeUnit::Microsecond => n.checked_mul(1000),
                        TimeUnit::Nanosecond => n.checked_mul(1_000_000),
                    }
                    .ok_or_else(|| format!("timestamp {n} ms is out of range"))?,
                ),
                _ => Typed::I64(n),
            }
        }
        DataType::Float64 => {
            let t = text(raw)?;
            Typed::F64(
                t.trim()
                    .parse()
                    .map_err(|_| format!("expected a number, got {:?}", truncate(&t)))?,
            )
        }
        DataType::Boolean => match raw {
            Raw::Bool(b) => Typed::Bool(b),
            _ => match text(raw)?.trim() {
                "true" => Typed::Bool(true),
                "false" => Typed::Bool(false),
                other => return Err(format!("expected a boolean, got {:?}", truncate(other))),
            },
        },
        other => return Err(format!("unsupported type {other}")),
    })
}

/// `-?[0-9]{1,18}` as an integer (it cannot overflow); anything else is
/// left to `str::parse` and its error.
fn plain_integer(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut n: i64 = 0;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n * 10 + d as i64;
    }
    Some(if negative { -n } else { n })
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn unescape(bytes: &[u8], escaped: bool) -> std::result::Result<Cow<'_, str>, String> {
    if !escaped {
        return std::str::from_utf8(bytes)
            .map(Cow::Borrowed)
            .map_err(|e| format!("invalid UTF-8: {e}"));
    }
    // Rare path: let serde_json resolve the escapes of the quoted string.
    let mut quoted = Vec::with_capacity(bytes.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(bytes);
    quoted.push(b'"');
    serde_json::from_slice::<String>(&quoted)
        .map(Cow::Owned)
        .map_err(|e| format!("bad string escape: {e}"))
}

pub(crate) enum ColumnBuilder {
    Utf8(StringBuilder),
    Utf8View(StringViewBuilder),
    Binary(BinaryBuilder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    Float64(Float64Builder),
    Boolean(BooleanBuilder),
    TsS(TimestampSecondBuilder),
    TsMs(TimestampMillisecondBuilder),
    TsUs(TimestampMicrosecondBuilder),
    TsNs(TimestampNanosecondBuilder),
}

impl ColumnBuilder {
    /// A builder per column of `schema`, each with room for `rows`.
    pub(crate) fn for_schema(schema: &Schema, rows: usize) -> Vec<Self> {
        schema
            .fields()
            .iter()
            .map(|f| ColumnBuilder::new(f.data_type(), rows))
            .collect()
    }

    pub(crate) fn new(data_type: &DataType, rows: usize) -> Self {
        match data_type {
            DataType::Utf8 => ColumnBuilder::Utf8(StringBuilder::with_capacity(rows, rows * 16)),
            DataType::Utf8View => ColumnBuilder::Utf8View(StringViewBuilder::with_capacity(rows)),
            DataType::Binary => {
                ColumnBuilder::Binary(BinaryBuilder::with_capacity(rows, rows * 64))
            }
            DataType::Int32 => ColumnBuilder::Int32(Int32Builder::with_capacity(rows)),
            DataType::Int64 => ColumnBuilder::Int64(Int64Builder::with_capacity(rows)),
            DataType::Float64 => ColumnBuilder::Float64(Float64Builder::with_capacity(rows)),
            DataType::Boolean => ColumnBuilder::Boolean(BooleanBuilder::with_capacity(rows)),
            DataType::Timestamp(TimeUnit::Second, _) => {
                ColumnBuilder::TsS(TimestampSecondBuilder::with_capacity(rows))
            }
            DataType::Timestamp(TimeUnit::Millisecond, _) => {
                ColumnBuilder::TsMs(TimestampMillisecondBuilder::with_capacity(rows))
            }
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                ColumnBuilder::TsUs(TimestampMicrosecondBuilder::with_capacity(rows))
            }
            DataType::Timestamp(TimeUnit::Nanosecond, _) => {
                ColumnBuilder::TsNs(TimestampNanosecondBuilder::with_capacity(rows))
            }
            other => unreachable!("checked in RecordDecoder::new: {other}"),
        }
    }

    pub(crate) fn append(&mut self, v: Typed, record: &[u8]) {
        let text = |start: u32, end: u32| {
            let bytes = span(record, start, end);
            // SAFETY: `typed_value` made a `Typed::Str` only of bytes that
            // are UTF-8 (checked, or the record is all ASCII).
            unsafe { std::str::from_utf8_unchecked(bytes) }
        };
        match (self, v) {
            (ColumnBuilder::Utf8(b), Typed::Str { start, end }) => b.append_value(text(start, end)),
            (ColumnBuilder::Utf8(b), Typed::Owned(s)) => b.append_value(s),
            (ColumnBuilder::Utf8(b), _) => b.append_null(),
            (ColumnBuilder::Utf8View(b), Typed::Str { start, end }) => {
                b.append_value(text(start, end))
            }
            (ColumnBuilder::Utf8View(b), Typed::Owned(s)) => b.append_value(s),
            (ColumnBuilder::Utf8View(b), _) => b.append_null(),
            (ColumnBuilder::Binary(b), Typed::Bytes { start, end }) => {
                b.append_value(span(record, start, end))
            }
            (ColumnBuilder::Binary(b), _) => b.append_null(),
            (ColumnBuilder::Int32(b), Typed::I64(n)) => b.append_value(n as i32),
            (ColumnBuilder::Int32(b), _) => b.append_null(),
            (ColumnBuilder::Int64(b), Typed::I64(n)) => b.append_value(n),
            (ColumnBuilder::Int64(b), _) => b.append_null(),
            (ColumnBuilder::Float64(b), Typed::F64(n)) => b.append_value(n),
            (ColumnBuilder::Float64(b), _) => b.append_null(),
            (ColumnBuilder::Boolean(b), Typed::Bool(n)) => b.append_value(n),
            (ColumnBuilder::Boolean(b), _) => b.append_null(),
            (ColumnBuilder::TsS(b), Typed::I64(n)) => b.append_value(n),
            (ColumnBuilder::TsS(b), _) => b.append_null(),
            (ColumnBuilder::TsMs(b), Typed::I64(n)) => b.append_value(n),
            (ColumnBuilder::TsMs(b), _) => b.append_null(),
            (ColumnBuilder::TsUs(b), Typed::I64(n)) => b.append_value(n),
            (ColumnBuilder::TsUs(b), _) => b.append_null(),
            (ColumnBuilder::TsNs(b), Typed::I64(n)) => b.append_value(n),
            (ColumnBuilder::TsNs(b), _) => b.append_null(),
        }
    }

    pub(crate) fn finish(self) -> ArrayRef {
        match self {
            ColumnBuilder::Utf8(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Utf8View(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Binary(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Int32(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Int64(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Float64(mut b) => Arc::new(b.finish()),
            ColumnBuilder::Boolean(mut b) => Arc::new(b.finish()),
            ColumnBuilder::TsS(mut b) => Arc::new(b.finish()),
            ColumnBuilder::TsMs(mut b) => Arc::new(b.finish()),
            ColumnBuilder::TsUs(mut b) => Arc::new(b.finish()),
            ColumnBuilder::TsNs(mut b) => Arc::new(b.finish()),
        }
    }
}
