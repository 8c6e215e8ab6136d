//! `skein-function`: the Lambda bootstrap binary (runtime `provided.al2023`).
//! One binary serves every function of every query: it sets up logging and
//! hands the Lambda runtime to `skein_lambda::handler` with this binary's
//! table kinds (`skein::registry`). What it serves (stage requests, pushed
//! batches, driver ticks, dead letters, probes) is documented there.

/// Plain lines on stdout, which the Lambda runtime forwards to the function's
/// log: no colours (a log file is not a terminal) and no time (every line is
/// stamped there). Level from `AWS_LAMBDA_LOG_LEVEL`, else `RUST_LOG`, else info.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .ok()
        .and_then(|level| EnvFilter::try_new(level.to_lowercase()).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .without_time()
        .init();
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    init_logging();
    // Started by hand rather than by a Lambda runtime: say so instead of panicking.
    let missing = skein_lambda::handler::missing_runtime_vars();
    if !missing.is_empty() {
        eprintln!(
            "skein-function is a Lambda bootstrap and runs under a Lambda runtime \
             (AWS Lambda, or ministack via scripts/services.sh); missing: {}",
            missing.join(", ")
        );
        std::process::exit(2);
    }
    skein_lambda::handler::serve(skein::registry::registries().catalog).await
}
