//! The Lambda backend on the command line: the flags every command that
//! runs or deploys on Lambda shares ([`LambdaArgs`], [`Backend`], [`Arch`]),
//! and the commands themselves, a file each: `skein deploy`, `skein destroy`,
//! `skein stop` / `skein start`, `skein status` (the deployed queries) and
//! `skein package` in [`deploy`]; `skein run --backend lambda` in [`run`];
//! `skein bench lambda` in [`bench`]. Each maps its flags to skein-lambda
//! and prints what comes back.
//!
//! Every function runs the `skein-function` binary that sits next to this
//! one (or `--function-binary`), zipped as `bootstrap`. Results of a query
//! without `INSERT INTO` go to the `RESULTS` sink in the deployment's object
//! store (`--store`, default `s3://skein`) and are read back from there.

pub mod bench;
pub mod deploy;
pub mod run;

use std::path::{Path, PathBuf};

use anyhow::Result;
use aws_sdk_lambda::types::Architecture;
use clap::{Args, ValueEnum};
use skein_lambda::deployment::{Deployment, LambdaOptions};

use crate::args::read_sql;
use crate::registry::registries;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The in-process function runtime.
    #[default]
    Local,
    /// AWS Lambda (or a stand-in at AWS_ENDPOINT_URL).
    Lambda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Arch {
    #[value(name = "x86_64")]
    X86_64,
    Arm64,
}

impl Arch {
    pub fn lambda(self) -> Architecture {
        match self {
            Arch::X86_64 => Architecture::X8664,
            Arch::Arm64 => Architecture::Arm64,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        }
    }

    fn host() -> Option<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }
}

/// Where and how functions are deployed.
#[derive(Args, Clone, Debug)]
pub struct LambdaArgs {
    /// Where the functions run.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,
    /// A ready bootstrap.zip (default: zip the skein-function next to this binary).
    #[arg(long)]
    pub zip: Option<PathBuf>,
    /// The skein-function binary to package when no --zip is given.
    #[arg(long, env = "SKEIN_FUNCTION_BINARY")]
    pub function_binary: Option<PathBuf>,
    /// Execution role of the functions.
    #[arg(
        long,
        env = "SKEIN_LAMBDA_ROLE",
        default_value = "arn:aws:iam::000000000000:role/skein"
    )]
    pub role: String,
    /// Memory of each function, MB [default: 512; `skein cost`: 1769,
    /// one vCPU, which it also prices].
    #[arg(long, value_parser = clap::value_parser!(i32).range(128..=10240))]
    pub memory: Option<i32>,
    /// Timeout of each function, seconds (a synchronous hop waits for the rest of the DAG).
    #[arg(long, default_value_t = 300)]
    pub timeout: i32,
    #[arg(long, value_enum, default_value_t = Arch::X86_64)]
    pub arch: Arch,
    /// Object store for spilled contexts, code and results: s3://bucket or file:///dir.
    #[arg(long, env = "SKEIN_STORE", default_value = "s3://skein")]
    pub store: String,
    /// On-failure destination (SQS, SNS or Lambda ARN) of async invocations
    /// (default: the query's dead-letter function `<query-code>-dlq`, which
    /// records them in the store).
    #[arg(long)]
    pub on_failure: Option<String>,
}

/// Memory of a function deployed without --memory.
const DEFAULT_MEMORY_MB: i32 = 512;

impl LambdaArgs {
    pub fn memory_mb(&self) -> i32 {
        self.memory.unwrap_or(DEFAULT_MEMORY_MB)
    }

    /// The deployment these flags describe.
    pub fn options(&self) -> LambdaOptions {
        LambdaOptions {
            zip: self.zip.clone(),
            function_binary: self.function_binary.clone(),
            role: self.role.clone(),
            memory_mb: self.memory_mb(),
            timeout_s: self.timeout,
            arch: self.arch.lambda(),
            store: self.store.clone(),
            on_failure: self.on_failure.clone(),
        }
    }

    /// Connect to the deployment, with this binary's table kinds.
    pub async fn connect(&self) -> Result<Deployment> {
        Ok(Deployment::connect(registries().catalog, self.options()).await?)
    }
}

/// The query code of a SQL file, or the argument itself.
pub(crate) fn query_code_arg(query: &str) -> Result<String> {
    if Path::new(query).is_file() {
        let sql = read_sql(Path::new(query))?;
        return Ok(skein_engine::planner::query_code(&sql));
    }
    Ok(query.to_string())
}
