//! `debezium-avro-confluent`: Debezium envelopes in the Confluent wire
//! format. Per writer schema id the reader schema keeps `before`, `after`
//! (the row record with only the table's columns) and `op`. Events are
//! decoded one at a time, since whether one can be applied is known only
//! from its decoded `op` and images, and a rejection must come with the
//! record (change streams are not the hot path).

use std::sync::Arc;

use arrow_avro::reader::Decoder;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, StructArray};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{Field, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use serde_json::{Map, Value};

use super::{Change, tagged};
use crate::avro::decode::feed;
use crate::avro::defaults::Fill;
use crate::avro::reader::{as_record, decoder, field_name, named_types, select_fields};
use crate::avro::{AvroFormat, Plans};
use crate::confluent::confluent_header;
use crate::conform::conversion;
use skein_clients::error::Result;

/// How events of one writer schema are read.
#[derive(Debug)]
struct EnvelopePlan {
    writer: String,
    reader: String,
    /// Per column: its field in the row struct and how it converts, or
    /// what fills it when the writer lacks it.
    columns: Vec<Fill>,
}

impl EnvelopePlan {
    fn new(id: u32, writer: &str, columns: &[&Field]) -> std::result::Result<Self, String> {
        let parsed: Value = serde_json::from_str(writer)
            .map_err(|e| format!("the writer schema is not JSON: {e}"))?;
        let envelope = as_record(&parsed)?;
        let fields = envelope
            .get("fields")
            .and_then(Value::as_array)
            .ok_or("the writer's record has no fields")?;
        let field = |name: &str| {
            fields
                .iter()
                .find(|f| field_name(f) == Some(name))
                .ok_or_else(|| format!("not a Debezium envelope: no field {name:?}"))
        };
        let (before, op) = (field("before")?, field("op")?);
        field("after")?;
        let named = named_types(&parsed);
        let row = match before.get("type") {
            Some(Value::Array(branches)) => branches.iter().find(|b| *b != "null"),
            other => other,
        }
        .and_then(|t| match t {
            Value::String(name) => named.get(name.as_str()),
            t => Some(t),
        })
        .ok_or("the envelope's 'before' is not a record")?;
        let (row_reader, positions) = select_fields(row, columns)?;
        let row_name = match (row.get("namespace"), row.get("name")) {
            (Some(Value::String(ns)), Some(Value::String(n))) if !n.contains('.') => {
                format!("{ns}.{n}")
            }
            (_, Some(Value::String(n))) => n.clone(),
            _ => return Err("the envelope's row record has no name".into()),
        };
        let nullable =
            |t: Value| serde_json::json!({"name": "", "type": ["null", t], "default": null});
        let mut b = nullable(row_reader);
        b["name"] = "before".into();
        let mut a = nullable(Value::String(row_name));
        a["name"] = "after".into();
        let mut reader = Map::new();
        reader.insert("type".into(), "record".into());
        for key in ["name", "namespace"] {
            if let Some(v) = envelope.get(key) {
                reader.insert(key.into(), v.clone());
            }
        }
        reader.insert("fields".into(), Value::Array(vec![b, a, op.clone()]));
        let reader = Value::Object(reader).to_string();
        let decoded = decoder(id, writer, Some(&reader))
            .map_err(|e| format!("the table's columns cannot be read from it: {e}"))?
            .schema();
        let row_fields = match decoded.field(0).data_type() {
            datafusion::arrow::datatypes::DataType::Struct(f) => f.clone(),
            other => return Err(format!("'before' decodes as {other}, not a record")),
        };
        let mut plan = Vec::with_capacity(columns.len());
        for (column, position) in columns.iter().zip(positions) {
            plan.push(match position {
                None => Fill::missing(column)?,
                Some(k) => {
                    let f = &row_fields[k];
                    let c = conversion(f.data_type(), column.data_type()).map_err(|why| {
                        format!(
                            "column {}: the writer's field {}: {why}",
                            column.name(),
                            f.name()
                        )
                    })?;
                    Fill::Read(k, c)
                }
            });
        }
        Ok(EnvelopePlan {
            writer: writer.to_string(),
            reader,
            columns: plan,
        })
    }

    /// One image (a row struct of a one-row batch) as the table's columns.
    fn row(&self, schema: &SchemaRef, image: &StructArray) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .zip(&self.columns)
            .map(|(field, fill)| fill.column(field, image.len(), |k| image.column(k)))
            .collect::<Result<_>>()?;
        Ok(RecordBatch::try_new(schema.clone(), columns)?)
    }
}

/// Decodes Debezium Avro envelopes.
#[derive(Debug)]
pub(crate) struct EnvelopeDecoder {
    schema: SchemaRef,
    format: AvroFormat,
    plans: Plans<EnvelopePlan>,
}

impl EnvelopeDecoder {
    pub(crate) fn new(schema: SchemaRef, format: AvroFormat) -> Self {
        EnvelopeDecoder {
            schema,
            format,
            plans: Plans::default(),
        }
    }

    pub(crate) fn registry_problem(&self) -> Option<String> {
        self.format.registry_problem()
    }

    fn plan(&self, id: u32) -> Arc<std::result::Result<EnvelopePlan, String>> {
        self.plans
            .get(id, &self.format, &self.schema, EnvelopePlan::new)
    }
}

/// Decodes Debezium Avro events one at a time.
pub struct DebeziumAvroBuilder<'d> {
    decoder: &'d EnvelopeDecoder,
    /// The arrow-avro decoder of the last writer schema id.
    active: Option<(u32, Decoder)>,
    rows: Vec<RecordBatch>,
    ops: Vec<i8>,
}

impl<'d> DebeziumAvroBuilder<'d> {
    pub(crate) fn new(decoder: &'d EnvelopeDecoder) -> Self {
        DebeziumAvroBuilder {
            decoder,
            active: None,
            rows: vec![],
            ops: vec![],
        }
    }

    pub(crate) fn push(&mut self, record: &[u8]) -> std::result::Result<(), String> {
        if record.is_empty() {
            return Ok(()); // a tombstone
        }
        let (id, body) = confluent_header(record)?;
        let plan = self.decoder.plan(id);
        let plan = plan.as_ref().as_ref().map_err(Clone::clone)?;
        if self.active.as_ref().is_none_or(|(a, _)| *a != id) {
            self.active = Some((id, decoder(id, &plan.writer, Some(&plan.reader))?));
        }
        let (_, dec) = self.active.as_mut().expect("set above");
        let fed = feed(dec, id, body);
        let event = fed.and_then(|()| {
            dec.flush()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "no row decoded".to_string())
        });
        let event = match event {
            Ok(e) => e,
            Err(why) => {
                self.active = None; // its columns may be half-filled
                return Err(format!("undecodable Avro (writer schema id {id}): {why}"));
            }
        };
        let op = event.column(2).as_string::<i32>();
        let change = Change::of(op.value(0))?;
        let image = |i: usize| {
            let s = event.column(i).as_struct();
            (!s.is_null(0)).then_some(s)
        };
        let (before, after) = (image(0), image(1));
        change.check(before.is_some(), after.is_some())?;
        let schema = &self.decoder.schema;
        let mut rows = vec![];
        for image in [
            before.filter(|_| change != Change::Insert),
            after.filter(|_| change != Change::Delete),
        ]
        .into_iter()
        .flatten()
        {
            rows.push(plan.row(schema, image).map_err(|e| e.to_string())?);
        }
        self.rows.extend(rows);
        self.ops.extend_from_slice(change.ops());
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<RecordBatch> {
        let rows = concat_batches(&self.decoder.schema, &self.rows)?;
        tagged(&rows, self.ops)
    }
}
