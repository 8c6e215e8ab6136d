//! [`Invoker`] over the Lambda Invoke API.

use async_trait::async_trait;
use aws_sdk_lambda::error::SdkError;
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType as LambdaInvocationType;
use skein_engine::invoke::{InvocationType, Invoker};
use skein_engine::{EngineError, Result};

use crate::error_chain;

#[derive(Clone, Debug)]
pub struct LambdaInvoker {
    client: aws_sdk_lambda::Client,
}

impl LambdaInvoker {
    /// The SDK's own retries are turned off: throttles go back to
    /// `invoke_with_retry`, whose truncated linear backoff is the engine's.
    pub fn new(config: &aws_config::SdkConfig) -> Self {
        let conf = aws_sdk_lambda::config::Builder::from(config)
            .retry_config(aws_sdk_lambda::config::retry::RetryConfig::disabled())
            .build();
        LambdaInvoker {
            client: aws_sdk_lambda::Client::from_conf(conf),
        }
    }

    pub fn client(&self) -> &aws_sdk_lambda::Client {
        &self.client
    }
}

#[async_trait]
impl Invoker for LambdaInvoker {
    async fn invoke(
        &self,
        function: &str,
        payload: Vec<u8>,
        kind: InvocationType,
    ) -> Result<Vec<u8>> {
        let kind_name = match kind {
            InvocationType::Sync => LambdaInvocationType::RequestResponse,
            InvocationType::Async => LambdaInvocationType::Event,
        };
        let sent = self
            .client
            .invoke()
            .function_name(function)
            .invocation_type(kind_name)
            .payload(Blob::new(payload))
            .send()
            .await;
        let out = match sent {
            Ok(out) => out,
            Err(SdkError::ServiceError(e)) if is_retryable(e.err()) => {
                return Err(EngineError::Throttled {
                    name: function.to_string(),
                    limit: 0,
                });
            }
            Err(e) => {
                return Err(EngineError::invocation_failed(
                    function.to_string(),
                    error_chain(&e),
                ));
            }
        };
        let body = out
            .payload()
            .map(|b| b.as_ref().to_vec())
            .unwrap_or_default();
        if let Some(kind) = out.function_error() {
            return Err(EngineError::invocation_failed(
                function.to_string(),
                format!("{kind} error: {}", error_message(&body)),
            ));
        }
        Ok(body)
    }
}

/// Throttled, or the function is being updated: both pass if we wait.
fn is_retryable(e: &aws_sdk_lambda::operation::invoke::InvokeError) -> bool {
    e.is_too_many_requests_exception()
        || e.is_resource_conflict_exception()
        || e.is_resource_not_ready_exception()
}

/// `errorType: errorMessage` of a function error body, else the body itself.
fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) if v.get("errorMessage").is_some() => format!(
            "{}: {}",
            v["errorType"].as_str().unwrap_or("Error"),
            v["errorMessage"].as_str().unwrap_or_default()
        ),
        _ => String::from_utf8_lossy(body).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_error_bodies_read_as_type_and_message() {
        let body =
            br#"{"errorType":"Skein.Engine","errorMessage":"payload q/1/2 at stage x-01-00: bad"}"#;
        assert_eq!(
            error_message(body),
            "Skein.Engine: payload q/1/2 at stage x-01-00: bad"
        );
        assert_eq!(error_message(b"plain"), "plain");
    }
}
