//! `skein bench codec`, record formats: the same NEXMark bids as JSON,
//! Avro (plain and in the Confluent wire format) and Protobuf records,
//! decoded into Arrow by the sources' decoder on one thread; records/s and
//! the ratio to JSON, measured in the same run. Pin it to one core for a
//! per-core figure: `taskset -c 0 skein bench codec`.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result};
use datafusion::arrow::record_batch::RecordBatch;
use serde_json::json;
use skein_formats::Format;
use skein_formats::avro::encode::schema_for;
use skein_formats::decode::RecordDecoder;
use skein_formats::protobuf::descriptor_set_for;
use skein_sinks::encode::RowEncoder;

use super::measure::median;

/// One format's decoding figures.
pub(crate) fn record_formats(batches: &[RecordBatch], repeat: usize) -> Result<serde_json::Value> {
    let schema = batches.first().context("no bids")?.schema();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let descriptor =
        std::env::temp_dir().join(format!("skein-bench-bid-{}.desc", std::process::id()));
    std::fs::write(&descriptor, descriptor_set_for(&schema, "Bid")?)?;
    let avro_schema = schema_for(&schema)?;
    let options = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let path = descriptor.display().to_string();
    let formats = [
        ("json", options(&[("format", "json")])),
        (
            "avro",
            options(&[("format", "avro"), ("avro.schema", &avro_schema)]),
        ),
        (
            "avro-confluent",
            options(&[("format", "avro-confluent"), ("avro.schema", &avro_schema)]),
        ),
        (
            "protobuf",
            options(&[
                ("format", "protobuf"),
                ("protobuf.descriptor", &path),
                ("protobuf.message", "skein.Bid"),
            ]),
        ),
    ];
    let mut out = vec![];
    let mut json_rate = None;
    for (name, opts) in formats {
        // The Confluent framing is the plain record behind a 5-byte header
        // (no registry here: the schema is inline, the id read and kept).
        let written = match name {
            "avro-confluent" => options(&[("format", "avro"), ("avro.schema", &avro_schema)]),
            _ => opts.clone(),
        };
        let encoder = RowEncoder::from_options(&written, "bench")?;
        let mut records: Vec<Vec<u8>> = Vec::with_capacity(rows);
        for b in batches {
            records.extend(encoder.encode(b)?.into_iter().map(|r| r.value));
        }
        if name == "avro-confluent" {
            for r in &mut records {
                r.splice(0..0, [0, 0, 0, 0, 1]);
            }
        }
        let bytes: usize = records.iter().map(Vec::len).sum();
        let decoder = RecordDecoder::new(
            schema.clone(),
            Format::from_options(&opts, "bench")?,
            1 << 20,
        )?;
        let mut secs = vec![];
        for _ in 0..repeat {
            let t = Instant::now();
            let (batch, rejected) = decoder.decode(records.iter().map(Vec::as_slice))?;
            secs.push(t.elapsed().as_secs_f64());
            anyhow::ensure!(
                batch.num_rows() == rows && rejected.is_empty(),
                "{name}: decoded {} of {rows} bids ({:?})",
                batch.num_rows(),
                rejected.first()
            );
        }
        let rate = rows as f64 / median(secs);
        let baseline = *json_rate.get_or_insert(rate);
        out.push(json!({
            "format": name,
            "records_per_s": rate.round() as u64,
            "bytes_per_record": (bytes as f64 / rows as f64 * 100.0).round() / 100.0,
            "vs_json": (rate / baseline * 100.0).round() / 100.0,
        }));
    }
    let _ = std::fs::remove_file(&descriptor);
    Ok(json!(out))
}
