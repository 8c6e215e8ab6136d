//! A client of the Confluent Schema Registry REST API (also served by
//! Apicurio, Karapace and Redpanda): schemas by id, a subject's latest
//! version, and registering a schema under a subject.
//!
//! Calls run on one small runtime of their own, so a decoder can wait for a
//! schema from any thread (a blocking pull, an async function) without
//! nesting runtimes. Schemas are immutable under their id and are cached
//! for the life of the client.
//!
//! A registry that does not answer (connection refused, a timeout, a 5xx)
//! is retried with backoff: forever while records wait for their schema
//! (the query stalls, it does not stop), a bounded time while a query is
//! planned. Its state is kept in [`Registry::health`] for `skein status`.
//! A registry that answers 404 is an answer: the records that name the
//! missing schema are dead letters.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use skein_engine::backoff::Backoff;
use tracing::{info, warn};

use skein_clients::error::{ConnectorError, Result};

/// The table options of a registry.
pub const REGISTRY_OPTIONS: &[&str] = &[
    "schema.registry.url",
    "schema.registry.subject",
    "schema.registry.basic.auth.user.info",
    "schema.registry.ssl.ca.location",
    "schema.registry.ssl.certificate.location",
    "schema.registry.ssl.key.location",
    "schema.registry.ssl.verify",
];

/// The longest wait between two attempts to reach a registry that is down.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);
/// How long planning waits for a registry before it gives up.
const PLANNING_PATIENCE: Duration = Duration::from_secs(15);
/// One HTTP request's time limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the registry is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegistryConfig {
    /// Base URL, e.g. `http://127.0.0.1:8081` (no trailing slash).
    pub url: String,
    /// HTTP basic auth as `user:password`.
    pub user_info: Option<String>,
    /// PEM file of the CA that signs the registry's certificate.
    pub ca: Option<PathBuf>,
    /// PEM files of a client certificate and its key (mutual TLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Check the registry's certificate (default true).
    pub verify: bool,
}

impl RegistryConfig {
    /// The registry a table's options name, if any.
    pub fn from_options(options: &BTreeMap<String, String>) -> Result<Option<Self>> {
        let get = |k: &str| options.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let Some(url) = get("schema.registry.url") else {
            return Ok(None);
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ConnectorError::Config(format!(
                "schema.registry.url {url:?} must start with http:// or https://"
            )));
        }
        let user_info = get("schema.registry.basic.auth.user.info").map(str::to_string);
        if let Some(u) = &user_info
            && !u.contains(':')
        {
            return Err(ConnectorError::Config(
                "schema.registry.basic.auth.user.info must be user:password".into(),
            ));
        }
        let client_cert = match (
            get("schema.registry.ssl.certificate.location"),
            get("schema.registry.ssl.key.location"),
        ) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            _ => {
                return Err(ConnectorError::Config(
                    "schema.registry.ssl.certificate.location and \
                     schema.registry.ssl.key.location go together"
                        .into(),
                ));
            }
        };
        let verify = match get("schema.registry.ssl.verify").unwrap_or("true") {
            "true" => true,
            "false" => false,
            other => {
                return Err(ConnectorError::Config(format!(
                    "option schema.registry.ssl.verify = {other:?}"
                )));
            }
        };
        Ok(Some(RegistryConfig {
            url: url.trim_end_matches('/').to_string(),
            user_info,
            ca: get("schema.registry.ssl.ca.location").map(PathBuf::from),
            client_cert,
            verify,
        }))
    }
}

/// The kind of a registered schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaType {
    Avro,
    Protobuf,
    Json,
}

impl SchemaType {
    fn parse(s: Option<&str>) -> Self {
        match s.map(str::to_ascii_uppercase).as_deref() {
            Some("PROTOBUF") => SchemaType::Protobuf,
            Some("JSON") => SchemaType::Json,
            _ => SchemaType::Avro,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SchemaType::Avro => "AVRO",
            SchemaType::Protobuf => "PROTOBUF",
            SchemaType::Json => "JSON",
        }
    }
}

/// A schema as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredSchema {
    pub id: u32,
    pub schema_type: SchemaType,
    /// The schema text (Avro JSON, a .proto file, ...).
    pub schema: String,
}

/// What a lookup by id found.
#[derive(Debug, Clone)]
pub enum ById {
    Found(Arc<RegisteredSchema>),
    /// The registry answered that it has no such schema (or refused), and
    /// how (the caller names the id).
    Missing(String),
}

/// Whether the registry answered lately.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// Since when (ms since the epoch) calls have failed, if they do.
    pub down_since_ms: Option<u64>,
    /// Failed attempts since the last answer.
    pub failures: u32,
    /// The last failure.
    pub last_error: Option<String>,
}

/// A registry client with a cache of schemas by id.
pub struct Registry {
    config: RegistryConfig,
    client: reqwest::Client,
    by_id: Mutex<HashMap<u32, ById>>,
    health: Mutex<Health>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registry({})", self.config.url)
    }
}

/// A failure to get any answer from the registry.
#[derive(Debug)]
struct Unreachable(String);

/// An HTTP answer: status and body.
struct Answer {
    status: u16,
    body: Vec<u8>,
}

#[derive(Deserialize)]
struct SchemaBody {
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
    id: Option<u32>,
}

#[derive(Deserialize)]
struct IdBody {
    id: u32,
}

#[derive(Deserialize)]
struct ErrorBody {
    error_code: Option<i64>,
    message: Option<String>,
}

/// How long a call keeps retrying an unreachable registry.
#[derive(Debug, Clone, Copy)]
enum Patience {
    Forever,
    For(Duration),
    Once,
}

/// The client of `config`, one per registry in the process so that every
/// table that reads from it shares its cache.
pub fn shared(config: RegistryConfig) -> Result<Arc<Registry>> {
    static CLIENTS: OnceLock<Mutex<HashMap<RegistryConfig, Arc<Registry>>>> = OnceLock::new();
    let mut clients = CLIENTS
        .get_or_init(Default::default)
        .lock()
        .expect("clients");
    if let Some(r) = clients.get(&config) {
        return Ok(r.clone());
    }
    let r = Arc::new(Registry::new(config.clone())?);
    clients.insert(config, r.clone());
    Ok(r)
}

/// The runtime registry calls run on (one worker; calls are rare).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("skein-registry")
            .enable_all()
            .build()
            .expect("the schema registry runtime starts")
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Registry {
    pub fn new(config: RegistryConfig) -> Result<Self> {
        let mut builder = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5));
        let read = |p: &PathBuf, what: &str| {
            std::fs::read(p).map_err(|e| {
                ConnectorError::Config(format!("schema registry {what} {}: {e}", p.display()))
            })
        };
        if let Some(ca) = &config.ca {
            let pem = read(ca, "CA file")?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                ConnectorError::Config(format!("schema registry CA file {}: {e}", ca.display()))
            })?;
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        if let Some((cert, key)) = &config.client_cert {
            let mut pem = read(cert, "certificate")?;
            pem.push(b'\n');
            pem.extend(read(key, "key")?);
            let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                ConnectorError::Config(format!("schema registry client certificate: {e}"))
            })?;
            builder = builder.identity(identity);
        }
        if !config.verify {
            builder = builder.danger_accept_invalid_certs(true);
        }
        let client = builder
            .build()
            .map_err(|e| ConnectorError::Config(format!("schema registry client: {e}")))?;
        Ok(Registry {
            config,
            client,
            by_id: Mutex::new(HashMap::new()),
            health: Mutex::new(Health::default()),
        })
    }

    pub fn url(&self) -> &str {
        &self.config.url
    }

    pub fn health(&self) -> Health {
        self.health.lock().expect("health").clone()
    }

    /// The schema `id`, waiting for the registry as long as it takes.
    pub fn schema_by_id(&self, id: u32) -> ById {
        if let Some(known) = self.by_id.lock().expect("cache").get(&id) {
            return known.clone();
        }
        let path = format!("/schemas/ids/{id}");
        let found = match self.call("GET", &path, None, Patience::Forever) {
            Ok(a) if a.status == 200 => match serde_json::from_slice::<SchemaBody>(&a.body) {
                Ok(b) => ById::Found(Arc::new(RegisteredSchema {
                    id,
                    schema_type: SchemaType::parse(b.schema_type.as_deref()),
                    schema: b.schema,
                })),
                Err(e) => ById::Missing(format!("unreadable answer: {e}")),
            },
            Ok(a) => ById::Missing(describe(&a)),
            Err(Unreachable(e)) => ById::Missing(e),
        };
        self.by_id.lock().expect("cache").insert(id, found.clone());
        found
    }

    /// The latest schema registered under `subject` (planning: waits a
    /// bounded time for a registry that is down).
    pub fn latest(&self, subject: &str) -> Result<RegisteredSchema> {
        let path = format!("/subjects/{}/versions/latest", encode_path(subject));
        let a = self
            .call("GET", &path, None, Patience::For(PLANNING_PATIENCE))
            .map_err(|Unreachable(e)| self.error(e))?;
        if a.status != 200 {
            return Err(self.error(format!(
                "latest schema of subject {subject:?}: {}",
                describe(&a)
            )));
        }
        let b: SchemaBody = serde_json::from_slice(&a.body)
            .map_err(|e| self.error(format!("latest schema of {subject:?}: {e}")))?;
        let id =
            b.id.ok_or_else(|| self.error(format!("latest schema of {subject:?} has no id")))?;
        Ok(RegisteredSchema {
            id,
            schema_type: SchemaType::parse(b.schema_type.as_deref()),
            schema: b.schema,
        })
    }

    /// Register `schema` under `subject` (or find it there) and return its
    /// id; waits for a registry that is down.
    pub fn register(&self, subject: &str, schema_type: SchemaType, schema: &str) -> Result<u32> {
        let mut body = serde_json::json!({ "schema": schema });
        if schema_type != SchemaType::Avro {
            body["schemaType"] = schema_type.name().into();
        }
        let path = format!("/subjects/{}/versions", encode_path(subject));
        let a = self
            .call("POST", &path, Some(body.to_string()), Patience::Forever)
            .map_err(|Unreachable(e)| self.error(e))?;
        if a.status != 200 {
            return Err(self.error(format!(
                "registering a schema under {subject:?}: {}",
                describe(&a)
            )));
        }
        let id = serde_json::from_slice::<IdBody>(&a.body)
            .map_err(|e| self.error(format!("registering under {subject:?}: {e}")))?
            .id;
        info!(registry = %self.config.url, subject, id, "schema registered");
        Ok(id)
    }

    /// One attempt to reach the registry, for `skein status`: `None` if it
    /// answers, else what is wrong.
    pub fn probe(&self) -> Option<String> {
        match self.call("GET", "/subjects", None, Patience::Once) {
            Ok(a) if a.status < 500 => None,
            Ok(a) => Some(format!("schema registry {}: {}", self.url(), describe(&a))),
            Err(Unreachable(e)) => Some(format!("schema registry {}: {e}", self.url())),
        }
    }

    fn error(&self, what: String) -> ConnectorError {
        ConnectorError::Other(format!("schema registry {}: {what}", self.config.url))
    }

    /// A call, retried while the registry does not answer (or answers 5xx).
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        patience: Patience,
    ) -> std::result::Result<Answer, Unreachable> {
        let started = Instant::now();
        let mut backoff = Backoff::new(MAX_RETRY_WAIT);
        loop {
            let failure = match self.once(method, path, body.clone()) {
                Ok(a) if a.status < 500 => {
                    self.answered();
                    return Ok(a);
                }
                Ok(a) => describe(&a),
                Err(e) => e,
            };
            self.failed(&failure);
            let give_up = match patience {
                Patience::Forever => false,
                Patience::For(d) => started.elapsed() >= d,
                Patience::Once => true,
            };
            if give_up {
                return Err(Unreachable(format!("no answer: {failure}")));
            }
            let wait = backoff.next_delay();
            warn!(
                registry = %self.config.url,
                path,
                attempt = backoff.failures(),
                "schema registry unavailable, retrying in {wait:?}: {failure}"
            );
            std::thread::sleep(wait);
        }
    }

    fn answered(&self) {
        let mut h = self.health.lock().expect("health");
        if h.down_since_ms.is_some() {
            info!(registry = %self.config.url, failures = h.failures, "schema registry answers again");
        }
        *h = Health::default();
    }

    fn failed(&self, why: &str) {
        let mut h = self.health.lock().expect("health");
        h.down_since_ms.get_or_insert_with(now_ms);
        h.failures += 1;
        h.last_error = Some(why.to_string());
    }

    /// One HTTP request on the registry runtime; waits for its answer.
    fn once(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> std::result::Result<Answer, String> {
        let url = format!("{}{path}", self.config.url);
        let mut req = match method {
            "POST" => self.client.post(&url),
            _ => self.client.get(&url),
        }
        .header("Accept", "application/vnd.schemaregistry.v1+json");
        if let Some(b) = body {
            req = req
                .header("Content-Type", "application/vnd.schemaregistry.v1+json")
                .body(b);
        }
        if let Some((user, password)) = self
            .config
            .user_info
            .as_deref()
            .and_then(|u| u.split_once(':'))
        {
            req = req.basic_auth(user, Some(password));
        }
        let call = async move {
            let resp = req.send().await.map_err(|e| error_chain(&e))?;
            let status = resp.status().as_u16();
            let body = resp.bytes().await.map_err(|e| error_chain(&e))?;
            Ok(Answer {
                status,
                body: body.to_vec(),
            })
        };
        let (tx, rx) = std::sync::mpsc::channel();
        runtime().spawn(async move {
            let _ = tx.send(call.await);
        });
        rx.recv()
            .unwrap_or_else(|_| Err("the registry call was dropped".into()))
    }
}

/// A registry's error answer on one line.
fn describe(a: &Answer) -> String {
    let detail = serde_json::from_slice::<ErrorBody>(&a.body)
        .ok()
        .map(|e| match (e.error_code, e.message) {
            (Some(c), Some(m)) => format!(" (error {c}: {m})"),
            (None, Some(m)) => format!(" ({m})"),
            (Some(c), None) => format!(" (error {c})"),
            (None, None) => String::new(),
        })
        .unwrap_or_default();
    format!("HTTP {}{detail}", a.status)
}

/// An error with its causes, on one line (reqwest hides the cause of a
/// failed connection in its chain).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// A subject as one path segment.
fn encode_path(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
