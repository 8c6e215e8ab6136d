//! Shared helpers of the integration tests: where the real services are, and
//! clients configured for them.
//!
//! Endpoints come from the environment, with the defaults of `scripts/services.sh`:
//!
//! | variable           | default                  |
//! |--------------------|--------------------------|
//! | `SKEIN_KAFKA`      | `127.0.0.1:9092`         |
//! | `SKEIN_REDIS`      | `redis://127.0.0.1:6379` |
//! | `AWS_ENDPOINT_URL` | `http://127.0.0.1:4566`  |
//!
//! A test whose service is not there fails at once with a message naming
//! `scripts/services.sh start`: it never passes or skips silently.

// Each test binary (a tests/*.rs, or a folder's main.rs) is its own crate
// and uses only some of these helpers.
#![allow(dead_code)]

use std::future::Future;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::{BehaviorVersion, Region, SdkConfig};

pub mod browser;
pub mod cost;
pub mod event_time;
pub mod kafka;
pub mod kills;
pub mod nexmark_columns;
pub mod nexmark_reference;
pub mod nexmark_topics;
pub mod publish;
pub mod pushed;
pub mod rows;
pub mod sellers;
pub mod services;
pub mod windowed;
pub mod ysb;
use aws_sdk_lambda::config::Credentials;

pub const START_HINT: &str =
    "start the services with `scripts/services.sh start` (scripts/test.sh does it for you)";

pub fn kafka_brokers() -> String {
    env_or("SKEIN_KAFKA", "127.0.0.1:9092")
}

pub fn redis_url() -> String {
    env_or("SKEIN_REDIS", "redis://127.0.0.1:6379")
}

pub fn aws_endpoint() -> String {
    env_or("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")
}

pub fn aws_region() -> String {
    std::env::var("AWS_REGION")
        .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|_| "us-east-1".into())
}

/// Access key and secret: from the environment, else the dummies the AWS
/// stand-in accepts.
pub fn aws_credentials() -> (String, String) {
    match (
        std::env::var("AWS_ACCESS_KEY_ID"),
        std::env::var("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Ok(id), Ok(secret)) if !id.is_empty() => (id, secret),
        _ => ("test".into(), "test".into()),
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// Fails the test unless something accepts TCP connections at `addr`
/// (`host:port`, or a URL such as `redis://host:port`).
pub fn require_service(service: &str, addr: &str, variable: &str) {
    let host_port = addr
        .split_once("://")
        .map_or(addr, |(_, rest)| rest)
        .split(['/', ','])
        .next()
        .unwrap_or_default();
    let resolved: Vec<SocketAddr> = host_port
        .to_socket_addrs()
        .unwrap_or_else(|e| {
            panic!("{service}: cannot resolve {host_port:?} (from {variable}={addr:?}): {e}")
        })
        .collect();
    let reachable = resolved
        .iter()
        .any(|a| TcpStream::connect_timeout(a, Duration::from_secs(2)).is_ok());
    assert!(
        reachable,
        "{service} is not reachable at {host_port} (set {variable} to change it): {START_HINT}"
    );
}

pub fn require_kafka() -> String {
    let brokers = kafka_brokers();
    require_service("Kafka", &brokers, "SKEIN_KAFKA");
    brokers
}

pub fn require_redis() -> String {
    let url = redis_url();
    require_service("Redis", &url, "SKEIN_REDIS");
    url
}

/// The AWS stand-in (ministack) must be up, and healthy enough to accept TCP.
pub fn require_aws() -> String {
    let endpoint = aws_endpoint();
    require_service(
        "ministack (S3, Kinesis, Lambda)",
        &endpoint,
        "AWS_ENDPOINT_URL",
    );
    endpoint
}

/// SDK configuration for the AWS stand-in. Built explicitly (rather than from
/// the default chain) so a machine without AWS settings does not spend seconds
/// probing instance metadata for credentials.
pub async fn aws_sdk_config() -> SdkConfig {
    let endpoint = require_aws();
    let (id, secret) = aws_credentials();
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(aws_region()))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(id, secret, None, None, "skein-tests"))
        .load()
        .await
}

/// S3 client with path-style addressing: `bucket.127.0.0.1` does not resolve.
pub async fn s3_client() -> aws_sdk_s3::Client {
    let config = aws_sdk_config().await;
    let s3 = aws_sdk_s3::config::Builder::from(&config)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(s3)
}

/// Creates `bucket` if it does not exist yet.
pub async fn ensure_bucket(s3: &aws_sdk_s3::Client, bucket: &str) {
    if s3.head_bucket().bucket(bucket).send().await.is_ok() {
        return;
    }
    s3.create_bucket()
        .bucket(bucket)
        .send()
        .await
        .unwrap_or_else(|e| panic!("creating bucket {bucket}: {}", error_chain(&e)));
}

/// A name no other run uses: `<prefix>-<unix millis>-<random hex>`, in the
/// characters every service here accepts in names.
pub fn unique_name(prefix: &str) -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("{prefix}-{millis}-{:08x}", rand::random::<u32>())
}

/// Runs `fut`, failing the test (instead of hanging CI) after `secs` seconds.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {secs} s"))
}

/// An error and all its sources on one line (the deployer's own helper).
pub use skein_lambda::error_chain;

/// The body of GET http://ADDR/metrics, once the server answers.
pub fn scrape(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}

/// Run the `skein` binary built for these tests: (success, stdout, stderr).
pub fn skein(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .output()
        .expect("run skein");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Waits for `child` (stdout and stderr piped, read as it writes them),
/// killing it and failing the test after `timeout`.
pub fn wait_with_timeout(
    mut child: std::process::Child,
    timeout: Duration,
) -> std::process::Output {
    use std::io::Read;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = vec![];
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).to_string();
            panic!("no exit within {} s; stderr:\n{err}", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// A `skein` command with the AWS stand-in's endpoint, region and
/// credentials in its environment (a query that reads Kafka only does not
/// need the stand-in to be up).
pub fn skein_command_on_aws() -> std::process::Command {
    let (id, secret) = aws_credentials();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_skein"));
    command
        .env("AWS_ENDPOINT_URL", aws_endpoint())
        .env("AWS_REGION", aws_region())
        .env("AWS_ACCESS_KEY_ID", id)
        .env("AWS_SECRET_ACCESS_KEY", secret);
    command
}

/// The bootstrap the Lambda tests deploy: the one cargo built for this run,
/// or `SKEIN_TEST_FUNCTION_BINARY` (e.g. the release build packaged
/// without the SQL front end, docs/lambda.md), to run them against that.
pub fn function_binary() -> String {
    std::env::var("SKEIN_TEST_FUNCTION_BINARY")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_skein-function").to_string())
}

/// Run `skein` with the AWS stand-in's settings in its environment, and,
/// given a store, the object store and function binary the Lambda backend
/// deploys with: (success, stdout, stderr).
pub fn skein_on_aws(store: Option<&str>, args: &[&str]) -> (bool, String, String) {
    require_aws();
    let mut command = skein_command_on_aws();
    command.args(args);
    if let Some(store) = store {
        command
            .env("SKEIN_STORE", store)
            .env("SKEIN_FUNCTION_BINARY", function_binary());
    }
    let out = command.output().expect("run skein");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// `skein ARGS` on the AWS stand-in deploying to `store`: its stdout, or
/// the test fails with what it printed.
pub fn skein_on_aws_ok(store: &str, args: &[&str]) -> String {
    let (ok, stdout, stderr) = skein_on_aws(Some(store), args);
    assert!(ok, "skein {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}

/// `skein deploy SQL --backend lambda ARGS --json` to `store`: the query
/// code, and the whole answer.
pub fn deploy_on_aws(store: &str, sql: &str, args: &[&str]) -> (String, serde_json::Value) {
    let mut all = vec!["deploy", sql, "--backend", "lambda", "--json"];
    all.extend_from_slice(args);
    let out = skein_on_aws_ok(store, &all);
    let deployed: serde_json::Value = serde_json::from_str(out.trim()).expect("deploy --json");
    let code = deployed["query_code"]
        .as_str()
        .expect("query_code")
        .to_string();
    (code, deployed)
}

/// A query deployed on the AWS stand-in, destroyed with its checkpoints
/// when dropped: a test that fails leaves no schedule ticking to slow the
/// tests after it.
pub struct DestroyOnDrop {
    pub store: String,
    pub code: String,
}

impl Drop for DestroyOnDrop {
    fn drop(&mut self) {
        let _ = skein_on_aws(Some(&self.store), &["destroy", &self.code, "--purge"]);
    }
}

/// Puts `entries` on `stream` (at most 500, one PutRecords call); fails the
/// test unless every record was taken. Returns where each record went.
pub async fn put_records(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    entries: Vec<aws_sdk_kinesis::types::PutRecordsRequestEntry>,
) -> aws_sdk_kinesis::operation::put_records::PutRecordsOutput {
    let put = kinesis
        .put_records()
        .stream_name(stream)
        .set_records(Some(entries))
        .send()
        .await
        .unwrap_or_else(|e| panic!("PutRecords on {stream}: {}", error_chain(&e)));
    assert_eq!(
        put.failed_record_count(),
        Some(0),
        "{stream}: some records were not put"
    );
    put
}

/// Creates a Kinesis stream of `shards` shards and waits until it is ACTIVE.
pub async fn create_stream(stream: &str, shards: i32) {
    use aws_sdk_kinesis::types::StreamStatus;
    let config = aws_sdk_config().await;
    let kinesis = aws_sdk_kinesis::Client::new(&config);
    kinesis
        .create_stream()
        .stream_name(stream)
        .shard_count(shards)
        .send()
        .await
        .unwrap_or_else(|e| panic!("CreateStream {stream}: {}", error_chain(&e)));
    within(30, "waiting for the stream to become ACTIVE", async {
        loop {
            let summary = kinesis
                .describe_stream_summary()
                .stream_name(stream)
                .send()
                .await
                .unwrap_or_else(|e| panic!("DescribeStreamSummary: {}", error_chain(&e)));
            if summary
                .stream_description_summary()
                .map(|s| s.stream_status())
                == Some(&StreamStatus::Active)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
}

/// (partition key, data) of every record of `stream`, all shards, read
/// from the trim horizon until each shard comes back empty.
pub async fn drain_stream(stream: &str) -> Vec<(String, Vec<u8>)> {
    use aws_sdk_kinesis::types::ShardIteratorType;
    let config = aws_sdk_config().await;
    let kinesis = aws_sdk_kinesis::Client::new(&config);
    let shards = kinesis
        .list_shards()
        .stream_name(stream)
        .send()
        .await
        .unwrap_or_else(|e| panic!("ListShards {stream}: {}", error_chain(&e)));
    let mut out = vec![];
    for shard in shards.shards() {
        let mut iterator = kinesis
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(shard.shard_id())
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GetShardIterator: {}", error_chain(&e)))
            .shard_iterator;
        let mut reads = 0;
        while let Some(it) = iterator.take() {
            reads += 1;
            assert!(reads <= 200, "shard {} did not drain", shard.shard_id());
            let page = kinesis
                .get_records()
                .shard_iterator(it)
                .limit(10_000)
                .send()
                .await
                .unwrap_or_else(|e| panic!("GetRecords: {}", error_chain(&e)));
            if page.records().is_empty() {
                break;
            }
            for r in page.records() {
                out.push((r.partition_key().to_string(), r.data().as_ref().to_vec()));
            }
            iterator = page.next_shard_iterator;
        }
    }
    out
}

/// Polls `check` until it answers, failing the test if `child` exits first
/// (with its stderr) or `patience` passes: waits for a condition, not for
/// the clock.
pub fn wait_until<T>(
    child: &mut std::process::Child,
    patience: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let started = std::time::Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        if let Some(status) = child.try_wait().expect("polling the child") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            panic!("the child exited with {status} while waiting for {what}:\n{err}");
        }
        assert!(
            started.elapsed() < patience,
            "no {what} within {patience:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A TCP port nothing listens on right now (the OS picks it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding 127.0.0.1:0 for a free port")
}

/// A file of this repository, e.g. `scripts/services.sh`. Clones share one
/// target directory, so a test binary may have been built in another clone:
/// the checkout is the one `cargo test` runs in (it sets the variable when
/// it runs the test), not the one the binary was compiled in.
pub fn repo_path(relative: &str) -> std::path::PathBuf {
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    root.join(relative)
}

/// The typed report of `skein run --json` (`skein nexmark --json`, `skein
/// run --backend lambda --json`): its last stdout line, read back into the
/// report the command printed, so a test checks figures by name.
pub fn run_report(stdout: &str) -> skein::report::Report {
    json_line(stdout)
}

/// The last stdout line of a `--json` command, read back into `T`: the
/// struct the command printed it from.
pub fn json_line<T: serde::de::DeserializeOwned>(stdout: &str) -> T {
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("not a {} ({e}): {stdout}", std::any::type_name::<T>()))
}

/// A command's JSON line already read as a `Value` (`log`: what to show
/// if it is not one), read into `T`: the struct the command printed it from.
pub fn typed<T: serde::de::DeserializeOwned>(json: &serde_json::Value, log: &str) -> T {
    T::deserialize(json)
        .unwrap_or_else(|e| panic!("not a {} ({e}): {json}\n{log}", std::any::type_name::<T>()))
}

/// A connection to the Redis at `url` and its keys matching `pattern`.
pub fn redis_keys(url: &str, pattern: &str) -> (redis::Connection, Vec<String>) {
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_connection()
        .expect("connecting to Redis");
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut con).unwrap();
    (con, keys)
}

/// The hashes under `prefix:` as key -> (n, total): what an aggregate of
/// a count `n` and a sum `total` per key upserts into Redis.
pub fn redis_counts(prefix: &str) -> std::collections::BTreeMap<String, (i64, i64)> {
    let (mut con, keys) = redis_keys(&redis_url(), &format!("{prefix}:*"));
    keys.into_iter()
        .map(|key| {
            let h: std::collections::BTreeMap<String, i64> =
                redis::cmd("HGETALL").arg(&key).query(&mut con).unwrap();
            let k = key.rsplit(':').next().unwrap_or_default().to_string();
            (k, (h["n"], h["total"]))
        })
        .collect()
}
