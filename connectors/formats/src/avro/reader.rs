//! The reader schema of one writer schema: the writer's record with only
//! the fields the table declares, in the table's order, each kept as the
//! writer wrote it (type, default, aliases). Avro's resolution then skips
//! the other fields; promotions to the column types happen after decoding
//! ([`crate::conform`]), where every kind of value converts the
//! same way whatever the writer's logical type.

use std::collections::{HashMap, HashSet};

use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use datafusion::arrow::datatypes::{Field, Schema};
use serde_json::{Map, Value};

use super::defaults::{DEFAULT_KEY, Fill, is_string_uuid, uuid_default};
use crate::conform::{conversion, declared_schema};

/// Rows decoded per arrow-avro batch.
pub(crate) const BATCH_ROWS: usize = 4096;

/// The reader record for `columns` out of the writer record `writer`, and
/// for each column the position of its field in the reader (None: the
/// writer lacks it; [`Fill::missing`] says what the column is then).
pub(crate) fn select_fields(
    writer: &Value,
    columns: &[&Field],
) -> std::result::Result<(Value, Vec<Option<usize>>), String> {
    let record = as_record(writer)?;
    let fields = record
        .get("fields")
        .and_then(Value::as_array)
        .ok_or("the writer's record has no fields")?;
    let named = named_types(writer);
    let mut picked: Vec<Value> = vec![];
    let mut positions = Vec::with_capacity(columns.len());
    let mut defined = HashSet::new();
    for column in columns {
        let found = fields.iter().find(|f| field_name(f) == Some(column.name()));
        let found = found.or_else(|| {
            fields.iter().find(|f| {
                field_name(f).is_some_and(|n| n.eq_ignore_ascii_case(column.name()))
                    || f.get("aliases")
                        .and_then(Value::as_array)
                        .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(column.name())))
            })
        });
        match found {
            Some(f) => {
                if picked.iter().any(|p| field_name(p) == field_name(f)) {
                    return Err(format!(
                        "two columns read the writer's field {:?}",
                        field_name(f).unwrap_or_default()
                    ));
                }
                let mut f = f.clone();
                if let Some(t) = f.get_mut("type") {
                    inline_named(t, &named, &mut defined);
                }
                positions.push(Some(picked.len()));
                picked.push(f);
            }
            None => positions.push(None),
        }
    }
    let mut reader = Map::new();
    reader.insert("type".into(), "record".into());
    for key in ["name", "namespace"] {
        if let Some(v) = record.get(key) {
            reader.insert(key.into(), v.clone());
        }
    }
    reader.insert("fields".into(), Value::Array(picked));
    Ok((Value::Object(reader), positions))
}

/// The record object of a writer schema.
pub(crate) fn as_record(writer: &Value) -> std::result::Result<&Map<String, Value>, String> {
    match writer {
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("record") => Ok(o),
        other => Err(format!(
            "the writer schema is {}, not a record",
            match other.get("type") {
                Some(t) => t.to_string(),
                None => other.to_string(),
            }
        )),
    }
}

pub(crate) fn field_name(f: &Value) -> Option<&str> {
    f.get("name").and_then(Value::as_str)
}

/// Every named type (record, enum, fixed) the schema defines, by its
/// short and its full name.
pub(crate) fn named_types(schema: &Value) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    collect_named(schema, None, &mut out);
    out
}

fn collect_named(v: &Value, namespace: Option<&str>, out: &mut HashMap<String, Value>) {
    match v {
        Value::Array(branches) => branches
            .iter()
            .for_each(|b| collect_named(b, namespace, out)),
        Value::Object(o) => {
            let ns = o.get("namespace").and_then(Value::as_str).or(namespace);
            if let Some(name) = o.get("name").and_then(Value::as_str)
                && matches!(
                    o.get("type").and_then(Value::as_str),
                    Some("record" | "enum" | "fixed")
                )
            {
                out.insert(name.to_string(), v.clone());
                if let Some(ns) = ns
                    && !name.contains('.')
                {
                    out.insert(format!("{ns}.{name}"), v.clone());
                }
            }
            for key in ["fields", "items", "values"] {
                match o.get(key) {
                    Some(Value::Array(fields)) => fields
                        .iter()
                        .filter_map(|f| f.get("type"))
                        .for_each(|t| collect_named(t, ns, out)),
                    Some(t) => collect_named(t, ns, out),
                    None => {}
                }
            }
            if let Some(t) = o.get("type").filter(|t| !t.is_string()) {
                collect_named(t, ns, out);
            }
        }
        _ => {}
    }
}

const PRIMITIVES: &[&str] = &[
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
];

/// Replace a reference to a named type that the reader has not defined
/// yet (its definition was in a field the table does not read) by the
/// definition itself.
fn inline_named(t: &mut Value, named: &HashMap<String, Value>, defined: &mut HashSet<String>) {
    match t {
        Value::String(name) if !PRIMITIVES.contains(&name.as_str()) => {
            if !defined.contains(name.as_str())
                && let Some(def) = named.get(name.as_str())
            {
                defined.insert(name.clone());
                let mut def = def.clone();
                mark_defined(&def, defined);
                inline_children(&mut def, named, defined);
                *t = def;
            }
        }
        Value::Array(branches) => branches
            .iter_mut()
            .for_each(|b| inline_named(b, named, defined)),
        Value::Object(_) => {
            mark_defined(t, defined);
            inline_children(t, named, defined);
        }
        _ => {}
    }
}

fn mark_defined(def: &Value, defined: &mut HashSet<String>) {
    if let Some(name) = def.get("name").and_then(Value::as_str)
        && matches!(
            def.get("type").and_then(Value::as_str),
            Some("record" | "enum" | "fixed")
        )
    {
        defined.insert(name.to_string());
        if let Some(ns) = def.get("namespace").and_then(Value::as_str) {
            defined.insert(format!("{ns}.{name}"));
        }
    }
}

fn inline_children(t: &mut Value, named: &HashMap<String, Value>, defined: &mut HashSet<String>) {
    let Value::Object(o) = t else { return };
    if let Some(Value::Array(fields)) = o.get_mut("fields") {
        for f in fields {
            if let Some(ft) = f.get_mut("type") {
                inline_named(ft, named, defined);
            }
        }
    }
    for key in ["items", "values"] {
        if let Some(x) = o.get_mut(key) {
            inline_named(x, named, defined);
        }
    }
    if let Some(x) = o.get_mut("type").filter(|x| !x.is_string()) {
        inline_named(x, named, defined);
    }
}

/// An arrow-avro decoder of records written with `writer` (under `id`)
/// read with `reader` (None: as written).
pub(crate) fn decoder(
    id: u32,
    writer: &str,
    reader: Option<&str>,
) -> std::result::Result<Decoder, String> {
    let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
    store
        .set(Fingerprint::Id(id), AvroSchema::new(writer.to_string()))
        .map_err(|e| e.to_string())?;
    let mut builder = ReaderBuilder::new()
        .with_writer_schema_store(store)
        .with_batch_size(BATCH_ROWS);
    if let Some(r) = reader {
        builder = builder.with_reader_schema(AvroSchema::new(r.to_string()));
    }
    builder.build_decoder().map_err(|e| e.to_string())
}

/// How the decoded fields of one writer schema become the table's columns.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) id: u32,
    pub(crate) writer: String,
    pub(crate) reader: String,
    /// Per column: its field in the decoded batch and how it converts, or
    /// what fills it when the writer lacks it.
    pub(crate) columns: Vec<Fill>,
}

impl Plan {
    /// Resolve the table's `columns` against the writer schema `writer` of `id`.
    pub(crate) fn new(
        id: u32,
        writer: &str,
        columns: &[&Field],
    ) -> std::result::Result<Self, String> {
        let parsed: Value = serde_json::from_str(writer)
            .map_err(|e| format!("the writer schema is not JSON: {e}"))?;
        let (reader, positions) = select_fields(&parsed, columns)?;
        let reader = reader.to_string();
        let decoded = decoder(id, writer, Some(&reader))
            .map_err(|e| format!("the table's columns cannot be read from it: {e}"))?
            .schema();
        let mut plan = Vec::with_capacity(columns.len());
        for (column, position) in columns.iter().zip(positions) {
            let Some(k) = position else {
                plan.push(Fill::missing(column)?);
                continue;
            };
            let field = decoded.field(k);
            if field.is_nullable() && !column.is_nullable() {
                return Err(format!(
                    "column {} is NOT NULL but the writer's field {} may be null",
                    column.name(),
                    field.name()
                ));
            }
            let c = conversion(field.data_type(), column.data_type()).map_err(|why| {
                format!(
                    "column {}: the writer's field {}: {why}",
                    column.name(),
                    field.name()
                )
            })?;
            plan.push(Fill::Read(k, c));
        }
        Ok(Plan {
            id,
            writer: writer.to_string(),
            reader,
            columns: plan,
        })
    }

    pub(crate) fn decoder(&self) -> std::result::Result<Decoder, String> {
        decoder(self.id, &self.writer, Some(&self.reader))
    }
}

/// The table a writer schema makes when a table declares no columns: one
/// column per field, which keeps the field's default (if it has one) in
/// its metadata, so that records of older writer schemas without the field
/// take it.
pub(crate) fn columns_of(writer: &str) -> std::result::Result<Schema, String> {
    let decoded = decoder(0, writer, None)?.schema();
    let fields: Vec<Field> = decoded
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let declared = declared_schema(&fields)?;
    let parsed: Value =
        serde_json::from_str(writer).map_err(|e| format!("the schema is not JSON: {e}"))?;
    let written = as_record(&parsed)?
        .get("fields")
        .and_then(Value::as_array)
        .ok_or("the schema's record has no fields")?;
    let columns = declared
        .fields()
        .iter()
        .zip(&fields)
        .map(|(column, decoded)| {
            let field = written
                .iter()
                .find(|f| field_name(f) == Some(decoded.name()));
            let default = match field.and_then(|f| Some((f.get("type")?, f.get("default")?))) {
                // The column holds a uuid's 16 bytes, not its text.
                Some((t, d)) if is_string_uuid(t) => uuid_default(d).ok_or_else(|| {
                    format!("field {:?}: the default {d} is not a uuid", decoded.name())
                })?,
                Some((_, d)) => d.clone(),
                None => return Ok(column.as_ref().clone()),
            };
            let metadata = [(DEFAULT_KEY.to_string(), default.to_string())];
            Ok(column.as_ref().clone().with_metadata(metadata.into()))
        })
        .collect::<std::result::Result<Vec<Field>, String>>()?;
    Ok(Schema::new(columns))
}

#[cfg(test)]
#[path = "reader_tests.rs"]
mod tests;
