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
/// Positions are byte offsets into the record, so that the scratch space
/// holding them can outlive any one record.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Raw {
    Null,
    /// String contents without quotes; `escaped` if they hold a backslash.
    Str {
        start: u32,
        end: u32,
        escaped: bool,
    },
    Num {
        start: u32,
        end: u32,
    },
    Bool(bool),
    /// An object or array: no declared type takes one.
    Nested,
}

/// A value checked against its column type, ready to append.
#[derive(Debug)]
enum Typed {
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

/// The most of a rejected record a dead letter carries. A letter must fit
/// its destination (a Kafka message, about 1 MiB by default; a Kinesis
/// record, 1 MiB): one embedding a whole oversized record is refused, and
/// the query would fail on it at every restart. Even escaped (at most six
/// bytes a byte) 64 KiB stays well under.
pub const DEAD_LETTER_PREFIX_BYTES: usize = 64 << 10;

/// A rejected record as its dead letter carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetterRecord {
    /// The record as text (invalid UTF-8 replaced), or its first
    /// [`DEAD_LETTER_PREFIX_BYTES`] when it is longer.
    pub record: String,
    /// The record's size in bytes.
    pub size: usize,
    pub truncated: bool,
}

impl LetterRecord {
    pub fn new(record: &[u8]) -> Self {
        let truncated = record.len() > DEAD_LETTER_PREFIX_BYTES;
        let kept = &record[..record.len().min(DEAD_LETTER_PREFIX_BYTES)];
        LetterRecord {
            record: String::from_utf8_lossy(kept).into_owned(),
            size: record.len(),
            truncated,
        }
    }
}

/// What the scanner found about a record as a whole.
#[derive(Debug, Clone, Copy)]
struct Scanned {
    /// The whole record is known to be UTF-8 (all ASCII, or checked), so
    /// every slice of it between quotes is too.
    utf8: bool,
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
            // Positions are kept as u32.
            max_record_bytes: max_record_bytes.min(u32::MAX as usize),
        })
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// A builder that decodes records one at a time into one batch; room
    /// for `capacity` rows is reserved up front.
    pub fn builder(&self, capacity: usize) -> BatchBuilder<'_> {
        BatchBuilder {
            decoder: self,
            columns: self
                .schema
                .fields()
                .iter()
                .map(|f| ColumnBuilder::new(f.data_type(), capacity))
                .collect(),
            rejected: vec![],
            records: 0,
            raw: vec![None; self.names.len()],
            typed: Vec::with_capacity(self.names.len()),
            quotes: Vec::with_capacity(64),
            keys: vec![],
        }
    }

    /// Decode every record; rejected ones add no row.
    pub fn decode<'a>(
        &self,
        records: impl ExactSizeIterator<Item = &'a [u8]>,
    ) -> Result<(RecordBatch, Vec<Rejected>)> {
        let mut builder = self.builder(records.len());
        for record in records {
            builder.push(record);
        }
        builder.finish()
    }

    fn check(
        &self,
        record: &[u8],
        scanned: Scanned,
        raw: &[Option<Raw>],
        typed: &mut Vec<Typed>,
    ) -> std::result::Result<(), String> {
        for (field, value) in self.schema.fields().iter().zip(raw) {
            let name = field.name();
            let v = match value {
                None | Some(Raw::Null) if field.is_nullable() => Typed::Null,
                None => return Err(format!("missing field {name:?}")),
                Some(Raw::Null) => return Err(format!("field {name:?} is null")),
                Some(v) => typed_value(field.data_type(), *v, self.format, record, scanned)
                    .map_err(|why| format!("field {name:?}: {why}"))?,
            };
            typed.push(v);
        }
        Ok(())
    }
}

/// Decodes records one at a time into the columns of one batch.
pub struct BatchBuilder<'d> {
    decoder: &'d RecordDecoder,
    columns: Vec<ColumnBuilder>,
    rejected: Vec<Rejected>,
    /// Records pushed so far, rejected ones included.
    records: usize,
    raw: Vec<Option<Raw>>,
    typed: Vec<Typed>,
    /// Positions of the quotes of the record being scanned.
    quotes: Vec<u32>,
    /// The keys of the last record the fast scanner read, in order, with
    /// their columns: records of one stream mostly repeat their keys.
    keys: Vec<(Vec<u8>, Option<usize>)>,
}

impl BatchBuilder<'_> {
    /// Decode one record into a row, or reject it; returns the reason of a
    /// rejection (the record is also listed in what `finish` returns).
    pub fn push(&mut self, record: &[u8]) -> Option<&str> {
        let d = self.decoder;
        let index = self.records;
        self.records += 1;
        self.raw.iter_mut().for_each(|r| *r = None);
        self.typed.clear();
        let outcome = if record.len() > d.max_record_bytes {
            Err(format!(
                "record of {} bytes exceeds the limit of {} bytes",
                record.len(),
                d.max_record_bytes
            ))
        } else {
            match d.format {
                Format::Json => {
                    match fast_scan_json(
                        record,
                        &d.names,
                        &mut self.raw,
                        &mut self.quotes,
                        &mut self.keys,
                    ) {
                        Some(scanned) => Ok(scanned),
                        None => {
                            // Anything unusual (escapes, nesting, bad syntax):
                            // the careful scanner decides, and says why.
                            self.raw.iter_mut().for_each(|r| *r = None);
                            scan_json(record, &d.names, &mut self.raw)
                                .map(|()| Scanned { utf8: false })
                        }
                    }
                    // JSON is UTF-8 throughout, undeclared fields included.
                    .and_then(|scanned| match scanned.utf8 {
                        true => Ok(scanned),
                        false => std::str::from_utf8(record)
                            .map(|_| Scanned { utf8: true })
                            .map_err(|e| format!("invalid UTF-8: {e}")),
                    })
                }
                Format::Csv { delimiter } => {
                    scan_csv(record, delimiter, &mut self.raw).map(|()| Scanned { utf8: false })
                }
                Format::Raw => {
                    self.raw[0] = Some(Raw::Str {
                        start: 0,
                        end: record.len() as u32,
                        escaped: false,
                    });
                    Ok(Scanned { utf8: false })
                }
            }
            .and_then(|scanned| d.check(record, scanned, &self.raw, &mut self.typed))
        };
        match outcome {
            Ok(()) => {
                for (col, value) in self.columns.iter_mut().zip(self.typed.drain(..)) {
                    col.append(value, record);
                }
                None
            }
            Err(reason) => {
                self.rejected.push(Rejected { index, reason });
                self.rejected.last().map(|r| r.reason.as_str())
            }
        }
    }

    /// Records pushed so far, rejected ones included.
    pub fn records(&self) -> usize {
        self.records
    }

    /// The batch of every accepted record, and the rejected ones.
    pub fn finish(self) -> Result<(RecordBatch, Vec<Rejected>)> {
        let arrays: Vec<ArrayRef> = self
            .columns
            .into_iter()
            .map(ColumnBuilder::finish)
            .collect();
        let batch = RecordBatch::try_new(self.decoder.schema.clone(), arrays)?;
        Ok((batch, self.rejected))
    }
}

fn span(record: &[u8], start: u32, end: u32) -> &[u8] {
    &record[start as usize..end as usize]
}

fn typed_value(
    data_type: &DataType,
    raw: Raw,
    format: Format,
    record: &[u8],
    scanned: Scanned,
) -> std::result::Result<Typed, String> {
    // A JSON string is a number only for a timestamp (YSB, for one, writes
    // its event times as strings of ms); a number column wants a number.
    if format == Format::Json
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
            Raw::Nested => Err("expected a scalar, got an object or array".into()),
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
            Raw::Num { start, end } if format != Format::Json => {
                text(raw)?;
                Typed::Str { start, end }
            }
            Raw::Bool(_) if format != Format::Json => Typed::Owned(text(raw)?.into_owned()),
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

/// The positions of every `"` of `record` into `quotes`, 16 bytes at a time.
/// Returns `None` if the record holds a backslash (its quotes may be
/// escaped, so they do not delimit strings), else whether it is all ASCII.
fn find_quotes(record: &[u8], quotes: &mut Vec<u32>) -> Option<bool> {
    quotes.clear();
    let mut high = 0u32;
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
        };
        // SAFETY: SSE2 is part of every x86_64 target; each load reads the
        // 16 bytes at `i`, which are inside `record` (unaligned load).
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            while i + 16 <= record.len() {
                let chunk = _mm_loadu_si128(record.as_ptr().add(i) as *const __m128i);
                if _mm_movemask_epi8(_mm_cmpeq_epi8(chunk, backslash)) != 0 {
                    return None;
                }
                high |= _mm_movemask_epi8(chunk) as u32;
                let mut q = _mm_movemask_epi8(_mm_cmpeq_epi8(chunk, quote)) as u32;
                while q != 0 {
                    quotes.push(i as u32 + q.trailing_zeros());
                    q &= q - 1;
                }
                i += 16;
            }
        }
    }
    for (j, &c) in record.iter().enumerate().skip(i) {
        match c {
            b'"' => quotes.push(j as u32),
            b'\\' => return None,
            _ => high |= (c >> 7) as u32,
        }
    }
    Some(high == 0)
}

/// The common case of [`scan_json`] without byte-by-byte string scanning: a
/// flat object of strings, numbers and literals without backslashes. The
/// quotes are found first (vectorised), then the structure is walked from
/// quote to quote. Returns `None` whenever the record is anything else, and
/// [`scan_json`] then decides (with the same results for every record this
/// accepts).
fn fast_scan_json(
    record: &[u8],
    names: &[Vec<u8>],
    out: &mut [Option<Raw>],
    quotes: &mut Vec<u32>,
    keys: &mut Vec<(Vec<u8>, Option<usize>)>,
) -> Option<Scanned> {
    let ascii = find_quotes(record, quotes)?;
    let b = record;
    let ws = |mut i: usize| {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    };
    let mut q = quotes.iter().map(|&p| p as usize);
    let mut i = ws(0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(i + 1);
    let mut nth_key = 0;
    loop {
        // The key: its quotes are the next two.
        if b.get(i) != Some(&b'"') || q.next() != Some(i) {
            return None;
        }
        let key_end = q.next()?;
        let key = &b[i + 1..key_end];
        i = ws(key_end + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = ws(i + 1);
        let value = match *b.get(i)? {
            b'"' => {
                if q.next() != Some(i) {
                    return None;
                }
                let end = q.next()?;
                let v = Raw::Str {
                    start: (i + 1) as u32,
                    end: end as u32,
                    escaped: false,
                };
                i = end + 1;
                v
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < b.len() && matches!(b[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                Raw::Num {
                    start: start as u32,
                    end: i as u32,
                }
            }
            b't' if b[i..].starts_with(b"true") => {
                i += 4;
                Raw::Bool(true)
            }
            b'f' if b[i..].starts_with(b"false") => {
                i += 5;
                Raw::Bool(false)
            }
            b'n' if b[i..].starts_with(b"null") => {
                i += 4;
                Raw::Null
            }
            _ => return None,
        };
        let slot = match keys.get(nth_key) {
            Some((k, slot)) if k.as_slice() == key => *slot,
            _ => {
                let slot = names.iter().position(|n| n.as_slice() == key);
                keys.truncate(nth_key);
                if nth_key < 64 {
                    keys.push((key.to_vec(), slot));
                }
                slot
            }
        };
        nth_key += 1;
        if let Some(slot) = slot {
            out[slot] = Some(value);
        }
        i = ws(i);
        match b.get(i) {
            Some(b',') => i = ws(i + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    if ws(i + 1) != b.len() || q.next().is_some() {
        return None;
    }
    Some(Scanned { utf8: ascii })
}

/// Scan one flat JSON object, keeping the raw values of declared fields.
fn scan_json(
    record: &[u8],
    names: &[Vec<u8>],
    out: &mut [Option<Raw>],
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
            let (key_start, key_end, _) = s.string()?;
            let key = &record[key_start..key_end];
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

impl Scanner<'_> {
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

    /// After the opening quote: where the contents start and end, and
    /// whether they hold escapes.
    fn string(&mut self) -> std::result::Result<(usize, usize, bool), String> {
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
                        let end = self.i;
                        self.i += 1;
                        return Ok((start, end, escaped));
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

    fn value(&mut self) -> std::result::Result<Raw, String> {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                let (start, end, escaped) = self.string()?;
                Ok(Raw::Str {
                    start: start as u32,
                    end: end as u32,
                    escaped,
                })
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                while matches!(
                    self.peek(),
                    Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                ) {
                    self.i += 1;
                }
                Ok(Raw::Num {
                    start: start as u32,
                    end: self.i as u32,
                })
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

    fn literal(&mut self, word: &[u8], v: Raw) -> std::result::Result<Raw, String> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.error("bad literal"))
        }
    }

    /// Step over an object or array, which must be valid JSON even in a
    /// field that is not declared.
    fn skip_nested(&mut self) -> std::result::Result<(), String> {
        let start = self.i;
        self.find_nested_end()?;
        serde_json::from_slice::<serde::de::IgnoredAny>(&self.b[start..self.i])
            .map(drop)
            .map_err(|e| format!("bad JSON in the object or array at byte {start}: {e}"))
    }

    /// Just past the bracket that brings the depth back to zero (of any
    /// kind: a mismatch is for [`Self::skip_nested`] to find).
    fn find_nested_end(&mut self) -> std::result::Result<(), String> {
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
fn scan_csv(
    record: &[u8],
    delimiter: u8,
    out: &mut [Option<Raw>],
) -> std::result::Result<(), String> {
    let line = record.strip_suffix(b"\n").unwrap_or(record);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut fields = 0;
    let mut i = 0;
    loop {
        let (start, end, next) = if line.get(i) == Some(&b'"') {
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
            (start, j, j + 1)
        } else {
            let end = line[i..]
                .iter()
                .position(|&c| c == delimiter)
                .map_or(line.len(), |p| i + p);
            (i, end, end)
        };
        if fields < out.len() {
            out[fields] = Some(if start == end {
                Raw::Null
            } else {
                Raw::Str {
                    start: start as u32,
                    end: end as u32,
                    escaped: false,
                }
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

    fn append(&mut self, v: Typed, record: &[u8]) {
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
    fn json_numbers_bad_utf8_and_bad_nesting_are_rejected_with_a_reason() {
        let d = RecordDecoder::new(schema(), Format::Json, 1024).unwrap();
        let ok = r#"{"ad_id": "a", "event_type": "v", "event_time": "1000""#;
        let mut bad_utf8 = format!(r#"{ok}, "x": "caf"#).into_bytes();
        bad_utf8.extend_from_slice(&[0xC3, 0x28]);
        bad_utf8.extend_from_slice(b"\"}");
        let records: Vec<Vec<u8>> = vec![
            // A timestamp still takes a string of ms.
            format!("{ok}, \"n\": 12}}").into_bytes(),
            format!("{ok}, \"n\": \"12\"}}").into_bytes(),
            format!("{ok}, \"n\": 1.5}}").into_bytes(),
            bad_utf8,
            format!("{ok}, \"x\": {{\"y\": [1}}]}}}}").into_bytes(),
            format!("{ok}, \"x\": [1 2]}}").into_bytes(),
        ];
        let (batch, rejected) = d.decode(records.iter().map(Vec::as_slice)).unwrap();
        assert_eq!(batch.num_rows(), 1, "{rejected:?}");
        let reasons: Vec<(usize, &str)> = rejected
            .iter()
            .map(|r| (r.index, r.reason.as_str()))
            .collect();
        assert_eq!(reasons.len(), 5, "{reasons:?}");
        assert_eq!(
            reasons[0],
            (1, "field \"n\": expected a number, got a string")
        );
        assert!(reasons[1].1.contains("expected an integer"), "{reasons:?}");
        assert!(reasons[2].1.starts_with("invalid UTF-8"), "{reasons:?}");
        assert!(
            reasons[3].1.contains("bad JSON in the object or array"),
            "{reasons:?}"
        );
        assert!(
            reasons[4].1.contains("bad JSON in the object or array"),
            "{reasons:?}"
        );

        let floats = Arc::new(Schema::new(vec![Field::new("f", DataType::Float64, false)]));
        let d = RecordDecoder::new(floats, Format::Json, 1024).unwrap();
        let (batch, rejected) = d
            .decode([&br#"{"f": 1.5}"#[..], br#"{"f": "1.5"}"#].into_iter())
            .unwrap();
        assert_eq!(batch.num_rows(), 1);
        assert!(
            rejected[0]
                .reason
                .contains("expected a number, got a string")
        );
    }

    #[test]
    fn fast_json_scan_agrees_with_the_careful_one() {
        let names: Vec<Vec<u8>> = ["ad_id", "event_type", "event_time", "n"]
            .iter()
            .map(|n| n.as_bytes().to_vec())
            .collect();
        let long = format!(
            r#"{{"user_id": "{}", "ad_id": "a-é-1", "event_type": "view", "event_time": "1795327431378", "ip_address": "1.2.3.4"}}"#,
            "x".repeat(100)
        );
        let records: Vec<&[u8]> = vec![
            br#"{"user_id": "e5626786-5783-4791-9b3d-a98a428d539b", "page_id": "a9bbae83-2d56-476d-ac64-7c5dd7b63837", "ad_id": "a6002d8a-46ea-4c7f-a04a-0a5aed875fce", "ad_type": "banner", "event_type": "view", "event_time": "1795327431378", "ip_address": "1.2.3.4"}"#,
            br#"{"ad_id":"a","event_type":"click","event_time":12,"n":-3.5e2,"ok":true,"no":false,"z":null}"#,
            b" {\n\t\"ad_id\" : \"a\" ,\r\n \"n\":7 } \n",
            br#"{"ad_id": "a", "ad_id": "b"}"#,
            br#"{}"#,
            br#"{"ad_id": "a\"b", "event_type": "view"}"#,
            br#"{"ad_id": "a", "x": {"y": 1}}"#,
            br#"{"ad_id": "a", "x": [1, 2]}"#,
            br#"{"ad_id": "a",}"#,
            br#"{"ad_id": "a"} x"#,
            br#"{"ad_id": "a""#,
            br#"{"ad_id" "a"}"#,
            br#"{"ad_id": tru}"#,
            br#"{"ad_id": "a", "n": nul}"#,
            br#"["ad_id"]"#,
            br#"{"ad_id": "unterminated}"#,
            long.as_bytes(),
            b"",
        ];
        let (mut quotes, mut keys) = (vec![], vec![]);
        let mut fast_taken = 0;
        for record in records {
            let mut careful = vec![None; names.len()];
            let verdict = scan_json(record, &names, &mut careful);
            let mut fast = vec![None; names.len()];
            if let Some(scanned) = fast_scan_json(record, &names, &mut fast, &mut quotes, &mut keys)
            {
                fast_taken += 1;
                assert!(verdict.is_ok(), "{:?}", String::from_utf8_lossy(record));
                assert_eq!(fast, careful, "{:?}", String::from_utf8_lossy(record));
                assert_eq!(scanned.utf8, record.is_ascii());
            }
        }
        assert_eq!(fast_taken, 5);
    }

    #[test]
    fn dead_letters_keep_a_bounded_prefix() {
        let small = LetterRecord::new(b"{\"a\": 1}");
        assert_eq!(
            (small.record.as_str(), small.size, small.truncated),
            ("{\"a\": 1}", 8, false)
        );
        let big = vec![b'x'; 3 << 20];
        let letter = LetterRecord::new(&big);
        assert_eq!(letter.record.len(), DEAD_LETTER_PREFIX_BYTES);
        assert_eq!((letter.size, letter.truncated), (3 << 20, true));
        // Cut inside a character: replaced, never a panic.
        let mut text = vec![b'a'; DEAD_LETTER_PREFIX_BYTES - 1];
        text.extend_from_slice("é".repeat(10).as_bytes());
        assert!(LetterRecord::new(&text).record.ends_with('\u{FFFD}'));
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
