//! Record decoders: JSON, CSV and raw bytes straight into Arrow columns of a
//! declared schema.
//!
//! Only the declared fields are decoded; other JSON keys are skipped without
//! being parsed into values. A record that does not fit the schema (bad
//! syntax, a missing non-nullable field, a value of the wrong type, too many
//! bytes) is rejected with its reason and adds no row: the caller sends it to
//! the dead-letter destination.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, Float64Builder, Int32Builder, Int64Builder,
    StringBuilder, StringViewBuilder, TimestampMicrosecondBuilder, TimestampMillisecondBuilder,
    TimestampNanosecondBuilder, TimestampSecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::{ConnectorError, Result};

/// How record bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One flat JSON object per record.
    Json,
    /// One line of delimited text per record, fields in declared order.
    Csv { delimiter: u8 },
    /// The whole record in the first declared column (Utf8 or Binary).
    Raw,
}

impl FromStr for Format {
    type Err = ConnectorError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv { delimiter: b',' }),
            "raw" => Ok(Format::Raw),
            other => Err(ConnectorError::Config(format!(
                "unknown format {other:?}; known: json, csv, raw"
            ))),
        }
    }
}

/// A record that was not decoded, by its index in the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub index: usize,
    pub reason: String,
}

/// Decodes records of one format into batches of one schema.
#[derive(Debug, Clone)]
pub struct RecordDecoder {
    schema: SchemaRef,
    format: Format,
    names: Vec<Vec<u8>>,
    max_record_bytes: usize,
}

/// One value as found in a record, before it is checked against its type.
#[derive(Debug, Clone, Copy)]
enum Raw<'a> {
    Null,
    /// String contents without quotes; `escaped` if they hold a backslash.
    Str {
        bytes: &'a [u8],
        escaped: bool,
    },
    Num(&'a [u8]),
    Bool(bool),
    /// An object or array: no declared type takes one.
    Nested,
}

/// A value checked against its column type, ready to append.
enum Typed<'a> {
    Null,
    Str(Cow<'a, str>),
    Bytes(&'a [u8]),
    I64(i64),
    F64(f64),
    Bool(bool),
}

impl RecordDecoder {
    pub fn new(schema: SchemaRef, format: Format, max_record_bytes: usize) -> Result<Self> {
        for f in schema.fields() {
            let supported = matches!(
                f.data_type(),
                DataType::Utf8
                    | DataType::Utf8View
                    | DataType::Int32
                    | DataType::Int64
                    | DataType::Float64
                    | DataType::Boolean
                    | DataType::Timestamp(_, None)
            ) || (format == Format::Raw && *f.data_type() == DataType::Binary);
            if !supported {
                return Err(ConnectorError::Config(format!(
                    "column {} has type {}, which the {format:?} decoder does not produce",
                    f.name(),
                    f.data_type()
                )));
            }
        }
        if format == Format::Raw && schema.fields().is_empty() {
            return Err(ConnectorError::Config(
                "the raw format needs one column".into(),
            ));
        }
        Ok(RecordDecoder {
            names: schema
                .fields()
                .iter()
                .map(|f| f.name().as_bytes().to_vec())
                .collect(),
            schema,
            format,
            max_record_bytes,
        })
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Decode every record; rejected ones add no row.
    pub fn decode<'a>(
        &self,
        records: impl ExactSizeIterator<Item = &'a [u8]>,
    ) -> Result<(RecordBatch, Vec<Rejected>)> {
        let mut columns: Vec<ColumnBuilder> = self
            .schema
            .fields()
            .iter()
            .map(|f| ColumnBuilder::new(f.data_type(), records.len()))
            .collect();
        let mut rejected = vec![];
        let mut raw: Vec<Option<Raw<'a>>> = vec![None; self.names.len()];
        let mut typed: Vec<Typed<'a>> = Vec::with_capacity(self.names.len());
        for (index, record) in records.enumerate() {
            raw.iter_mut().for_each(|r| *r = None);
            typed.clear();
            let outcome = if record.len() > self.max_record_bytes {
                Err(format!(
                    "record of {} bytes exceeds the limit of {} bytes",
                    record.len(),
                    self.max_record_bytes
                ))
            } else {
                match self.format {
                    Format::Json => scan_json(record, &self.names, &mut raw),
                    Format::Csv { delimiter } => scan_csv(record, delimiter, &mut raw),
                    Format::Raw => {
                        raw[0] = Some(Raw::Str {
                            bytes: record,
                            escaped: false,
                        });
                        Ok(())
                    }
                }
                .and_then(|()| self.check(&raw, &mut typed))
            };
            match outcome {
                Ok(()) => {
                    for (col, value) in columns.iter_mut().zip(typed.drain(..)) {
                        col.append(value);
                    }
                }
                Err(reason) => rejected.push(Rejected { index, reason }),
            }
        }
        let arrays: Vec<ArrayRef> = columns.into_iter().map(ColumnBuilder::finish).collect();
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)?;
        Ok((batch, rejected))
    }

    fn check<'a>(
        &self,
        raw: &[Option<Raw<'a>>],
        typed: &mut Vec<Typed<'a>>,
    ) -> std::result::Result<(), String> {
        for (field, value) in self.schema.fields().iter().zip(raw) {
            let name = field.name();
            let v = match value {
                None | Some(Raw::Null) if field.is_nullable() => Typed::Null,
                None => return Err(format!("missing field {name:?}")),
                Some(Raw::Null) => return Err(format!("field {name:?} is null")),
                Some(v) => typed_value(field.data_type(), *v, self.format)
                    .map_err(|why| format!("field {name:?}: {why}"))?,
            };
            typed.push(v);
        }
        Ok(())
    }
}

fn typed_value<'a>(
    data_type: &DataType,
    raw: Raw<'a>,
    format: Format,
) -> std::result::Result<Typed<'a>, String> {
    // JSON strings are accepted for numbers too: YSB, for one, writes its
    // event times as strings.
    let text = |raw: Raw<'a>| -> std::result::Result<Cow<'a, str>, String> {
        match raw {
            Raw::Str { bytes, escaped } => unescape(bytes, escaped),
            Raw::Num(bytes) => std::str::from_utf8(bytes)
                .map(Cow::Borrowed)
                .map_err(|e| e.to_string()),
            Raw::Bool(b) => Ok(Cow::Borrowed(if b { "true" } else { "false" })),
            Raw::Null => Ok(Cow::Borrowed("")),
            Raw::Nested => Err("expected a scalar, got an object or array".into()),
        }
    };
    Ok(match data_type {
        DataType::Binary => match raw {
            Raw::Str { bytes, .. } => Typed::Bytes(bytes),
            _ => return Err("expected bytes".into()),
        },
        DataType::Utf8 | DataType::Utf8View => match raw {
            Raw::Str { .. } => Typed::Str(text(raw)?),
            // CSV fields are all text; JSON must match.
            Raw::Num(_) | Raw::Bool(_) if format != Format::Json => Typed::Str(text(raw)?),
            _ => return Err("expected a string".into()),
        },
        DataType::Int32 | DataType::Int64 | DataType::Timestamp(_, None) => {
            let t = text(raw)?;
            let n: i64 = t
                .trim()
                .parse()
                .map_err(|_| format!("expected an integer, got {:?}", truncate(&t)))?;
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

/// Scan one flat JSON object, keeping the raw values of declared fields.
fn scan_json<'a>(
    record: &'a [u8],
    names: &[Vec<u8>],
    out: &mut [Option<Raw<'a>>],
) -> std::result::Result<(), String> {
    let mut s = Scanner { b: record, i: 0 };
    s.ws();
    s.expect(b'{')?;
    s.ws();
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            s.ws();
            s.expect(b'"')?;
            let (key, _) = s.string()?;
            s.ws();
            s.expect(b':')?;
            s.ws();
            let slot = names.iter().position(|n| n.as_slice() == key);
            let value = s.value()?;
            if let Some(slot) = slot {
                out[slot] = Some(value);
            }
            s.ws();
            match s.next() {
                Some(b',') => continue,
                Some(b'}') => break,
                Some(c) => {
                    return Err(s.error(&format!("expected ',' or '}}', found {:?}", c as char)));
                }
                None => return Err("truncated JSON object".into()),
            }
        }
    }
    s.ws();
    if s.i != record.len() {
        return Err(s.error("trailing bytes after the JSON object"));
    }
    Ok(())
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek();
        self.i += 1;
        c
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn error(&self, what: &str) -> String {
        format!("bad JSON at byte {}: {what}", self.i.min(self.b.len()))
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        match self.next() {
            Some(x) if x == c => Ok(()),
            Some(x) => {
                self.i -= 1;
                Err(self.error(&format!("expected {:?}, found {:?}", c as char, x as char)))
            }
            None => Err(self.error(&format!("expected {:?}, found the end", c as char))),
        }
    }

    /// After the opening quote: the contents, and whether they hold escapes.
    fn string(&mut self) -> std::result::Result<(&'a [u8], bool), String> {
        let start = self.i;
        let mut escaped = false;
        loop {
            match self.b[self.i..]
                .iter()
                .position(|&c| c == b'"' || c == b'\\')
            {
                None => {
                    self.i = self.b.len();
                    return Err(self.error("unterminated string"));
                }
                Some(p) => {
                    self.i += p;
                    if self.b[self.i] == b'"' {
                        let s = &self.b[start..self.i];
                        self.i += 1;
                        return Ok((s, escaped));
                    }
                    escaped = true;
                    self.i += 2;
                    if self.i > self.b.len() {
                        return Err(self.error("unterminated string"));
                    }
                }
            }
        }
    }

    fn value(&mut self) -> std::result::Result<Raw<'a>, String> {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                let (bytes, escaped) = self.string()?;
                Ok(Raw::Str { bytes, escaped })
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                while matches!(
                    self.peek(),
                    Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                ) {
                    self.i += 1;
                }
                Ok(Raw::Num(&self.b[start..self.i]))
            }
            Some(b't') => self.literal(b"true", Raw::Bool(true)),
            Some(b'f') => self.literal(b"false", Raw::Bool(false)),
            Some(b'n') => self.literal(b"null", Raw::Null),
            Some(b'{' | b'[') => {
                self.skip_nested()?;
                Ok(Raw::Nested)
            }
            Some(c) => Err(self.error(&format!("unexpected {:?}", c as char))),
            None => Err(self.error("truncated value")),
        }
    }

    fn literal(&mut self, word: &[u8], v: Raw<'a>) -> std::result::Result<Raw<'a>, String> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.error("bad literal"))
        }
    }

    fn skip_nested(&mut self) -> std::result::Result<(), String> {
        let mut depth = 0usize;
        loop {
            match self.next() {
                Some(b'{' | b'[') => depth += 1,
                Some(b'}' | b']') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                Some(b'"') => {
                    self.string()?;
                }
                Some(_) => {}
                None => return Err(self.error("truncated object or array")),
            }
        }
    }
}

/// Split one delimited line into the declared columns, in order. Fields may
/// be quoted with `"` (a doubled quote inside is one quote).
fn scan_csv<'a>(
    record: &'a [u8],
    delimiter: u8,
    out: &mut [Option<Raw<'a>>],
) -> std::result::Result<(), String> {
    let line = record.strip_suffix(b"\n").unwrap_or(record);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut fields = 0;
    let mut i = 0;
    loop {
        let (bytes, escaped, next) = if line.get(i) == Some(&b'"') {
            let start = i + 1;
            let mut j = start;
            let mut doubled = false;
            loop {
                match line.get(j) {
                    None => return Err("unterminated quoted CSV field".into()),
                    Some(b'"') if line.get(j + 1) == Some(&b'"') => {
                        doubled = true;
                        j += 2;
                    }
                    Some(b'"') => break,
                    Some(_) => j += 1,
                }
            }
            if doubled {
                return Err("doubled quotes in CSV fields are not supported".into());
            }
            (&line[start..j], false, j + 1)
        } else {
            let end = line[i..]
                .iter()
                .position(|&c| c == delimiter)
                .map_or(line.len(), |p| i + p);
            (&line[i..end], false, end)
        };
        if fields < out.len() {
            out[fields] = Some(if bytes.is_empty() {
                Raw::Null
            } else {
                Raw::Str { bytes, escaped }
            });
        }
        fields += 1;
        match line.get(next) {
            None => break,
            Some(&c) if c == delimiter => i = next + 1,
            Some(_) => return Err("garbage after a quoted CSV field".into()),
        }
    }
    if fields != out.len() {
        return Err(format!("expected {} CSV fields, found {fields}", out.len()));
    }
    Ok(())
}

enum ColumnBuilder {
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
    fn new(data_type: &DataType, rows: usize) -> Self {
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

    fn append(&mut self, v: Typed<'_>) {
        match (self, v) {
            (ColumnBuilder::Utf8(b), Typed::Str(s)) => b.append_value(s),
            (ColumnBuilder::Utf8(b), _) => b.append_null(),
            (ColumnBuilder::Utf8View(b), Typed::Str(s)) => b.append_value(s),
            (ColumnBuilder::Utf8View(b), _) => b.append_null(),
            (ColumnBuilder::Binary(b), Typed::Bytes(s)) => b.append_value(s),
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

    fn finish(self) -> ArrayRef {
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

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray, Int64Array};
    use datafusion::arrow::datatypes::{Field, Schema, TimestampNanosecondType};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("ad_id", DataType::Utf8, false),
            Field::new("event_type", DataType::Utf8, false),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                false,
            ),
            Field::new("n", DataType::Int64, true),
        ]))
    }

    #[test]
    fn json_keeps_declared_fields_and_rejects_bad_records() {
        let d = RecordDecoder::new(schema(), Format::Json, 1024).unwrap();
        let records: Vec<&[u8]> = vec![
            br#"{"user_id": "u", "ad_id": "a1", "event_type": "view", "event_time": "1000", "x": {"y": [1, "}"]}}"#,
            br#"{"ad_id": "a\"2", "event_type": "click", "event_time": 2000, "n": 7}"#,
            br#"{"ad_id": "a3", "event_type": "view""#,
            br#"{"ad_id": 5, "event_type": "view", "event_time": "1"}"#,
            br#"{"event_type": "view", "event_time": "1"}"#,
            br#"{"ad_id": "a", "event_type": "view", "event_time": "soon"}"#,
            b"not json",
        ];
        let (batch, rejected) = d.decode(records.into_iter()).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(0).as_string::<i32>().value(1), "a\"2");
        let ts = batch.column(2).as_primitive::<TimestampNanosecondType>();
        assert_eq!(ts.value(0), 1_000_000_000);
        let n = batch
            .column(3)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert!(n.is_null(0));
        assert_eq!(n.value(1), 7);
        let idx: Vec<usize> = rejected.iter().map(|r| r.index).collect();
        assert_eq!(idx, vec![2, 3, 4, 5, 6]);
        assert!(
            rejected[2].reason.contains("missing field \"ad_id\""),
            "{rejected:?}"
        );
    }

    #[test]
    fn csv_and_size_limit() {
        let d = RecordDecoder::new(schema(), Format::Csv { delimiter: b',' }, 40).unwrap();
        let records: Vec<&[u8]> = vec![
            b"a1,view,1000,3\n",
            b"\"a,2\",view,1000,",
            b"a1,view\n",
            b"a1,view,1000,3,this line is far too long for the limit",
        ];
        let (batch, rejected) = d.decode(records.into_iter()).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(0).as_string::<i32>().value(1), "a,2");
        assert_eq!(rejected.len(), 2);
        assert!(rejected[1].reason.contains("exceeds"));
    }
}
