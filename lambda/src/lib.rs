//! skein-lambda: the AWS Lambda backend, the engine's two traits and the
//! product around them.
//!
//! * [`deployment`]: a [`deployment::Deployment`] (connection, code upload,
//!   service options, the dead-letter function, deploying stages, what a
//!   pushed table allows); [`run`]: one run of a query on Lambda;
//!   [`deploy`]: a query deployed to stay, paused, resumed, destroyed;
//! * [`handler`]: what the `skein-function` bootstrap serves;
//! * [`invoker`]: [`LambdaInvoker`], Invoke (RequestResponse or Event);
//! * [`service`]: [`LambdaFunctionService`], create / configure / list / delete;
//! * [`store`]: the object store (S3 or a directory) from a URL and `AWS_*`;
//! * [`package`]: the `bootstrap.zip` Lambda expects;
//! * [`exchange`]: the payload-vs-S3 exchange benchmark (Flock's Table 2);
//! * [`bench_scope`]: which bench and probe requests a function serves;
//! * [`esm`]: Kinesis event-source mappings for pushed source stages, and
//!   [`pushed`]: the batches they push;
//! * [`checkpoints`]: a query's checkpoint store on S3;
//! * [`epochs`]: Lambda under the engine's epoch loop (commits, recovery);
//! * [`standing`]: a standing query's driver ticks, under a [`lease`],
//!   invoked by a [`schedule`].
//!
//! Every AWS call uses the standard credential chain and honours
//! `AWS_ENDPOINT_URL`; nothing (bucket, role, region) is hard-coded.

pub mod bench_scope;
pub mod checkpoints;
pub mod dead_letter;
// Deploying and running SQL: the CLI's side, which plans.
#[cfg(feature = "sql")]
pub mod deploy;
#[cfg(feature = "sql")]
pub mod deployment;
pub mod emf;
pub mod epoch_runtime;
pub mod error;
pub mod esm;
pub mod exchange;
pub mod handler;
pub mod invoker;
pub mod lease;
pub mod package;
pub mod pushed;
pub mod rescale;
#[cfg(feature = "sql")]
pub mod run;
pub mod schedule;
pub mod service;
pub mod standing;
pub mod store;

pub use invoker::LambdaInvoker;
pub use service::{CodeSource, LambdaFunctionService, ServiceOptions};

/// Environment variable naming the object store of a deployment
/// (`s3://bucket` or `file:///dir`): spilled contexts and results live there.
pub const STORE_ENV: &str = "SKEIN_STORE";
/// Environment variable with the id of the run a function was configured
/// for: a new run changes it, so every function starts from a fresh instance.
pub const RUN_ENV: &str = "SKEIN_RUN";

/// SDK configuration from the standard chain (honours `AWS_ENDPOINT_URL`).
pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
}

/// An error and all its sources on one line: SDK errors say little at the top.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}
