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
use crate::confluent::{confluent_header, confluent_prefix};
use crate::rejected::Rejected;
use skein_clients::error::{ConnectorError, Result};

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
    pub(crate) fn push(&mut self, index: usize, record: &[u8]) -> std::result::Result<(), String> {
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
        let skip = record.len() - body.len();
        let output = |plan: &Plan, batch| conform(plan, &d.schema, batch);
        self.rows.push(plan, index, record, skip, &output)
    }

    /// The batch, and the records rejected only when it was built.
    pub(crate) fn finish(self) -> Result<(RecordBatch, Vec<Rejected>)> {
        let d = self.decoder;
        let output = |plan: &Plan, batch| conform(plan, &d.schema, batch);
        let (batches, late) = self.rows.finish(&output);
        Ok((concat_batches(&d.schema, &batches)?, late))
    }
}

/// A decoded batch as the table's columns.
fn conform(plan: &Plan, schema: &SchemaRef, decoded: RecordBatch) -> Result<RecordBatch> {
    let rows = decoded.num_rows();
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .zip(&plan.columns)
        .map(|(field, fill)| fill.column(field, rows, |k| decoded.column(k)))
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

/// Records into arrow-avro decoders, one per run of records with the same
/// writer schema, with the per-record rejection arrow-avro does not have:
/// a record that fails leaves the decoder's columns half-filled, so the
/// decoder is rebuilt and the records of its batch decoded again; and a
/// batch that fails only when it is built (a string that is not UTF-8 is
/// found then) is decoded again record by record, the ones that fail
/// rejected late, with their bytes. So the records of the batch are kept
/// until it is built.
pub(crate) struct AvroRows<R> {
    active: Option<Active<R>>,
    done: Vec<RecordBatch>,
    late: Vec<Rejected>,
}

struct Active<R> {
    plan: Arc<std::result::Result<R, String>>,
    decoder: Decoder,
    /// The records (headers included) of the unbuilt batch, end to end.
    records: Vec<u8>,
    ends: Vec<usize>,
    /// Each record's index among those pushed to the builder.
    indexes: Vec<usize>,
    /// The length of a record's header (the Confluent prefix, or 0).
    skip: usize,
}

impl<R> Active<R> {
    fn record(&self, k: usize) -> &[u8] {
        let start = if k == 0 { 0 } else { self.ends[k - 1] };
        &self.records[start..self.ends[k]]
    }
}

impl<R> Default for AvroRows<R> {
    fn default() -> Self {
        AvroRows {
            active: None,
            done: vec![],
            late: vec![],
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

    /// Decode `record` (the `index`-th pushed), whose Avro body follows a
    /// header of `skip` bytes, with `plan` (an `Ok` plan); batches that are
    /// built go through `output`.
    pub(crate) fn push(
        &mut self,
        plan: Arc<std::result::Result<R, String>>,
        index: usize,
        record: &[u8],
        skip: usize,
        output: &impl Fn(&R, RecordBatch) -> Result<RecordBatch>,
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
            self.flush(output);
        }
        if self.active.is_none() {
            self.active = Some(Active {
                decoder: resolved.decoder()?,
                plan: plan.clone(),
                records: vec![],
                ends: vec![],
                indexes: vec![],
                skip,
            });
        }
        let active = self.active.as_mut().expect("set above");
        match feed(&mut active.decoder, id, &record[skip..]) {
            Ok(()) => {
                active.records.extend_from_slice(record);
                active.ends.push(active.records.len());
                active.indexes.push(index);
                Ok(())
            }
            Err(why) => {
                // Start the batch again without the record.
                let mut decoder = resolved.decoder()?;
                for k in 0..active.ends.len() {
                    let body = &active.record(k)[active.skip..];
                    feed(&mut decoder, id, body)
                        .map_err(|e| format!("decoding a record again failed: {e}"))?;
                }
                active.decoder = decoder;
                Err(format!("undecodable Avro (writer schema id {id}): {why}"))
            }
        }
    }

    /// Build the active decoder's batch into the done ones.
    fn flush(&mut self, output: &impl Fn(&R, RecordBatch) -> Result<RecordBatch>) {
        let Some(mut a) = self.active.take() else {
            return;
        };
        let Ok(plan) = a.plan.as_ref() else { return };
        let built = a.decoder.flush().map_err(|e| e.to_string()).and_then(|b| {
            b.map(|b| output(plan, b).map_err(|e| e.to_string()))
                .transpose()
        });
        match built {
            Ok(batch) => self.done.extend(batch),
            Err(_) => self.salvage(&a, plan, output),
        }
    }

    /// A batch that did not build: each record on its own.
    fn salvage(
        &mut self,
        a: &Active<R>,
        plan: &R,
        output: &impl Fn(&R, RecordBatch) -> Result<RecordBatch>,
    ) {
        for k in 0..a.ends.len() {
            let record = a.record(k);
            let one = plan.decoder().and_then(|mut d| {
                feed(&mut d, plan.id(), &record[a.skip..])?;
                let b = d.flush().map_err(|e| e.to_string())?;
                let b = b.ok_or("no row decoded")?;
                output(plan, b).map_err(|e| e.to_string())
            });
            match one {
                Ok(b) => self.done.push(b),
                Err(why) => self.late.push(Rejected {
                    index: a.indexes[k],
                    reason: format!("undecodable Avro (writer schema id {}): {why}", plan.id()),
                    record: Some(record.to_vec()),
                }),
            }
        }
    }

    /// Every batch built, and the records rejected when their batch was.
    pub(crate) fn finish(
        mut self,
        output: &impl Fn(&R, RecordBatch) -> Result<RecordBatch>,
    ) -> (Vec<RecordBatch>, Vec<Rejected>) {
        self.flush(output);
        (self.done, self.late)
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
