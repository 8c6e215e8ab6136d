//! Random and mutated payloads never panic a function: every one is an
//! `Ok` or an `Err` that says what was wrong.
//!
//! Most cases go straight to the IPC decoder (`ipc_decode::decode_stream`)
//! with mutated Arrow streams; some go through `Payload::decode_batches`
//! with each encoding, and some through the whole handler of a deployed
//! in-process function (envelope mutations included). The case count is
//! `SKEIN_FUZZ_CASES` (default 1,000,000, what `scripts/test.sh` runs); a
//! longer run sets it higher. Each run takes a fresh seed, printed first
//! (`SKEIN_FUZZ_SEED` replays one); a case that panics is saved under
//! `engine/tests/fuzz_regressions/` (`<seed>-<case>.<ipc|none|zstd|lz4>`),
//! and every run replays what is saved there before its new cases:
//!
//! ```sh
//! SKEIN_FUZZ_CASES=50000000 cargo test -p skein-engine --release \
//!     --test hostile_payloads -- --nocapture
//! ```

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use datafusion::arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use object_store::memory::InMemory;
use serde_json::{Value, json};
use skein_engine::catalog::Catalog;
use skein_engine::context::function_name;
use skein_engine::driver::run_local;
use skein_engine::exec::SourceTable;
use skein_engine::invoke::{InvocationType, Invoker};
use skein_engine::ipc_decode::decode_stream;
use skein_engine::local::LocalRuntime;
use skein_engine::payload::{Encoding, Fragment, Payload, PayloadId, encode_data, ipc_bytes};
use skein_engine::planner::{PlanOptions, plan_query, session};
use skein_engine::sink::CollectSinkFactory;
use skein_engine::source::{MemorySource, MemorySourceFactory, SourceConfig};

/// xorshift64: cheap and reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn bid_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("channel", DataType::Utf8, true),
        Field::new(
            "date_time",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
    ]))
}

fn bids(rows: i64) -> RecordBatch {
    RecordBatch::try_new(
        bid_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(1000..1000 + rows)),
            Arc::new(StringArray::from_iter((0..rows).map(|i| {
                (i % 3 != 0).then(|| ["apple", "baidu"][i as usize % 2])
            }))),
            Arc::new(TimestampMillisecondArray::from_iter_values(
                (0..rows).map(|i| 1_700_000_000_000 + 10 * i),
            )),
        ],
    )
    .unwrap()
}

/// Bytes worth writing over a length or offset.
const INTERESTING: [u8; 6] = [0x00, 0xFF, 0x7F, 0x80, 0x01, 0xFE];

/// One cheap mutation of `bytes`: bit flips, interesting bytes, a cut, a
/// repeated or removed range, or random bytes.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    if bytes.is_empty() {
        bytes.push(rng.next() as u8);
        return;
    }
    let at = rng.below(bytes.len());
    match rng.below(8) {
        0..=2 => {
            for _ in 0..=rng.below(4) {
                let i = rng.below(bytes.len());
                bytes[i] ^= 1 << rng.below(8);
            }
        }
        3 => bytes[at] = INTERESTING[rng.below(INTERESTING.len())],
        4 => {
            // A whole little-endian word: lengths and offsets are 4 or 8 bytes.
            let word = [0xFF, 0xFF, 0xFF, 0x7F];
            for (k, b) in word.iter().enumerate() {
                if let Some(x) = bytes.get_mut(at + k) {
                    *x = *b;
                }
            }
        }
        5 => bytes.truncate(at),
        6 => {
            let end = (at + 1 + rng.below(16)).min(bytes.len());
            let piece = bytes[at..end].to_vec();
            if rng.below(2) == 0 {
                bytes.splice(at..at, piece);
            } else {
                bytes.drain(at..end);
            }
        }
        _ => {
            for _ in 0..=rng.below(8) {
                let i = rng.below(bytes.len());
                bytes[i] = rng.next() as u8;
            }
        }
    }
}

fn payload(data: String, encoding: Encoding) -> Payload {
    Payload {
        uuid: PayloadId {
            qid: "q".into(),
            seq_num: 0,
            seq_len: 1,
        },
        fragment: Fragment::default(),
        epoch: 0,
        shuffle_id: 1,
        encoding,
        watermark: Some(i64::MIN),
        idle: false,
        last: false,
        checkpoint: false,
        offsets: vec![],
        data,
    }
}

/// Decoder cases on one thread; returns how many decoded without error.
fn decoder_cases(seed: u64, cases: usize) -> usize {
    let schema = bid_schema();
    let seeds: Vec<Vec<u8>> = [1, 4, 0]
        .into_iter()
        .map(|rows| {
            let b = bids(rows);
            ipc_bytes(&schema, &[b.clone(), b.slice(1.min(b.num_rows()), 0)]).unwrap()
        })
        .collect();
    // Compressed once: cases mutate copies.
    let zstd_frame = zstd::bulk::compress(&seeds[1], 1).unwrap();
    let lz4_frame = lz4_flex::block::compress_prepend_size(&seeds[1]);
    let mut rng = Rng(seed | 1);
    let mut ok = 0;
    for case in 0..cases {
        let mut bytes = seeds[case % seeds.len()].clone();
        let rounds = 1 + rng.below(3);
        for _ in 0..rounds {
            mutate(&mut rng, &mut bytes);
        }
        // One in ten goes through the envelope and a compression frame.
        let result = if case % 10 == 0 {
            let encoding = [Encoding::None, Encoding::Zstd, Encoding::Lz4][case / 10 % 3];
            let data = match encoding {
                Encoding::None => B64.encode(&bytes),
                Encoding::Zstd => {
                    let mut frame = zstd_frame.clone();
                    mutate(&mut rng, &mut frame);
                    B64.encode(&frame)
                }
                Encoding::Lz4 => {
                    let mut frame = lz4_frame.clone();
                    mutate(&mut rng, &mut frame);
                    B64.encode(&frame)
                }
            };
            // What a saved case replays: the data before base64.
            bytes = B64.decode(&data).expect("just encoded");
            let p = payload(data, encoding);
            catch_unwind(AssertUnwindSafe(|| p.decode_batches("fuzz-00-00", &schema)))
                .map(|r| r.map(|_| ()).map_err(|e| e.to_string()))
        } else {
            catch_unwind(AssertUnwindSafe(|| {
                decode_stream(&bytes, &schema).map(|_| ())
            }))
        };
        let saved = |what: &str| {
            let ext = match (case % 10 == 0).then_some(case / 10 % 3) {
                None => "ipc",
                Some(0) => "none",
                Some(1) => "zstd",
                Some(_) => "lz4",
            };
            save_regression(&format!("{seed}-{case}.{ext}"), &bytes, what)
        };
        match result {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) if e.contains("panicked") => {
                panic!("case {case} (seed {seed}): {e}; {}", saved("an error"))
            }
            Ok(Err(_)) => {}
            Err(_) => panic!(
                "case {case} (seed {seed}) panicked the decoder on {} bytes; {}",
                bytes.len(),
                saved("a panic")
            ),
        }
    }
    ok
}

/// Where cases that once failed are kept; each is replayed by every run.
fn regressions_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions")
}

/// Keeps a failing case as a regression case; says where, for the panic.
fn save_regression(name: &str, data: &[u8], what: &str) -> String {
    let dir = regressions_dir();
    let path = dir.join(name);
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, data)) {
        Ok(()) => format!(
            "{what} saved as {} (commit it: every run replays it)",
            path.display()
        ),
        Err(e) => format!("{what} not saved ({e}): {} bytes {data:02x?}", data.len()),
    }
}

/// Replays every saved regression case: none may panic. Returns how many.
fn replay_regressions() -> usize {
    let schema = bid_schema();
    let Ok(entries) = std::fs::read_dir(regressions_dir()) else {
        return 0;
    };
    let mut n = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(ext) = path.extension().and_then(|e| e.to_str()) else {
            continue;
        };
        let encoding = match ext {
            "ipc" => None,
            "none" => Some(Encoding::None),
            "zstd" => Some(Encoding::Zstd),
            "lz4" => Some(Encoding::Lz4),
            _ => continue,
        };
        let bytes = std::fs::read(&path).expect("a saved case");
        let result = catch_unwind(AssertUnwindSafe(|| match encoding {
            None => decode_stream(&bytes, &schema)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Some(enc) => payload(B64.encode(&bytes), enc)
                .decode_batches("fuzz-00-00", &schema)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }));
        assert!(
            result.is_ok_and(|r| r.err().is_none_or(|e| !e.contains("panicked"))),
            "saved case {} panics again",
            path.display()
        );
        n += 1;
    }
    n
}

/// Cases through a deployed function's whole handler; returns the count.
async fn handler_cases(seed: u64, cases: usize) -> usize {
    let memory = Arc::new(MemorySourceFactory::default());
    let b = bids(40);
    memory.insert(
        "bid",
        MemorySource::new(
            bid_schema(),
            vec![vec![b.slice(0, 20)], vec![b.slice(20, 20)]],
        ),
    );
    let mut catalog = Catalog::default();
    catalog.register_source("MEMORY", memory);
    catalog.register_sink("COLLECT", Arc::new(CollectSinkFactory::default()));
    let ctx = session(&catalog, 2);
    let config = SourceConfig {
        kind: "MEMORY".into(),
        location: "bid".into(),
        options: Default::default(),
    };
    let source = catalog.create_source(&config, bid_schema()).unwrap();
    ctx.register_table("bid", Arc::new(SourceTable::new("bid", config, source)))
        .unwrap();
    let runtime = LocalRuntime::new(catalog, Arc::new(InMemory::new()));
    let options = PlanOptions {
        group_size: 2,
        ..Default::default()
    };
    let sql = "SELECT auction, max(date_time) AS m FROM bid GROUP BY auction";
    let plan = plan_query(&ctx, sql, &options).await.unwrap();
    run_local(&plan, &runtime, &options, 2, |_, _| {})
        .await
        .unwrap();
    let upstream = plan.stages.iter().find(|s| s.consumer.is_some()).unwrap();
    let group = plan
        .stages
        .iter()
        .find(|s| Some(s.id) == upstream.consumer)
        .unwrap();
    let member = function_name(&plan.query_code, group.id, 1);
    // The edge carries (auction, partial max of date_time).
    let edge_schema = Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("m", DataType::Timestamp(TimeUnit::Millisecond, None), true),
    ]));
    let edge_batch = RecordBatch::try_new(
        edge_schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![1000, 1001, 1002])),
            Arc::new(TimestampMillisecondArray::from(vec![
                Some(1),
                None,
                Some(3),
            ])),
        ],
    )
    .unwrap();
    let ipc = ipc_bytes(&edge_schema, std::slice::from_ref(&edge_batch)).unwrap();
    // Epoch 1 already ran: a valid payload decodes, then is a duplicate.
    let valid = json!({
        "uuid": {"qid": plan.query_code, "seq_num": 0, "seq_len": upstream.members},
        "fragment": {"index": 0, "count": 1},
        "epoch": 1, "shuffle_id": upstream.id, "encoding": "zstd",
        "watermark": i64::MIN, "idle": false, "last": false,
        "data": encode_data(Encoding::Zstd, &edge_schema, &[edge_batch]).unwrap(),
    });
    let answer = runtime
        .invoke(
            &member,
            valid.to_string().into_bytes(),
            InvocationType::Sync,
        )
        .await
        .unwrap_or_else(|e| panic!("the valid payload is refused: {e}"));
    assert!(String::from_utf8_lossy(&answer).contains("duplicate"));

    let fields = [
        ("/uuid/seq_num", 0u64),
        ("/uuid/seq_len", 1),
        ("/fragment/index", 2),
        ("/fragment/count", 3),
        ("/epoch", 4),
        ("/shuffle_id", 5),
        ("/watermark", 6),
    ];
    let numbers = [
        json!(0),
        json!(1),
        json!(2),
        json!(u32::MAX),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(-1),
        json!("7"),
        json!(null),
        json!(1.5),
    ];
    let mut rng = Rng(seed | 1);
    let mut refused = 0;
    for case in 0..cases {
        let bytes = match case % 4 {
            // An envelope field set to an edge value.
            0 => {
                let mut v = valid.clone();
                let (path, _) = fields[rng.below(fields.len())];
                *v.pointer_mut(path).unwrap() = numbers[rng.below(numbers.len())].clone();
                if rng.below(4) == 0 {
                    v["uuid"]["qid"] = json!(["q0000000000", "", "../x"][rng.below(3)]);
                }
                v.to_string().into_bytes()
            }
            // The Arrow data mutated, the envelope valid.
            1 | 2 => {
                let mut raw = ipc.clone();
                mutate(&mut rng, &mut raw);
                let mut v = valid.clone();
                v["encoding"] = json!("none");
                v["data"] = Value::String(B64.encode(raw));
                v.to_string().into_bytes()
            }
            // The JSON text itself mutated.
            _ => {
                let mut text = valid.to_string().into_bytes();
                mutate(&mut rng, &mut text);
                text
            }
        };
        match runtime.invoke(&member, bytes, InvocationType::Sync).await {
            Ok(_) => {}
            Err(e) => {
                let e = e.to_string();
                assert!(!e.contains("panicked"), "handler case {case}: {e}");
                refused += 1;
            }
        }
    }
    // Still serving.
    runtime
        .invoke(
            &member,
            valid.to_string().into_bytes(),
            InvocationType::Sync,
        )
        .await
        .unwrap();
    refused
}

/// A seed no earlier run is likely to have used: the clock and the process.
fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

fn cases_from_env(default: usize) -> usize {
    std::env::var("SKEIN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

async fn run(total: usize) {
    let started = Instant::now();
    // 1 % through the whole handler, the rest straight at the decoder, on
    // two threads.
    let handler = (total / 100).max(1);
    let decoder = total - handler;
    let threads = 2;
    // A new seed each run, so CI keeps trying new cases; a failure names
    // its seed, and SKEIN_FUZZ_SEED replays it.
    let seed = std::env::var("SKEIN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(fresh_seed);
    eprintln!("hostile payloads: seed {seed} (replay with SKEIN_FUZZ_SEED={seed})");
    let replayed = replay_regressions();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let n = decoder / threads + usize::from(t < decoder % threads);
            std::thread::spawn(move || decoder_cases(seed.wrapping_add(t as u64 * 7919), n))
        })
        .collect();
    let refused = handler_cases(seed, handler).await;
    let decoded: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    eprintln!(
        "hostile payloads: seed {seed}: {total} cases ({decoder} at the decoder, {decoded} of \
         them decoded; {handler} through the handler, {refused} refused) and {replayed} saved \
         regression cases in {:.1} s, no panic",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_payloads_never_panic() {
    run(cases_from_env(1_000_000)).await;
}
