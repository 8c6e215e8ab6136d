//! Which queries there are: local checkpoint directories (under
//! `.skein/checkpoints` by default, as `skein run` makes them) and queries
//! deployed on Lambda (standing queries by their spec in the deployment's
//! store, others by their functions' names), as `skein status` finds them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use skein_engine::checkpoint::CheckpointStore;
use skein_engine::invoke::FunctionService;
use skein_lambda::standing::StandingSpec;

use crate::error::UiError;
use crate::records;

/// Where a query runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// `skein run` on this machine.
    Local,
    /// Deployed on AWS Lambda (or the endpoint in `AWS_ENDPOINT_URL`).
    Lambda,
}

impl Backend {
    /// Its name in URLs.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Lambda => "lambda",
        }
    }

    /// From its name in a URL.
    pub fn parse(name: &str) -> Option<Backend> {
        match name {
            "local" => Some(Backend::Local),
            "lambda" => Some(Backend::Lambda),
            _ => None,
        }
    }
}

/// One query found.
#[derive(Clone)]
pub struct Found {
    pub backend: Backend,
    pub code: String,
    /// Its checkpoint store, where it has one.
    pub store: Option<Arc<CheckpointStore>>,
    /// The store's location as a person would name it.
    pub location: String,
    /// The query text and group size, where known.
    pub sql: Option<(String, usize)>,
    /// The query's name, where it has one.
    pub name: Option<String>,
    /// A local query: the process holding its directory, if alive.
    pub pid: Option<u32>,
    /// A standing query on Lambda.
    pub spec: Option<StandingSpec>,
    /// Functions deployed (Lambda).
    pub functions: Vec<String>,
}

/// Local queries: every directory under `root` with a manifest, and the
/// queries running without a checkpoint store that say so there.
pub async fn local(root: &Path) -> Vec<Found> {
    let mut out = with_store(root).await;
    for q in skein_engine::running::list(root) {
        out.push(Found {
            backend: Backend::Local,
            code: q.query_code,
            store: None,
            location: format!("no checkpoint store (process {})", q.pid),
            sql: Some((q.sql, q.group_size)),
            name: q.name,
            pid: Some(q.pid),
            spec: None,
            functions: vec![],
        });
    }
    out
}

/// Every directory under `root` with a manifest.
async fn with_store(root: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return vec![];
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    dirs.sort();
    let mut out = vec![];
    for dir in dirs {
        match records::open_local(&dir).await {
            Ok((store, described)) => out.push(Found {
                backend: Backend::Local,
                code: store.manifest().query_code.clone(),
                store: Some(Arc::new(store)),
                location: dir.display().to_string(),
                name: described.as_ref().and_then(|d| d.name.clone()),
                sql: described.map(|d| (d.sql, d.group_size)),
                pid: lock_holder(&dir),
                spec: None,
                functions: vec![],
            }),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "not a checkpoint directory")
            }
        }
    }
    out
}

/// The live process that holds a local checkpoint directory's lock (a
/// running `skein run`), if any.
pub(crate) fn lock_holder(dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("lock"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

/// Queries deployed on Lambda: standing ones from their specs in the
/// deployment's store at `store_url`, the rest from function names.
pub async fn lambda(store_url: &str) -> Result<Vec<Found>, UiError> {
    let sdk = skein_lambda::sdk_config().await;
    let service = skein_lambda::LambdaFunctionService::new(&sdk, None);
    let mut functions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in service
        .list("")
        .await
        .map_err(|e| UiError::Lambda(format!("listing functions: {e}")))?
    {
        if let Some(code) = skein_lambda::service::query_code_of(&name) {
            functions.entry(code.to_string()).or_default().push(name);
        }
    }
    let deployment = skein_lambda::store::open(store_url)
        .map_err(|e| UiError::Lambda(format!("the deployment's store {store_url}: {e}")))?;
    let mut out = vec![];
    for (code, names) in functions {
        let spec = skein_lambda::standing::get_spec(&deployment, &code)
            .await
            .map_err(|e| UiError::Lambda(e.to_string()))?;
        let store = match &spec {
            Some(s) => Some(Arc::new(records::open_url(&s.checkpoints, &code)?)),
            None => None,
        };
        out.push(Found {
            backend: Backend::Lambda,
            location: spec
                .as_ref()
                .map_or_else(|| store_url.to_string(), |s| s.checkpoints.clone()),
            name: spec
                .as_ref()
                .and_then(|s| skein_engine::query::declared_name(&s.sql)),
            sql: spec.as_ref().map(|s| (s.sql.clone(), s.group_size)),
            code,
            store,
            pid: None,
            spec,
            functions: names,
        });
    }
    Ok(out)
}
