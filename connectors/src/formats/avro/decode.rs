//! The Avro decoder: one resolution ([`Plan`]) per writer schema id, kept
//! for the decoder's life, and an arrow-avro decoder per run of records
//! with the same id.

use std::sync::Arc;

use arrow_avro::reader::Decoder;
use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use super::reader::{Plan, columns_of};
use super::{AvroFormat, Plans};
use crate::error::{ConnectorError, Result};
use crate::formats::conform::{apply, nulls};
use crate::formats::{confluent_header, confluent_prefix};

/// Decodes Avro records into batches of the table's columns.
#[derive(Debug)]
pub struct AvroDecoder {
    schema: SchemaRef,
    format: AvroFormat,
    plans: Plans<Plan>,
}

impl AvroDecoder {
    /// A decoder into `schema`; without columns, they are the writer
    /// schema's (`'avro.schema'` or the registry's latest).
    pub fn new(schema: SchemaRef, format: AvroFormat) -> Result<Self> {
        let schema = if schema.fields().is_empty() {
            let writer = format.latest_schema()?;
            Arc::new(columns_of(&writer).map_err(|why| {
                ConnectorError::Config(format!("the table's columns from its Avro schema: {why}"))
            })?)
        } else {
            schema
        };
        Ok(AvroDecoder {
            schema,
            format,
            plans: Plans::default(),
        })
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    pub(crate) fn registry_problem(&self) -> Option<String> {
        self.format.registry_problem()
    }

    pub fn builder(&self) -> AvroBuilder<'_> {
        AvroBuilder {
            decoder: self,
            rows: AvroRows::default(),
        }
    }

    /// How records of writer schema `id` are read, or why they cannot be.
    fn plan(&self, id: u32) -> Arc<std::result::Result<Plan, String>> {
        self.plans.get(id, &self.format, &self.schema, Plan::new)
    }
}

/// Decodes Avro records one at a time into one batch.
pub struct AvroBuilder<'d> {
    decoder: &'d AvroDecoder,
    rows: AvroRows<Plan>,
}

impl AvroBuilder<'_> {
    pub(crate) fn push(&mut self, record: &[u8]) -> std::result::Result<(), String> {
        let d = self.decoder;
        let (id, body) = match d.format.confluent {
            true => confluent_header(record)?,
            false => (0, record),
        };
        let plan = match self.rows.active_plan(id) {
            Some(p) => p,
            None => {
                let p = d.plan(id);
                match p.as_ref() {
                    Ok(_) => p,
                    Err(why) => return Err(why.clone()),
                }
            }
        };
        self.rows
            .push(plan, body, |plan, batch| conform(plan, &d.schema, batch))
    }

    pub(crate) fn finish(self) -> Result<RecordBatch> {
        let d = self.decoder;
        let batches = self
            .rows
            .finish(|plan, batch| conform(plan, &d.schema, batch))?;
        Ok(concat_batches(&d.schema, &batches)?)
    }
}

/// A decoded batch as the table's columns.
fn conform(plan: &Plan, schema: &SchemaRef, decoded: RecordBatch) -> Result<RecordBatch> {
    let rows = decoded.num_rows();
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .zip(&plan.columns)
        .map(|(field, c)| match c {
            Some((k, conversion)) => apply(conversion, decoded.column(*k)),
            None => Ok(nulls(field, rows)),
        })
        .collect::<Result<_>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// A resolution an [`AvroRows`] decodes with.
pub(crate) trait Resolved {
    /// The writer schema's id.
    fn id(&self) -> u32;
    /// A fresh arrow-avro decoder.
    fn decoder(&self) -> std::result::Result<Decoder, String>;
}

impl Resolved for Plan {
    fn id(&self) -> u32 {
        self.id
    }
    fn decoder(&self) -> std::result::Result<Decoder, String> {
        Plan::decoder(self)
    }
}

/// Record bodies into arrow-avro decoders, one per run of records with the
/// same writer schema, with the per-record rejection arrow-avro does not
/// have: a record that fails leaves the decoder's columns half-filled, so
/// the decoder is rebuilt and the records of its batch decoded again (their
/// bodies are kept until the batch is flushed).
pub(crate) struct AvroRows<R> {
    active: Option<Active<R>>,
    done: Vec<RecordBatch>,
}

struct Active<R> {
    plan: Arc<std::result::Result<R, String>>,
    decoder: Decoder,
    bodies: Vec<u8>,
    ends: Vec<usize>,
}

impl<R> Default for AvroRows<R> {
    fn default() -> Self {
        AvroRows {
            active: None,
            done: vec![],
        }
    }
}

impl<R: Resolved> AvroRows<R> {
    /// The plan in use, if its id is `id`.
    pub(crate) fn active_plan(&self, id: u32) -> Option<Arc<std::result::Result<R, String>>> {
        self.active
            .as_ref()
            .filter(|a| a.plan.as_ref().as_ref().is_ok_and(|p| p.id() == id))
            .map(|a| a.plan.clone())
    }

    /// Decode one record body of `plan`'s writer schema (an `Ok` plan);
    /// batches that are done go through `output`.
    pub(crate) fn push(
        &mut self,
        plan: Arc<std::result::Result<R, String>>,
        body: &[u8],
        output: impl Fn(&R, RecordBatch) -> Result<RecordBatch>,
    ) -> std::result::Result<(), String> {
        let resolved = plan.as_ref().as_ref().map_err(Clone::clone)?;
        let id = resolved.id();
        let same = self
            .active
            .as_ref()
            .is_some_and(|a| Arc::ptr_eq(&a.plan, &plan));
        if !same
            || self
                .active
                .as_ref()
                .is_some_and(|a| a.decoder.batch_is_full())
        {
            self.flush(&output).map_err(|e| e.to_string())?;
        }
        if self.active.is_none() {
            self.active = Some(Active {
                decoder: resolved.decoder()?,
                plan: plan.clone(),
                bodies: vec![],
                ends: vec![],
            });
        }
        let active = self.active.as_mut().expect("set above");
        match feed(&mut active.decoder, id, body) {
            Ok(()) => {
                active.bodies.extend_from_slice(body);
                active.ends.push(active.bodies.len());
                Ok(())
            }
            Err(why) => {
                // Start the batch again without the record.
                active.decoder = resolved.decoder()?;
                let mut start = 0;
                for &end in &active.ends {
                    feed(&mut active.decoder, id, &active.bodies[start..end])
                        .map_err(|e| format!("decoding a record again failed: {e}"))?;
                    start = end;
                }
                Err(format!("undecodable Avro (writer schema id {id}): {why}"))
            }
        }
    }

    /// Move the decoded rows of the active decoder to the done batches.
    fn flush(&mut self, output: &impl Fn(&R, RecordBatch) -> Result<RecordBatch>) -> Result<()> {
        if let Some(mut a) = self.active.take() {
            let decoded = a
                .decoder
                .flush()
                .map_err(|e| ConnectorError::Decode(format!("avro: {e}")))?;
            if let (Some(batch), Ok(plan)) = (decoded, a.plan.as_ref()) {
                self.done.push(output(plan, batch)?);
            }
        }
        Ok(())
    }

    /// Every batch decoded.
    pub(crate) fn finish(
        mut self,
        output: impl Fn(&R, RecordBatch) -> Result<RecordBatch>,
    ) -> Result<Vec<RecordBatch>> {
        self.flush(&output)?;
        Ok(self.done)
    }
}

/// One record body into `decoder`: exactly one row from exactly its bytes.
pub(crate) fn feed(decoder: &mut Decoder, id: u32, body: &[u8]) -> std::result::Result<(), String> {
    let room = decoder.capacity();
    let prefix = confluent_prefix(id);
    let n = decoder.decode(&prefix).map_err(|e| e.to_string())?;
    if n != prefix.len() {
        return Err("the decoder did not take the record".into());
    }
    let n = decoder.decode(body).map_err(|e| e.to_string())?;
    if n != body.len() || decoder.capacity() + 1 != room {
        return Err(format!(
            "the record's {} bytes do not hold one record of the schema (truncated, or \
             bytes left over)",
            body.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
