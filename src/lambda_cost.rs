//! `skein cost --backend lambda`: the measured epochs run on Lambda through
//! `skein run --backend lambda`'s path, checkpointed every epoch to a
//! scratch location that is deleted afterwards, as are the functions.

use anyhow::{Context, Result};
use skein_cost::Measured;
use skein_lambda::LambdaFunctionService;

use crate::cost::CostArgs;
use crate::run::CommonRunArgs;

/// Run `sql` (generator tables already at the rate) for `epochs` on
/// Lambda: what its functions reported, and how many there were.
pub(crate) async fn measure(sql: &str, args: &CostArgs, epochs: u64) -> Result<(Measured, usize)> {
    let scratch = format!(
        "{}/skein/cost-scratch/{}",
        args.lambda.store.trim_end_matches('/'),
        crate::lambda_cmd::run_id()
    );
    let common = CommonRunArgs {
        epochs: Some(epochs),
        duration: None,
        until_drained: false,
        interval: None,
        plan: args.plan.clone(),
        verify: false,
        metrics: None,
        checkpoint_dir: Some(scratch.clone().into()),
        no_checkpoint: false,
        checkpoint_interval: Some(args.checkpoint_interval() as usize),
        json: true,
        show: 0,
    };
    let run = crate::lambda_run::run_sql(sql, &common, &args.lambda).await;
    let cleaned = clean_up(&scratch, &skein_engine::planner::query_code(sql)).await;
    let run = run?;
    run.failures()?;
    cleaned?;
    Ok((run.report.cost.measured.clone(), run.report.functions))
}

/// Delete the scratch checkpoints and the query's functions.
async fn clean_up(scratch: &str, query_code: &str) -> Result<()> {
    let (store, root) = skein_lambda::checkpoints::locate(scratch)?;
    crate::lambda_standing::delete_under(&store, &root).await?;
    let sdk = skein_lambda::sdk_config().await;
    skein_engine::driver::destroy(query_code, &LambdaFunctionService::new(&sdk, None))
        .await
        .context("deleting the measured query's functions")?;
    Ok(())
}
