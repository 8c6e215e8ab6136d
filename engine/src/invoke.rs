//! The two traits that keep the generic function blind to where it runs:
//! [`Invoker`] calls a function by name, [`FunctionService`] manages them.
//! The in-process runtime and the Lambda backend both implement them.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use crate::backoff::Backoff;
use crate::error::{EngineError, Result};

/// How a function is called: waiting for its answer, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvocationType {
    /// Wait for the function's answer (Lambda `RequestResponse`).
    Sync,
    /// Queue the invocation and return at once (Lambda `Event`).
    Async,
}

/// Calls a function by name: Lambda's Invoke, or the in-process runtime.
#[async_trait]
pub trait Invoker: Send + Sync {
    /// Invoke `function` with a JSON payload. A sync call returns the
    /// function's answer; an async call returns an empty answer once queued.
    async fn invoke(
        &self,
        function: &str,
        payload: Vec<u8>,
        kind: InvocationType,
    ) -> Result<Vec<u8>>;
}

/// A function to deploy: its name and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSpec {
    /// The function's name.
    pub name: String,
    /// Its environment variables (the cloud context among them).
    pub environment: BTreeMap<String, String>,
    /// Reserved concurrency: how many invocations may run at once.
    pub concurrency: usize,
}

/// Deploys and removes functions: what a backend implements besides invoking.
#[async_trait]
pub trait FunctionService: Send + Sync {
    /// Create the function, or update its environment if it exists.
    async fn create(&self, spec: FunctionSpec) -> Result<()>;
    /// Limit how many instances of `name` run at once.
    async fn set_concurrency(&self, name: &str, concurrency: usize) -> Result<()>;
    /// Names of the functions whose name starts with `prefix`.
    async fn list(&self, prefix: &str) -> Result<Vec<String>>;
    /// Remove the function `name`.
    async fn delete(&self, name: &str) -> Result<()>;
}

/// Invoke, retrying throttled calls with truncated linear backoff.
pub async fn invoke_with_retry(
    invoker: &dyn Invoker,
    function: &str,
    payload: Vec<u8>,
    kind: InvocationType,
    max_backoff: Duration,
    max_attempts: u32,
) -> Result<Vec<u8>> {
    invoke_counting_retries(invoker, function, payload, kind, max_backoff, max_attempts)
        .await
        .map(|(answer, _)| answer)
}

/// [`invoke_with_retry`], also saying how many times it was sent again.
pub async fn invoke_counting_retries(
    invoker: &dyn Invoker,
    function: &str,
    payload: Vec<u8>,
    kind: InvocationType,
    max_backoff: Duration,
    max_attempts: u32,
) -> Result<(Vec<u8>, u32)> {
    let mut backoff = Backoff::new(max_backoff);
    loop {
        match invoker.invoke(function, payload.clone(), kind).await {
            Err(EngineError::Throttled { .. }) if backoff.failures() + 1 < max_attempts => {
                let delay = backoff.next_delay();
                tracing::debug!(function, ?delay, "throttled; backing off");
                tokio::time::sleep(delay).await;
            }
            other => return other.map(|answer| (answer, backoff.failures())),
        }
    }
}
