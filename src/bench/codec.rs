//! `skein bench codec`: the payload codec (encode and decode MB/s, bytes on
//! the wire per NEXMark bid, against JSON records and uncompressed Arrow
//! IPC), the source records decoded per format (`formats.rs`) and the
//! invocations per second of the in-process runtime; medians of repeated
//! runs.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use datafusion::arrow::record_batch::RecordBatch;
use object_store::memory::InMemory;
use serde_json::json;
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::payload::{
    Encoding, Payload, PayloadHeader, SYNC_PAYLOAD_LIMIT, encode_payloads, ipc_bytes,
};
use skein_engine::planner::{PlanOptions, plan_query, session};
use skein_generators::nexmark::{EventRef, JsonLayout, NexmarkConfig, NexmarkGenerator};

use super::measure::median;
use crate::registry::registries;

#[derive(Args, Debug)]
pub struct CodecArgs {
    /// NEXMark events to draw bids from.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    events: u64,
    /// Repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 7, value_parser = crate::positive)]
    repeat: usize,
    /// Epochs of the runtime benchmark (each is one round of invocations).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    epochs: u64,
    #[arg(long)]
    json: bool,
}

/// Bids as Arrow batches and as the JSON records a publisher would send.
fn bids(events: u64) -> Result<(Vec<RecordBatch>, usize)> {
    let config = NexmarkConfig {
        max_events: Some(events),
        ..Default::default()
    };
    let mut generator = NexmarkGenerator::new(config.clone())?;
    let mut batches = vec![];
    while let Some(b) = generator.next_batches(8192)? {
        batches.push(b.bid);
    }
    let mut generator = NexmarkGenerator::new(config)?;
    let mut json_bytes = 0;
    let mut buf = Vec::with_capacity(256);
    while let Some(ev) = generator.next_event() {
        if let EventRef::Bid(_) = ev {
            buf.clear();
            ev.write_json(JsonLayout::Flat, &mut buf);
            json_bytes += buf.len() + 1; // newline-delimited
        }
    }
    Ok((batches, json_bytes))
}

pub async fn codec(args: CodecArgs) -> Result<()> {
    let (batches, json_bytes) = bids(args.events).context("generating bids")?;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    // A handful of events may hold no bid, and the figures are per bid.
    let schema = match batches.first() {
        Some(b) if rows > 0 => b.schema(),
        _ => anyhow::bail!(
            "--events {}: no bids among them; give more events",
            args.events
        ),
    };
    let raw_ipc = ipc_bytes(&schema, &batches)?.len();
    let header = |encoding| PayloadHeader {
        qid: "bench".into(),
        seq_num: 0,
        seq_len: 1,
        epoch: 0,
        shuffle_id: 1,
        encoding,
        watermark: None,
        idle: false,
        last: false,
        checkpoint: false,
        offsets: vec![],
    };
    let mut encodings = vec![];
    for encoding in [Encoding::Zstd, Encoding::Lz4, Encoding::None] {
        let mut enc_s = vec![];
        let mut dec_s = vec![];
        let mut wire = 0;
        let mut payloads = 0;
        for _ in 0..args.repeat {
            let t = Instant::now();
            let ps = encode_payloads(&header(encoding), &schema, &batches, SYNC_PAYLOAD_LIMIT)?;
            let jsons: Vec<Vec<u8>> = ps.iter().map(Payload::to_json).collect();
            enc_s.push(t.elapsed().as_secs_f64());
            wire = jsons.iter().map(Vec::len).sum::<usize>();
            payloads = jsons.len();
            let t = Instant::now();
            let mut back = 0;
            for j in &jsons {
                let p = Payload::from_json(j)?;
                back += p
                    .decode_batches("bench", &schema)?
                    .iter()
                    .map(|b| b.num_rows())
                    .sum::<usize>();
            }
            dec_s.push(t.elapsed().as_secs_f64());
            anyhow::ensure!(back == rows, "decoded {back} rows of {rows}");
        }
        let mb = raw_ipc as f64 / 1e6;
        encodings.push(json!({
            "encoding": format!("{encoding:?}").to_lowercase(),
            "encode_mb_per_s": (mb / median(enc_s)).round(),
            "decode_mb_per_s": (mb / median(dec_s)).round(),
            "wire_bytes": wire,
            "payloads": payloads,
            "bytes_per_bid": (wire as f64 / rows as f64 * 100.0).round() / 100.0,
        }));
    }
    let records = super::formats::record_formats(&batches, args.repeat)
        .context("decoding records of each format")?;
    let (invocations_per_s, measured) = runtime_rate(args.epochs).await?;
    let cost = crate::cost::report::section(&measured, None, &Default::default())?;
    let report = json!({
        "bids": rows,
        "json_bytes_per_bid": (json_bytes as f64 / rows as f64 * 100.0).round() / 100.0,
        "arrow_ipc_bytes_per_bid": (raw_ipc as f64 / rows as f64 * 100.0).round() / 100.0,
        "encodings": encodings,
        // Source records decoded into Arrow on one thread, per format.
        "record_formats": records,
        "runtime_invocations_per_s": invocations_per_s.round(),
        // The runtime benchmark's query priced per million events.
        "cost": crate::cost::report::to_json(&cost),
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{rows} NEXMark bids; throughput relative to uncompressed Arrow IPC bytes; medians of {}",
            args.repeat
        );
        println!(
            "{:<8} {:>12} {:>12} {:>14} {:>9}",
            "encoding", "encode MB/s", "decode MB/s", "bytes per bid", "payloads"
        );
        for e in report["encodings"].as_array().expect("array") {
            println!(
                "{:<8} {:>12} {:>12} {:>14} {:>9}",
                e["encoding"].as_str().unwrap_or(""),
                e["encode_mb_per_s"],
                e["decode_mb_per_s"],
                e["bytes_per_bid"],
                e["payloads"]
            );
        }
        println!(
            "baseline: JSON records {} bytes per bid, Arrow IPC uncompressed {} bytes per bid",
            report["json_bytes_per_bid"], report["arrow_ipc_bytes_per_bid"]
        );
        println!(
            "\nsource records decoded into Arrow, one thread, medians of {}",
            args.repeat
        );
        println!(
            "{:<15} {:>14} {:>17} {:>8}",
            "format", "records/s", "bytes per record", "vs JSON"
        );
        for f in report["record_formats"].as_array().expect("array") {
            println!(
                "{:<15} {:>14} {:>17} {:>8}",
                f["format"].as_str().unwrap_or(""),
                f["records_per_s"],
                f["bytes_per_record"],
                f["vs_json"]
            );
        }
        println!(
            "in-process runtime: {} invocations/s",
            report["runtime_invocations_per_s"]
        );
        println!("its query's {}", crate::cost::report::one_line(&cost));
    }
    Ok(())
}

/// Invocations per second of the in-process runtime on a two-stage query
/// with tiny epochs, so per-invocation cost dominates; and what the run
/// measured, for its cost.
async fn runtime_rate(epochs: u64) -> Result<(f64, skein_cost::Measured)> {
    let regs = registries();
    let ctx = session(&regs.catalog, 4);
    let sql = format!(
        "{}\nSELECT auction, count(*) AS n FROM bid GROUP BY auction",
        skein_generators::table::nexmark_ddl(epochs * 100, 10_000, 2)
    );
    let options = PlanOptions {
        group_size: 4,
        ..Default::default()
    };
    let plan = plan_query(&ctx, &sql, &options).await?;
    let runtime = LocalRuntime::new(regs.catalog, Arc::new(InMemory::new()));
    let cpu_before = crate::cost::report::process_cpu_s();
    let report = run_local(&plan, &runtime, &options, epochs, |_, _| {}).await?;
    let measured = crate::cost::report::measured(&report, crate::cost::report::process_cpu_s() - cpu_before);
    Ok((report.invocations as f64 / report.elapsed_s, measured))
}

