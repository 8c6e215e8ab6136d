//! The two traits that keep the generic function blind to where it runs:
//! [`Invoker`] calls a function by name, [`FunctionService`] manages them.
//! The in-process runtime and the Lambda backend both implement them.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use crate::backoff::Backoff;
use crate::error::{EngineError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvocationType {
    /// Wait for the function's answer (Lambda `RequestResponse`).
    Sync,
    /// Queue the invocation and return at once (Lambda `Event`).
    Async,
}

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSpec {
    pub name: String,
    pub environment: BTreeMap<String, String>,
    /// Reserved concurrency: how many invocations may run at once.
    pub concurrency: usize,
}

#[async_trait]
pub trait FunctionService: Send + Sync {
    /// Create the function, or update its environment if it exists.
    async fn create(&self, spec: FunctionSpec) -> Result<()>;
    async fn set_concurrency(&self, name: &str, concurrency: usize) -> Result<()>;
    /// Names of the functions whose name starts with `prefix`.
    async fn list(&self, prefix: &str) -> Result<Vec<String>>;
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
    let mut backoff = Backoff::new(max_backoff);
    loop {
        match invoker.invoke(function, payload.clone(), kind).await {
            Err(EngineError::Throttled { .. }) if backoff.failures() + 1 < max_attempts => {
                let delay = backoff.next_delay();
                tracing::debug!(function, ?delay, "throttled; backing off");
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}
