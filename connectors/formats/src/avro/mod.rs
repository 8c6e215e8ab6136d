//! Avro: `'format' 'avro'` (records without framing, one writer schema in
//! `'avro.schema'`) and `'format' 'avro-confluent'` (the Confluent wire
//! format: a zero byte, the writer schema's id, the record; the schema comes
//! from `'schema.registry.url'`).
//!
//! Records are decoded by the Arrow project's arrow-avro. The reader schema
//! is the table's columns, picked from each writer schema by name, so
//! Avro's resolution rules apply per schema id: fields the table does not
//! declare are skipped, a column the writer lacks takes its default (columns
//! taken from the registry's latest schema keep their fields' defaults,
//! `defaults.rs`) or else is null if nullable, and values are promoted to
//! the column's type (`int` to `BIGINT`, `timestamp-millis` to `TIMESTAMP`,
//! an enum to `VARCHAR`). A topic whose schema evolves mid-stream is read
//! on: each id gets its own resolution.
//! A schema the columns cannot be read from (it lacks a NOT NULL column
//! without a default, a type does not convert) makes its records dead
//! letters, with the reason.
//!
//! `decode.rs` is the decoder, `reader.rs` picks the reader schema,
//! `defaults.rs` fills the columns a writer lacks, `encode.rs` writes rows
//! for the sinks.

pub(crate) mod decode;
pub mod defaults;
pub mod encode;
pub(crate) mod reader;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::{Field, SchemaRef};

pub use decode::{AvroBuilder, AvroDecoder};

use crate::options::{inline_or_file, registry_of, value_subject};
use crate::registry::{Registry, SchemaType};
use skein_clients::error::{ConnectorError, Result};

/// A table's Avro options.
#[derive(Debug, Clone)]
pub struct AvroFormat {
    /// The Confluent wire format (else plain records).
    pub confluent: bool,
    /// `'avro.schema'`: the writer schema of plain records, or, for the
    /// Confluent format without a registry, of every record (its id is
    /// read and not looked up).
    pub schema: Option<Arc<str>>,
    /// Where writer schemas are looked up by id.
    pub registry: Option<Arc<Registry>>,
    /// The subject of the table's values (`<topic>-value`).
    pub subject: String,
    /// The topic or stream: the key's subject is `<location>-key`.
    pub location: String,
}

impl AvroFormat {
    pub fn from_options(
        options: &BTreeMap<String, String>,
        location: &str,
        confluent: bool,
    ) -> Result<Self> {
        let schema = options
            .get("avro.schema")
            .map(|v| {
                inline_or_file("avro.schema", v, |v| {
                    v.starts_with('{') || v.starts_with('"') || v.starts_with('[')
                })
            })
            .transpose()?;
        let registry = registry_of(options)?;
        if let Some(s) = &schema {
            serde_json::from_str::<serde_json::Value>(s).map_err(|e| {
                ConnectorError::Config(format!("option avro.schema is not JSON: {e}"))
            })?;
        }
        if !confluent && schema.is_none() {
            return Err(ConnectorError::Config(
                "'format' 'avro' needs 'avro.schema': the writer schema as JSON, or a file \
                 holding it"
                    .into(),
            ));
        }
        if confluent && schema.is_none() && registry.is_none() {
            return Err(ConnectorError::Config(
                "the Confluent wire format needs 'schema.registry.url' (or 'avro.schema', the \
                 writer schema of every record)"
                    .into(),
            ));
        }
        Ok(AvroFormat {
            confluent,
            schema: schema.map(Arc::from),
            registry,
            subject: value_subject(options, location),
            location: location.to_string(),
        })
    }

    /// The writer schema of records carrying `id`, or why there is none.
    pub(crate) fn writer_schema(&self, id: u32) -> std::result::Result<Arc<str>, String> {
        match (&self.registry, &self.schema) {
            (Some(registry), _) if self.confluent => match registry.schema_by_id(id) {
                crate::registry::ById::Found(s) if s.schema_type == SchemaType::Avro => {
                    Ok(Arc::from(s.schema.as_str()))
                }
                // Named by its id in `Plans::get`.
                crate::registry::ById::Found(s) => {
                    Err(format!("a {:?} schema, not Avro", s.schema_type))
                }
                crate::registry::ById::Missing(why) => Err(why),
            },
            (_, Some(schema)) => Ok(schema.clone()),
            _ => Err("no writer schema: set 'avro.schema' or a registry".into()),
        }
    }

    /// The schema a table declared without columns takes its columns from:
    /// `'avro.schema'`, else the subject's latest in the registry.
    pub(crate) fn latest_schema(&self) -> Result<Arc<str>> {
        if let Some(s) = &self.schema {
            return Ok(s.clone());
        }
        let registry = self.registry.as_ref().expect("checked in from_options");
        let latest = registry.latest(&self.subject)?;
        if latest.schema_type != SchemaType::Avro {
            return Err(ConnectorError::Config(format!(
                "the latest schema of subject {} is {:?}, not Avro",
                self.subject, latest.schema_type
            )));
        }
        Ok(Arc::from(latest.schema.as_str()))
    }

    pub(crate) fn registry_problem(&self) -> Option<String> {
        self.registry.as_ref().and_then(|r| r.probe())
    }
}

/// How records of each writer schema id are read (or why they cannot be),
/// resolved once for a decoder's life.
#[derive(Debug)]
pub(crate) struct Plans<P> {
    plans: Mutex<HashMap<u32, Arc<std::result::Result<P, String>>>>,
}

impl<P> Default for Plans<P> {
    fn default() -> Self {
        Plans {
            plans: Mutex::new(HashMap::new()),
        }
    }
}

impl<P> Plans<P> {
    /// The plan of `id`, resolved by `resolve(id, writer schema, columns)`
    /// the first time.
    pub(crate) fn get(
        &self,
        id: u32,
        format: &AvroFormat,
        schema: &SchemaRef,
        resolve: impl FnOnce(u32, &str, &[&Field]) -> std::result::Result<P, String>,
    ) -> Arc<std::result::Result<P, String>> {
        if let Some(p) = self.plans.lock().expect("plans").get(&id) {
            return p.clone();
        }
        // Looked up without the lock: a registry that is down is waited for.
        let columns: Vec<&Field> = schema.fields().iter().map(|f| f.as_ref()).collect();
        let plan = format
            .writer_schema(id)
            .and_then(|writer| resolve(id, &writer, &columns))
            .map_err(|why| match format.confluent {
                true => format!("schema id {id}: {why}"),
                false => why,
            });
        let plan = Arc::new(plan);
        self.plans.lock().expect("plans").insert(id, plan.clone());
        plan
    }
}
