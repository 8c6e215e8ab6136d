//! `skein run FILE.sql --backend lambda`: the flags mapped to a run of
//! skein-lambda (`skein_lambda::run`), and its outcome as the report every
//! backend prints, with the cost of what the functions reported.

use std::path::Path;

use anyhow::Result;
use skein_engine::epochs::Stopped;
use skein_lambda::run::{LambdaRun, RunRequest};

use super::LambdaArgs;
use crate::args::{CommonRunArgs, read_sql};
use crate::report::{OnLambda, Report};

/// `skein run FILE.sql --backend lambda`: the report, then a failure if
/// any invocation was dead-lettered or the rows were not verified.
pub async fn run(file: &Path, common: &CommonRunArgs, args: &LambdaArgs) -> Result<()> {
    let sql = read_sql(file)?;
    let (report, run) = run_sql(&sql, common, args).await?;
    println!("{}", report.render(common.json, common.show)?);
    Ok(run.failures()?)
}

/// Run `sql` on Lambda as `common` and `args` say: the report, and the
/// run (for its failures).
pub(crate) async fn run_sql(
    sql: &str,
    common: &CommonRunArgs,
    args: &LambdaArgs,
) -> Result<(Report, LambdaRun)> {
    let deployment = args.connect().await?;
    let request = RunRequest {
        plan: common.plan.options(),
        bound: common.bound(),
        checkpoint: common.checkpoint_request(),
        checkpoint_interval: common.checkpoint_interval.map(|n| n as u64),
        verify: common.verify,
        autoscale: common.autoscale,
    };
    let run = skein_lambda::run::run(&deployment, sql, &request).await?;
    let report = report(&run, common.plan.invoke_async)?;
    Ok((report, run))
}

/// The report of a run on Lambda; the cost section prices what the
/// functions reported of every invocation (skein_engine::usage).
fn report(run: &LambdaRun, invoke_async: bool) -> Result<Report> {
    let events = run.epochs.events;
    let mut cost = crate::cost::report::section(
        &crate::cost::report::measured_on_lambda(events, &run.usage, run.driver_puts),
        None,
        &Default::default(),
    )?;
    cost.measured_on = Some(crate::cost::report::lambda_note(invoke_async));
    Ok(Report {
        query: None,
        query_code: run.plan.query_code.clone(),
        stages: run.plan.stages.len(),
        functions: run.deployed.len(),
        invocations: run.usage.invocations,
        payload_bytes: run.usage.payload_bytes,
        events,
        events_per_s: Report::rate(events, run.elapsed_s).round(),
        result_rows: run.rows.iter().map(|b| b.num_rows()).sum(),
        verified: run.comparison.as_ref().map(|c| c.equal),
        epochs: run.epochs.epochs,
        elapsed_s: run.elapsed_s,
        late_rows: None,
        late_rows_by_table: None,
        checkpoint_dir: run.checkpoints.clone(),
        resumed_after: run.epochs.resumed.map(|c| c.epoch),
        stopped: Stopped::Bound,
        blackhole: None,
        lambda: Some(OnLambda {
            backend: "lambda".into(),
            deploy_s: run.deploy_s,
            spilled_contexts: run.deployed.iter().filter(|d| d.spilled).count(),
            dead_letters: run.dead_letters.len(),
            recoveries: run.epochs.recoveries,
        }),
        cost,
        rows: run.rows.clone(),
    })
}
