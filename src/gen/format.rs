//! `skein gen --format FORMAT [--option KEY=VALUE ...]`: events published
//! in another record format than their reference JSON. Each chunk of JSON
//! records is decoded into its table's columns and the sink encodes the
//! rows in the format (docs/formats.md): `avro`, `avro-confluent` (with
//! `--option schema.registry.url=...`: the schema is registered under
//! `<topic>-value`), `protobuf` and `protobuf-confluent` (with
//! `--option protobuf.descriptor=FILE --option protobuf.message=NAME`).
//! Plain `avro` writes the table's own schema unless `avro.schema` is given.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use skein_formats::Format;
use skein_formats::avro::encode::schema_for;
use skein_formats::decode::RecordDecoder;
use skein_generators::nexmark::{auction_schema, bid_schema, person_schema};
use skein_generators::ysb::ysb_schema;

use super::args::{Benchmark, GenArgs, NexmarkTable};

/// The record format of a `skein gen` run other than JSON.
#[derive(Debug, Clone)]
pub struct RecordFormat {
    options: BTreeMap<String, String>,
}

impl RecordFormat {
    /// None for JSON (records are sent as they are rendered).
    pub fn of(a: &GenArgs) -> Result<Option<Self>> {
        let mut options = BTreeMap::new();
        for o in &a.options {
            let (k, v) = o
                .split_once('=')
                .with_context(|| format!("--option {o:?}: expected KEY=VALUE"))?;
            options.insert(k.trim().to_string(), v.trim().to_string());
        }
        match a.format.as_str() {
            "json" if options.is_empty() => Ok(None),
            "json" => bail!("--option is for the formats other than json"),
            "avro" | "avro-confluent" | "protobuf" | "protobuf-confluent" => {
                options.insert("format".into(), a.format.clone());
                Ok(Some(RecordFormat { options }))
            }
            other => bail!(
                "--format {other:?}: gen writes json, avro, avro-confluent, protobuf or \
                 protobuf-confluent"
            ),
        }
    }

    /// The sink options of a destination whose rows have `schema`.
    pub fn sink_options(&self, schema: &SchemaRef) -> Result<BTreeMap<String, String>> {
        let mut options = self.options.clone();
        if options["format"] == "avro" && !options.contains_key("avro.schema") {
            options.insert("avro.schema".into(), schema_for(schema)?);
        }
        Ok(options)
    }

    /// The decoder of a destination's JSON records into its table's rows.
    pub fn rows_of(schema: &SchemaRef) -> Result<RecordDecoder> {
        Ok(RecordDecoder::new(schema.clone(), Format::Json, 1 << 20)?)
    }
}

/// The table schema of each destination, in the order of the names.
pub fn table_schemas(a: &GenArgs) -> Vec<SchemaRef> {
    match (a.benchmark, a.table) {
        (Benchmark::Ysb, _) => vec![ysb_schema()],
        (Benchmark::Nexmark, NexmarkTable::All) => {
            vec![person_schema(), auction_schema(), bid_schema()]
        }
        (Benchmark::Nexmark, NexmarkTable::Person) => vec![person_schema()],
        (Benchmark::Nexmark, NexmarkTable::Auction) => vec![auction_schema()],
        (Benchmark::Nexmark, NexmarkTable::Bid) => vec![bid_schema()],
    }
}

/// A chunk of JSON records (one `value` column) as rows of the table.
pub fn transcode(decoder: &RecordDecoder, records: &RecordBatch) -> Result<RecordBatch> {
    use datafusion::arrow::array::AsArray;
    let values = records.column(0).as_binary::<i32>();
    let (batch, rejected) = decoder.decode(values.iter().map(|v| v.unwrap_or_default()))?;
    if let Some(r) = rejected.first() {
        bail!("a generated record did not decode: {}", r.reason);
    }
    Ok(batch)
}
