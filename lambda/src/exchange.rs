//! The exchange comparison of the Flock paper's Table 2, run between two
//! deployed functions: how long moving N bytes from one function to another
//! takes (a) inside invocation payloads, synchronously (`RequestResponse`)
//! or asynchronously (`Event`), split into fragments by the engine's codec
//! when over the invocation limit, and (b) through the object store (S3):
//! the sender puts an object, the receiver is told its key and gets it.
//!
//! The sender times everything from inside its own instance, so the
//! command's own call to the sender is not counted:
//!
//! * `sync`: from before encoding to the last fragment's response (the
//!   receiver decodes each fragment before it answers);
//! * `async`: from before encoding to the moment the receiver has decoded
//!   the last fragment. An `Event` invoke returns before the receiver runs,
//!   so the receiver stamps the wall-clock time it finished each fragment in
//!   a small acknowledgement object (written after the stamp, so the write
//!   is not counted) and the sender waits for all of them. Both functions
//!   read the same clock on ministack; on AWS instances are NTP-synchronised
//!   to about a millisecond;
//! * `s3`: from before serialising the Arrow IPC stream to the receiver's
//!   answer that it has read and decoded the object: put, one synchronous
//!   invoke carrying the key, get. `put_ms` and `get_ms` are reported too.
//!
//! The data is one Arrow column of incompressible bytes (100 per row), so
//! payloads carry what the object carries plus base64's third; requests are
//! `{"exchange": {"send" | "receive" | "fetch": {...}}}` (see
//! [`ExchangeRequest`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use datafusion::arrow::array::BinaryArray;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use skein_engine::EngineError;
use skein_engine::invoke::{InvocationType, Invoker, invoke_with_retry};
use skein_engine::payload::{
    ASYNC_PAYLOAD_LIMIT, Encoding, Payload, PayloadHeader, SYNC_PAYLOAD_LIMIT, encode_payloads,
    ipc_bytes,
};

/// The top-level key of an exchange request.
pub const REQUEST_KEY: &str = skein_engine::request::EXCHANGE_KEY;
/// Where objects and acknowledgements of the benchmark go in the store.
pub const PREFIX: &str = "skein/bench/exchange";
/// Bytes of one row of the moved data.
pub const ROW_BYTES: usize = 100;
/// Most bytes one exchange moves: the sender builds them in memory.
pub const MAX_BYTES: usize = 256 * 1024 * 1024;
/// How long the sender waits for the acknowledgements of async fragments.
const ACK_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("arrow: {0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    #[error("bad exchange message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Failed(String),
}

pub type Result<T, E = ExchangeError> = std::result::Result<T, E>;

/// How the data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Payloads, `RequestResponse`, fragments of at most 6 MB.
    Sync,
    /// Payloads, `Event`, fragments of at most 1 MB.
    Async,
    /// An object in the store, its key in one synchronous invoke.
    S3,
}

impl Method {
    pub const ALL: [Method; 3] = [Method::Sync, Method::Async, Method::S3];

    pub fn name(self) -> &'static str {
        match self {
            Method::Sync => "sync",
            Method::Async => "async",
            Method::S3 => "s3",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeRequest {
    /// To the sender: move `bytes` bytes to function `to` by `method`.
    /// `tag` names this exchange's objects in the store (unique per call).
    Send {
        bytes: usize,
        method: Method,
        to: String,
        tag: String,
    },
    /// To the receiver: one fragment; async fragments carry `ack`, the
    /// prefix under which the receiver records when it decoded them.
    Receive {
        payload: Payload,
        #[serde(default)]
        ack: Option<String>,
    },
    /// To the receiver: read and decode the object at `key`.
    Fetch { key: String },
}

impl ExchangeRequest {
    /// `{"exchange": {...}}`, as the function expects it.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ REQUEST_KEY: self }))
            .expect("exchange request serialises")
    }
}

/// What the sender reports for one exchange.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExchangeReport {
    pub method: Method,
    pub bytes: usize,
    pub rows: usize,
    /// Invocations that carried the data (1 for `s3`: the key).
    pub fragments: usize,
    /// Bytes sent in payloads, or the object's size for `s3`.
    pub wire_bytes: usize,
    /// The whole exchange, milliseconds.
    pub ms: f64,
    #[serde(default)]
    pub put_ms: Option<f64>,
    #[serde(default)]
    pub get_ms: Option<f64>,
}

/// What the receiver answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReceiveReport {
    pub rows: usize,
    #[serde(default)]
    pub get_ms: Option<f64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Ack {
    rows: usize,
    /// Wall-clock time the fragment was decoded, ms since the Unix epoch.
    decoded_at_ms: f64,
}

/// What a function needs to take part.
pub struct ExchangeEnv {
    pub invoker: Arc<dyn Invoker>,
    pub store: Arc<dyn ObjectStore>,
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "blob",
        DataType::Binary,
        false,
    )]))
}

/// `bytes` bytes of incompressible data in rows of [`ROW_BYTES`].
pub fn data(bytes: usize) -> Result<RecordBatch> {
    if bytes > MAX_BYTES {
        return Err(ExchangeError::Failed(format!(
            "{bytes} bytes is above the {MAX_BYTES} an exchange moves"
        )));
    }
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15 ^ bytes as u64;
    let mut raw = vec![0u8; bytes];
    for chunk in raw.chunks_mut(8) {
        // xorshift64*: cheap, and zstd finds nothing to compress in it.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let word = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    let rows: Vec<&[u8]> = raw.chunks(ROW_BYTES).collect();
    Ok(RecordBatch::try_new(
        schema(),
        vec![Arc::new(BinaryArray::from(rows))],
    )?)
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or_default()
}

fn header(tag: &str) -> PayloadHeader {
    PayloadHeader {
        qid: tag.to_string(),
        seq_num: 0,
        seq_len: 1,
        epoch: 0,
        shuffle_id: 0,
        encoding: Encoding::Zstd,
        watermark: None,
        idle: false,
        last: false,
        checkpoint: false,
        offsets: vec![],
    }
}

async fn invoke(
    env: &ExchangeEnv,
    to: &str,
    body: Vec<u8>,
    kind: InvocationType,
) -> Result<Vec<u8>> {
    Ok(invoke_with_retry(
        env.invoker.as_ref(),
        to,
        body,
        kind,
        Duration::from_secs(1),
        50,
    )
    .await?)
}

/// Serve one exchange request (sender or receiver side).
pub async fn handle(request: ExchangeRequest, env: &ExchangeEnv) -> Result<serde_json::Value> {
    Ok(match request {
        ExchangeRequest::Send {
            bytes,
            method,
            to,
            tag,
        } => serde_json::to_value(send(bytes, method, &to, &tag, env).await?)?,
        ExchangeRequest::Receive { payload, ack } => {
            let rows = decode(&payload)?;
            let decoded_at_ms = now_ms();
            if let Some(prefix) = ack {
                let key = Path::from(format!("{prefix}/ack-{:06}.json", payload.fragment.index));
                let body = serde_json::to_vec(&Ack {
                    rows,
                    decoded_at_ms,
                })?;
                env.store.put(&key, body.into()).await?;
            }
            serde_json::to_value(ReceiveReport { rows, get_ms: None })?
        }
        ExchangeRequest::Fetch { key } => {
            let t = Instant::now();
            let bytes = env
                .store
                .get(&Path::from(key.as_str()))
                .await?
                .bytes()
                .await?;
            let get_ms = t.elapsed().as_secs_f64() * 1000.0;
            let rows = skein_engine::ipc_decode::decode_stream(&bytes, &schema())
                .map_err(|e| ExchangeError::Failed(format!("object {key}: {e}")))?
                .iter()
                .map(|b| b.num_rows())
                .sum();
            serde_json::to_value(ReceiveReport {
                rows,
                get_ms: Some(get_ms),
            })?
        }
    })
}

fn decode(payload: &Payload) -> Result<usize> {
    let batches = payload.decode_batches("exchange", &schema())?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

async fn send(
    bytes: usize,
    method: Method,
    to: &str,
    tag: &str,
    env: &ExchangeEnv,
) -> Result<ExchangeReport> {
    let batch = data(bytes)?;
    let rows = batch.num_rows();
    let schema = batch.schema();
    let prefix = format!("{PREFIX}/{tag}");
    let mut report = ExchangeReport {
        method,
        bytes,
        rows,
        fragments: 0,
        wire_bytes: 0,
        ms: 0.0,
        put_ms: None,
        get_ms: None,
    };
    let received = match method {
        Method::Sync | Method::Async => {
            let (kind, limit, ack) = match method {
                Method::Sync => (InvocationType::Sync, SYNC_PAYLOAD_LIMIT, None),
                _ => (
                    InvocationType::Async,
                    ASYNC_PAYLOAD_LIMIT,
                    Some(prefix.clone()),
                ),
            };
            let t0 = Instant::now();
            let t0_wall = now_ms();
            let payloads = encode_payloads(&header(tag), &schema, &[batch], limit)?;
            report.fragments = payloads.len();
            let mut received = 0;
            // One fragment after another, as the engine sends them.
            for payload in payloads {
                let body = ExchangeRequest::Receive {
                    payload,
                    ack: ack.clone(),
                }
                .to_json();
                report.wire_bytes += body.len();
                let answer = invoke(env, to, body, kind).await?;
                if kind == InvocationType::Sync {
                    received += serde_json::from_slice::<ReceiveReport>(&answer)?.rows;
                }
            }
            if kind == InvocationType::Sync {
                report.ms = t0.elapsed().as_secs_f64() * 1000.0;
            } else {
                let acks = wait_for_acks(env, &prefix, report.fragments).await?;
                received = acks.iter().map(|a| a.rows).sum();
                let last = acks.iter().map(|a| a.decoded_at_ms).fold(t0_wall, f64::max);
                report.ms = last - t0_wall;
            }
            received
        }
        Method::S3 => {
            let key = format!("{prefix}/data.arrow");
            let t0 = Instant::now();
            let ipc = ipc_bytes(&schema, &[batch])?;
            report.wire_bytes = ipc.len();
            env.store.put(&Path::from(key.as_str()), ipc.into()).await?;
            report.put_ms = Some(t0.elapsed().as_secs_f64() * 1000.0);
            let answer = invoke(
                env,
                to,
                ExchangeRequest::Fetch { key }.to_json(),
                InvocationType::Sync,
            )
            .await?;
            report.ms = t0.elapsed().as_secs_f64() * 1000.0;
            report.fragments = 1;
            let answer: ReceiveReport = serde_json::from_slice(&answer)?;
            report.get_ms = answer.get_ms;
            answer.rows
        }
    };
    clean(env, &prefix).await?;
    if received != rows {
        return Err(ExchangeError::Failed(format!(
            "{} exchange of {bytes} bytes: the receiver decoded {received} of {rows} rows",
            method.name()
        )));
    }
    Ok(report)
}

/// The acknowledgements of `count` async fragments, waiting for them.
async fn wait_for_acks(env: &ExchangeEnv, prefix: &str, count: usize) -> Result<Vec<Ack>> {
    let start = Instant::now();
    let prefix = Path::from(prefix);
    loop {
        let keys: Vec<Path> = env
            .store
            .list(Some(&prefix))
            .map_ok(|m| m.location)
            .try_filter(|k| futures::future::ready(k.as_ref().contains("/ack-")))
            .try_collect()
            .await?;
        if keys.len() >= count {
            let mut acks = Vec::with_capacity(keys.len());
            for k in keys {
                let body = env.store.get(&k).await?.bytes().await?;
                acks.push(serde_json::from_slice(&body)?);
            }
            return Ok(acks);
        }
        if start.elapsed() > ACK_TIMEOUT {
            return Err(ExchangeError::Failed(format!(
                "{} of {count} async fragments acknowledged after {} s",
                keys.len(),
                ACK_TIMEOUT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Remove this exchange's objects (not timed).
async fn clean(env: &ExchangeEnv, prefix: &str) -> Result<()> {
    let keys: Vec<Path> = env
        .store
        .list(Some(&Path::from(prefix)))
        .map_ok(|m| m.location)
        .try_collect()
        .await?;
    for k in keys {
        env.store.delete(&k).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use object_store::memory::InMemory;

    /// Delivers every invoke to the receiver side of `handle`, in-process.
    struct Loopback {
        store: Arc<dyn ObjectStore>,
    }

    #[async_trait]
    impl Invoker for Loopback {
        async fn invoke(
            &self,
            _function: &str,
            payload: Vec<u8>,
            _kind: InvocationType,
        ) -> skein_engine::Result<Vec<u8>> {
            let mut v: serde_json::Value = serde_json::from_slice(&payload).expect("json");
            let req: ExchangeRequest =
                serde_json::from_value(v[REQUEST_KEY].take()).expect("exchange request");
            let env = ExchangeEnv {
                invoker: Arc::new(Loopback {
                    store: self.store.clone(),
                }),
                store: self.store.clone(),
            };
            let answer = handle(req, &env).await.expect("receiver");
            Ok(serde_json::to_vec(&answer).expect("json"))
        }
    }

    #[tokio::test]
    async fn every_method_delivers_every_row() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let env = ExchangeEnv {
            invoker: Arc::new(Loopback {
                store: store.clone(),
            }),
            store: store.clone(),
        };
        // 3 MB: one sync payload, several async fragments (base64 of 3 MB > 1 MB).
        for method in Method::ALL {
            let report = send(
                3_000_000,
                method,
                "b",
                &format!("t-{}", method.name()),
                &env,
            )
            .await
            .unwrap();
            assert_eq!(report.rows, 30_000);
            match method {
                Method::Sync => assert_eq!(report.fragments, 1),
                Method::Async => assert!(report.fragments >= 4, "{report:?}"),
                Method::S3 => assert!(report.get_ms.is_some() && report.put_ms.is_some()),
            }
            assert!(report.wire_bytes >= 3_000_000, "{report:?}");
        }
        // Nothing is left behind.
        let left: Vec<_> = store.list(None).try_collect().await.unwrap();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn data_has_the_asked_size_and_does_not_compress() {
        let b = data(1500).unwrap();
        assert_eq!(b.num_rows(), 15);
        let b = data(1550).unwrap();
        assert_eq!(b.num_rows(), 16);
        let p = encode_payloads(
            &header("t"),
            &schema(),
            &[data(150_000).unwrap()],
            SYNC_PAYLOAD_LIMIT,
        )
        .unwrap();
        assert!(p[0].data.len() > 150_000 * 4 / 3, "{}", p[0].data.len());
    }
}
