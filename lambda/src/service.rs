//! [`FunctionService`] over the Lambda control plane: one function per stage
//! member, runtime `provided.al2023`, handler `bootstrap`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::{
    Architecture, DestinationConfig, Environment, FunctionCode, LastUpdateStatus, OnFailure,
    Runtime, State,
};
use skein_engine::context::LAMBDA_ENV_LIMIT;
use skein_engine::invoke::{FunctionService, FunctionSpec};
use skein_engine::planner::STATELESS_CONCURRENCY;
use skein_engine::{EngineError, Result};

use crate::error_chain;

/// Where a function's code comes from.
#[derive(Clone, Debug)]
pub enum CodeSource {
    /// The zip itself, sent with every create / update.
    Zip(Arc<Vec<u8>>),
    /// A zip already in S3 (sent once, however many functions use it).
    S3 { bucket: String, key: String },
}

#[derive(Clone, Debug)]
pub struct ServiceOptions {
    pub code: CodeSource,
    /// `CodeSha256` of the zip: code is updated only when it differs.
    pub code_sha256: String,
    pub role: String,
    pub memory_mb: i32,
    pub timeout_s: i32,
    pub arch: Architecture,
    /// Variables every function gets besides its context.
    pub extra_env: BTreeMap<String, String>,
    /// Where async invocations go after Lambda's retries (an SQS, SNS or
    /// Lambda ARN): the on-failure destination of every function.
    pub on_failure: Option<String>,
    /// Tags every function gets (the query's code and name, [`query_tags`]).
    pub tags: BTreeMap<String, String>,
}

/// The tag that holds a function's query code.
pub const QUERY_TAG: &str = "skein:query";
/// The tag that holds its query's name.
pub const NAME_TAG: &str = "skein:name";

/// The tags of a query's functions: its code, and its name where it has one.
pub fn query_tags(code: &str, name: Option<&str>) -> BTreeMap<String, String> {
    let mut tags = BTreeMap::from([(QUERY_TAG.to_string(), code.to_string())]);
    if let Some(name) = name {
        tags.insert(NAME_TAG.to_string(), name.to_string());
    }
    tags
}

pub struct LambdaFunctionService {
    client: aws_sdk_lambda::Client,
    /// None for a service that only lists and deletes (no code to deploy).
    options: Option<ServiceOptions>,
}

fn failed(name: &str, what: &str, e: &dyn std::error::Error) -> EngineError {
    EngineError::invocation_failed(name.to_string(), format!("{what}: {}", error_chain(e)))
}

/// Lambda caps keys plus values of the whole environment at 4 KB.
pub fn check_environment(name: &str, env: &BTreeMap<String, String>) -> Result<()> {
    let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > LAMBDA_ENV_LIMIT {
        return Err(EngineError::Context(format!(
            "environment of {name} is {bytes} bytes, over Lambda's limit of {LAMBDA_ENV_LIMIT}"
        )));
    }
    Ok(())
}

impl LambdaFunctionService {
    pub fn new(config: &aws_config::SdkConfig, options: Option<ServiceOptions>) -> Self {
        LambdaFunctionService {
            client: aws_sdk_lambda::Client::new(config),
            options,
        }
    }

    fn options(&self) -> Result<&ServiceOptions> {
        self.options
            .as_ref()
            .ok_or_else(|| EngineError::Context("no code and role given to deploy with".into()))
    }

    fn environment(&self, spec: &FunctionSpec) -> Result<Environment> {
        let mut env = self.options()?.extra_env.clone();
        env.extend(spec.environment.clone());
        check_environment(&spec.name, &env)?;
        Ok(Environment::builder()
            .set_variables(Some(env.into_iter().collect::<HashMap<_, _>>()))
            .build())
    }

    fn code(o: &ServiceOptions) -> FunctionCode {
        match &o.code {
            CodeSource::Zip(zip) => FunctionCode::builder()
                .zip_file(Blob::new(zip.as_ref().clone()))
                .build(),
            CodeSource::S3 { bucket, key } => FunctionCode::builder()
                .s3_bucket(bucket)
                .s3_key(key)
                .build(),
        }
    }

    /// The function's current code hash, or None when it does not exist.
    async fn existing_code(&self, name: &str) -> Result<Option<String>> {
        match self
            .client
            .get_function_configuration()
            .function_name(name)
            .send()
            .await
        {
            Ok(conf) => Ok(Some(conf.code_sha256().unwrap_or_default().to_string())),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                Ok(None)
            }
            Err(e) => Err(failed(name, "GetFunctionConfiguration", &e)),
        }
    }

    async fn create_new(&self, spec: &FunctionSpec, env: Environment) -> Result<()> {
        let o = self.options()?;
        let req = self
            .client
            .create_function()
            .function_name(&spec.name)
            .runtime(Runtime::Providedal2023)
            .handler("bootstrap")
            .architectures(o.arch.clone())
            .role(&o.role)
            .memory_size(o.memory_mb)
            .timeout(o.timeout_s)
            .code(Self::code(o))
            .environment(env)
            .set_tags((!o.tags.is_empty()).then(|| o.tags.clone().into_iter().collect()));
        req.send()
            .await
            .map_err(|e| failed(&spec.name, "CreateFunction", &e))?;
        Ok(())
    }

    /// Set the service's tags on an existing function (a redeploy may
    /// carry a new name).
    async fn tag(&self, name: &str) -> Result<()> {
        let o = self.options()?;
        if o.tags.is_empty() {
            return Ok(());
        }
        let conf = self.configuration(name).await?;
        let Some(arn) = conf.function_arn() else {
            return Ok(());
        };
        self.client
            .tag_resource()
            .resource(arn)
            .set_tags(Some(o.tags.clone().into_iter().collect()))
            .send()
            .await
            .map_err(|e| failed(name, "TagResource", &e))?;
        Ok(())
    }

    async fn update(&self, spec: &FunctionSpec, env: Environment, code_sha: &str) -> Result<()> {
        let o = self.options()?;
        if code_sha != o.code_sha256 {
            let req = self.client.update_function_code().function_name(&spec.name);
            let req = match &o.code {
                CodeSource::Zip(zip) => req.zip_file(Blob::new(zip.as_ref().clone())),
                CodeSource::S3 { bucket, key } => req.s3_bucket(bucket).s3_key(key),
            };
            req.send()
                .await
                .map_err(|e| failed(&spec.name, "UpdateFunctionCode", &e))?;
            self.wait_ready(&spec.name).await?;
        }
        let req = self
            .client
            .update_function_configuration()
            .function_name(&spec.name)
            .role(&o.role)
            .memory_size(o.memory_mb)
            .timeout(o.timeout_s)
            .environment(env);
        req.send()
            .await
            .map_err(|e| failed(&spec.name, "UpdateFunctionConfiguration", &e))?;
        Ok(())
    }

    async fn configuration(
        &self,
        name: &str,
    ) -> Result<aws_sdk_lambda::operation::get_function_configuration::GetFunctionConfigurationOutput>
    {
        self.client
            .get_function_configuration()
            .function_name(name)
            .send()
            .await
            .map_err(|e| failed(name, "GetFunctionConfiguration", &e))
    }

    /// Wait until the function is Active and no update is in progress.
    async fn wait_ready(&self, name: &str) -> Result<()> {
        let start = Instant::now();
        loop {
            let conf = self.configuration(name).await?;
            let active = matches!(conf.state(), Some(State::Active) | None);
            let settled = !matches!(
                conf.last_update_status(),
                Some(LastUpdateStatus::InProgress)
            );
            if let Some(State::Failed) = conf.state() {
                return Err(EngineError::invocation_failed(
                    name,
                    format!(
                        "function failed: {}",
                        conf.state_reason().unwrap_or_default()
                    ),
                ));
            }
            if active && settled {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(120) {
                return Err(EngineError::invocation_failed(
                    name,
                    "not Active after 120 s",
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Set one variable of a deployed function's environment, keeping the
    /// rest, and wait for the update: a changed environment replaces every
    /// instance (what a standing driver does after a failed epoch, without
    /// the code and options a full deployment needs).
    pub async fn set_env_var(&self, name: &str, key: &str, value: &str) -> Result<()> {
        self.wait_ready(name).await?;
        let conf = self.configuration(name).await?;
        let mut vars: HashMap<String, String> = conf
            .environment()
            .and_then(|e| e.variables())
            .cloned()
            .unwrap_or_default();
        vars.insert(key.to_string(), value.to_string());
        self.client
            .update_function_configuration()
            .function_name(name)
            .environment(Environment::builder().set_variables(Some(vars)).build())
            .send()
            .await
            .map_err(|e| failed(name, "UpdateFunctionConfiguration", &e))?;
        self.wait_ready(name).await
    }

    /// The ARN of a deployed function.
    pub async fn function_arn(&self, name: &str) -> Result<String> {
        let conf = self.configuration(name).await?;
        conf.function_arn()
            .map(str::to_string)
            .ok_or_else(|| EngineError::invocation_failed(name, "no FunctionArn"))
    }

    async fn configure_async(&self, name: &str) -> Result<()> {
        let Some(arn) = &self.options()?.on_failure else {
            return Ok(());
        };
        let destination = DestinationConfig::builder()
            .on_failure(OnFailure::builder().destination(arn).build())
            .build();
        self.client
            .put_function_event_invoke_config()
            .function_name(name)
            .maximum_retry_attempts(2)
            .destination_config(destination)
            .send()
            .await
            .map_err(|e| failed(name, "PutFunctionEventInvokeConfig", &e))?;
        Ok(())
    }
}

#[async_trait]
impl FunctionService for LambdaFunctionService {
    /// Create the function, or update the one that exists (same name: no
    /// cold start from renaming), then set its concurrency.
    async fn create(&self, spec: FunctionSpec) -> Result<()> {
        let env = self.environment(&spec)?;
        match self.existing_code(&spec.name).await? {
            None => self.create_new(&spec, env).await?,
            Some(sha) => {
                self.update(&spec, env, &sha).await?;
                self.tag(&spec.name).await?;
            }
        }
        self.wait_ready(&spec.name).await?;
        self.configure_async(&spec.name).await?;
        self.set_concurrency(&spec.name, spec.concurrency).await?;
        tracing::info!(function = %spec.name, concurrency = spec.concurrency, "deployed");
        Ok(())
    }

    /// Stateless functions get no reservation (they scale with the account);
    /// others reserve exactly their concurrency.
    async fn set_concurrency(&self, name: &str, concurrency: usize) -> Result<()> {
        if concurrency >= STATELESS_CONCURRENCY {
            self.client
                .delete_function_concurrency()
                .function_name(name)
                .send()
                .await
                .map_err(|e| failed(name, "DeleteFunctionConcurrency", &e))?;
        } else {
            self.client
                .put_function_concurrency()
                .function_name(name)
                .reserved_concurrent_executions(concurrency.max(1) as i32)
                .send()
                .await
                .map_err(|e| failed(name, "PutFunctionConcurrency", &e))?;
        }
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let mut names = vec![];
        let mut marker: Option<String> = None;
        loop {
            let page = self
                .client
                .list_functions()
                .set_marker(marker.clone())
                .max_items(50)
                .send()
                .await
                .map_err(|e| failed(prefix, "ListFunctions", &e))?;
            names.extend(
                page.functions()
                    .iter()
                    .filter_map(|f| f.function_name())
                    .filter(|n| n.starts_with(prefix))
                    .map(str::to_string),
            );
            match page.next_marker() {
                Some(m) if !m.is_empty() => marker = Some(m.to_string()),
                _ => break,
            }
        }
        names.sort();
        Ok(names)
    }

    async fn delete(&self, name: &str) -> Result<()> {
        match self
            .client
            .delete_function()
            .function_name(name)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(failed(name, "DeleteFunction", &e)),
        }
    }
}

/// The query code of a function named `<query-code>-<stage:02>-<member:02>`
/// (or `<query-code>-dlq`, its dead-letter function).
pub fn query_code_of(name: &str) -> Option<&str> {
    for suffix in ["-dlq", "-driver"] {
        if let Some(code) = name.strip_suffix(suffix).filter(|c| !c.is_empty()) {
            return Some(code);
        }
    }
    let mut parts = name.rsplitn(3, '-');
    let member = parts.next()?;
    let stage = parts.next()?;
    let code = parts.next()?;
    let two_digits = |s: &str| s.len() >= 2 && s.bytes().all(|b| b.is_ascii_digit());
    (two_digits(member) && two_digits(stage) && !code.is_empty()).then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_codes_from_function_names() {
        assert_eq!(query_code_of("q0123456789-01-03"), Some("q0123456789"));
        assert_eq!(query_code_of("skein-smoke-1-2"), None);
        assert_eq!(query_code_of("plain"), None);
        assert_eq!(query_code_of("q0123456789-dlq"), Some("q0123456789"));
        assert_eq!(query_code_of("q0123456789-driver"), Some("q0123456789"));
    }

    #[test]
    fn environment_over_4_kb_is_refused() {
        let small = BTreeMap::from([("SKEIN_CONTEXT".to_string(), "x".repeat(100))]);
        assert!(check_environment("f", &small).is_ok());
        let big = BTreeMap::from([("SKEIN_CONTEXT".to_string(), "x".repeat(4090))]);
        let err = check_environment("f", &big).unwrap_err().to_string();
        assert!(err.contains("over Lambda's limit"), "{err}");
    }
}
