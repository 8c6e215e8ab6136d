//! An IPC schema message to an Arrow schema, for schemas from outside.
//!
//! arrow's `fb_to_schema` panics on what it does not know (an integer of
//! width 7, a list without a child, a missing type table). This converter
//! covers the types payloads carry and returns an error for anything else.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{
    DataType, Field, Fields, IntervalUnit, Schema, SchemaRef, TimeUnit,
};
use datafusion::arrow::ipc;

/// Nesting deeper than this is refused (recursion depth).
const MAX_DEPTH: usize = 32;

/// A schema from a flatbuffer IPC schema message, refusing what the
/// checked decoder does not read.
pub fn schema_from_fb(fb: ipc::Schema) -> Result<SchemaRef, String> {
    if fb.endianness() != ipc::Endianness::Little {
        return Err("big-endian schema".into());
    }
    let fields = fb.fields().ok_or("schema without fields")?;
    let fields = fields
        .iter()
        .map(|f| field(f, 0))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(Schema::new(fields).with_metadata(metadata(
        fb.custom_metadata().into_iter().flatten(),
    ))))
}

fn metadata<'a>(kvs: impl IntoIterator<Item = ipc::KeyValue<'a>>) -> HashMap<String, String> {
    kvs.into_iter()
        .filter_map(|kv| Some((kv.key()?.to_string(), kv.value()?.to_string())))
        .collect()
}

fn field(f: ipc::Field, depth: usize) -> Result<Field, String> {
    if depth > MAX_DEPTH {
        return Err(format!("types nested deeper than {MAX_DEPTH}"));
    }
    let name = f.name().unwrap_or_default();
    if f.dictionary().is_some() {
        return Err(format!("column {name:?} is dictionary-encoded"));
    }
    let data_type = data_type(&f, depth).map_err(|e| format!("column {name:?}: {e}"))?;
    Ok(Field::new(name, data_type, f.nullable())
        .with_metadata(metadata(f.custom_metadata().into_iter().flatten())))
}

fn children(f: &ipc::Field, depth: usize) -> Result<Vec<Field>, String> {
    f.children()
        .into_iter()
        .flatten()
        .map(|c| field(c, depth + 1))
        .collect()
}

fn one_child(f: &ipc::Field, depth: usize) -> Result<Arc<Field>, String> {
    let mut c = children(f, depth)?;
    match (c.pop(), c.is_empty()) {
        (Some(child), true) => Ok(Arc::new(child)),
        _ => Err("a list type needs exactly one child".into()),
    }
}

fn time_unit(u: ipc::TimeUnit) -> Result<TimeUnit, String> {
    Ok(match u {
        ipc::TimeUnit::SECOND => TimeUnit::Second,
        ipc::TimeUnit::MILLISECOND => TimeUnit::Millisecond,
        ipc::TimeUnit::MICROSECOND => TimeUnit::Microsecond,
        ipc::TimeUnit::NANOSECOND => TimeUnit::Nanosecond,
        other => return Err(format!("unknown time unit {}", other.0)),
    })
}

fn data_type(f: &ipc::Field, depth: usize) -> Result<DataType, String> {
    let missing = || format!("{:?} type without its parameters", f.type_type());
    Ok(match f.type_type() {
        ipc::Type::Null => DataType::Null,
        ipc::Type::Bool => DataType::Boolean,
        ipc::Type::Utf8 => DataType::Utf8,
        ipc::Type::LargeUtf8 => DataType::LargeUtf8,
        ipc::Type::Utf8View => DataType::Utf8View,
        ipc::Type::Binary => DataType::Binary,
        ipc::Type::LargeBinary => DataType::LargeBinary,
        ipc::Type::BinaryView => DataType::BinaryView,
        ipc::Type::Int => {
            let int = f.type_as_int().ok_or_else(missing)?;
            match (int.bitWidth(), int.is_signed()) {
                (8, true) => DataType::Int8,
                (16, true) => DataType::Int16,
                (32, true) => DataType::Int32,
                (64, true) => DataType::Int64,
                (8, false) => DataType::UInt8,
                (16, false) => DataType::UInt16,
                (32, false) => DataType::UInt32,
                (64, false) => DataType::UInt64,
                (w, _) => return Err(format!("integer of width {w}")),
            }
        }
        ipc::Type::FloatingPoint => {
            match f.type_as_floating_point().ok_or_else(missing)?.precision() {
                ipc::Precision::HALF => DataType::Float16,
                ipc::Precision::SINGLE => DataType::Float32,
                ipc::Precision::DOUBLE => DataType::Float64,
                p => return Err(format!("unknown float precision {}", p.0)),
            }
        }
        ipc::Type::FixedSizeBinary => {
            let w = f
                .type_as_fixed_size_binary()
                .ok_or_else(missing)?
                .byteWidth();
            if w < 0 {
                return Err(format!("fixed-size binary of width {w}"));
            }
            DataType::FixedSizeBinary(w)
        }
        ipc::Type::Date => match f.type_as_date().ok_or_else(missing)?.unit() {
            ipc::DateUnit::DAY => DataType::Date32,
            ipc::DateUnit::MILLISECOND => DataType::Date64,
            u => return Err(format!("unknown date unit {}", u.0)),
        },
        ipc::Type::Time => {
            let t = f.type_as_time().ok_or_else(missing)?;
            match (t.bitWidth(), time_unit(t.unit())?) {
                (32, u @ (TimeUnit::Second | TimeUnit::Millisecond)) => DataType::Time32(u),
                (64, u @ (TimeUnit::Microsecond | TimeUnit::Nanosecond)) => DataType::Time64(u),
                (w, u) => return Err(format!("time of width {w} in {u:?}")),
            }
        }
        ipc::Type::Timestamp => {
            let t = f.type_as_timestamp().ok_or_else(missing)?;
            DataType::Timestamp(time_unit(t.unit())?, t.timezone().map(Arc::from))
        }
        ipc::Type::Duration => {
            DataType::Duration(time_unit(f.type_as_duration().ok_or_else(missing)?.unit())?)
        }
        ipc::Type::Interval => match f.type_as_interval().ok_or_else(missing)?.unit() {
            ipc::IntervalUnit::YEAR_MONTH => DataType::Interval(IntervalUnit::YearMonth),
            ipc::IntervalUnit::DAY_TIME => DataType::Interval(IntervalUnit::DayTime),
            ipc::IntervalUnit::MONTH_DAY_NANO => DataType::Interval(IntervalUnit::MonthDayNano),
            u => return Err(format!("unknown interval unit {}", u.0)),
        },
        ipc::Type::Decimal => {
            let d = f.type_as_decimal().ok_or_else(missing)?;
            let precision = u8::try_from(d.precision())
                .map_err(|_| format!("decimal precision {}", d.precision()))?;
            let scale =
                i8::try_from(d.scale()).map_err(|_| format!("decimal scale {}", d.scale()))?;
            match d.bitWidth() {
                128 if (1..=38).contains(&precision) => DataType::Decimal128(precision, scale),
                256 if (1..=76).contains(&precision) => DataType::Decimal256(precision, scale),
                w => return Err(format!("decimal of width {w} and precision {precision}")),
            }
        }
        ipc::Type::List => DataType::List(one_child(f, depth)?),
        ipc::Type::LargeList => DataType::LargeList(one_child(f, depth)?),
        ipc::Type::FixedSizeList => {
            let size = f.type_as_fixed_size_list().ok_or_else(missing)?.listSize();
            if size < 0 {
                return Err(format!("fixed-size list of size {size}"));
            }
            DataType::FixedSizeList(one_child(f, depth)?, size)
        }
        ipc::Type::Struct_ => DataType::Struct(Fields::from(children(f, depth)?)),
        ipc::Type::Map => {
            let sorted = f.type_as_map().ok_or_else(missing)?.keysSorted();
            let entries = one_child(f, depth)?;
            match entries.data_type() {
                DataType::Struct(kv) if kv.len() == 2 => DataType::Map(entries, sorted),
                _ => return Err("a map's child must be a struct of key and value".into()),
            }
        }
        other => return Err(format!("type {other:?} is not carried in payloads")),
    })
}
