//! Probes: what a function reports of itself (its `SKEIN_*` environment,
//! what its stage waits for), answered and, for async probes, written to
//! `record_to` (`s3://bucket/key` or `file:///path`).

use std::collections::BTreeMap;
use std::sync::Arc;

use lambda_runtime::Diagnostic;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::Serialize;
use skein_engine::context::CONTEXT_ENV;
use skein_sinks::store::s3_from_env;

use super::{internal, invalid};

#[derive(Debug, Serialize)]
pub(super) struct ProbeReport {
    function_name: String,
    request_id: String,
    /// Every `SKEIN_*` variable of the process, sorted by name.
    env: BTreeMap<String, String>,
    /// What this instance's stage waits for (the driver asks before a
    /// commit); empty when it has not built its stage.
    pub(super) pending: Vec<String>,
}

impl ProbeReport {
    pub(super) fn new(context: &lambda_runtime::Context) -> Self {
        // The context may hold source credentials: its size only.
        let env = std::env::vars()
            .filter(|(k, _)| k.starts_with("SKEIN_"))
            .map(|(k, v)| match k.as_str() {
                CONTEXT_ENV => (k, format!("<{} bytes>", v.len())),
                _ => (k, v),
            })
            .collect();
        Self {
            function_name: context.env_config.function_name.clone(),
            request_id: context.request_id.clone(),
            env,
            pending: vec![],
        }
    }
}

/// Writes the report to `target` (`s3://bucket/key` or `file:///path`).
pub(super) async fn record(target: &str, report: &ProbeReport) -> Result<(), Diagnostic> {
    let (store, path) = open_target(target)?;
    let body =
        serde_json::to_vec_pretty(report).map_err(|e| internal(format!("encoding report: {e}")))?;
    store
        .put(&path, PutPayload::from(body))
        .await
        .map_err(|e| Diagnostic {
            error_type: "Skein.RecordFailed".into(),
            error_message: format!("writing the probe report to {target}: {e}"),
        })?;
    Ok(())
}

fn open_target(target: &str) -> Result<(Arc<dyn ObjectStore>, Path), Diagnostic> {
    if let Some(rest) = target.strip_prefix("s3://") {
        let (bucket, key) = rest
            .split_once('/')
            .filter(|(b, k)| !b.is_empty() && !k.is_empty())
            .ok_or_else(|| invalid(format!("record_to {target:?}: expected s3://bucket/key")))?;
        let store = s3_from_env(bucket)
            .map_err(|e| invalid(format!("record_to {target:?}: S3 configuration: {e}")))?;
        let path = Path::parse(key).map_err(|e| invalid(format!("record_to {target:?}: {e}")))?;
        Ok((Arc::new(store), path))
    } else if let Some(file) = target.strip_prefix("file://") {
        let path = Path::from_absolute_path(file)
            .map_err(|e| invalid(format!("record_to {target:?}: {e}")))?;
        Ok((Arc::new(LocalFileSystem::new()), path))
    } else {
        Err(invalid(format!(
            "record_to {target:?}: expected s3://bucket/key or file:///path"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_record_targets() {
        for target in [
            "s3://bucket-only",
            "s3:///key",
            "http://x/y",
            "file://relative",
        ] {
            assert!(open_target(target).is_err(), "{target} accepted");
        }
    }
}
