//! `skein rescale QUERY.sql --stage N --group-size M`: change a function
//! group's size while the query runs. The request goes into the query's
//! checkpoint store; the running driver carries it out right after its
//! next commit (a query not running takes it when it starts), moving whole
//! key groups between members. `skein status` shows the sizes. On Lambda
//! (`--backend lambda`, a deployed standing query) every member function
//! of the group was deployed at its first size, so it changes size within
//! it (lambda/src/rescale.rs).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde_json::json;
use skein_engine::checkpoint::{Layout, RescaleRequest};

use crate::PlanArgs;
use crate::lambda::Backend;
use crate::status::{lambda_store, local_store};

#[derive(Args, Debug)]
pub struct RescaleArgs {
    /// The query's SQL file.
    pub query: String,
    /// The stage whose group changes size (`skein explain` or `skein
    /// status` lists them).
    #[arg(long)]
    pub stage: u32,
    /// Its new size: 1 up to its key groups (the --group-size the query
    /// first ran with).
    #[arg(long = "group-size", visible_alias = "members")]
    pub members: u32,
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,
    /// The local checkpoint directory (default .skein/checkpoints/<query-code>).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// The deployment's store, where a Lambda query's spec is.
    #[arg(long, env = "SKEIN_STORE", default_value = "s3://skein")]
    pub store: String,
    #[arg(long)]
    pub json: bool,
}

pub async fn rescale(args: RescaleArgs) -> Result<()> {
    let (plan, store) = match args.backend {
        // Its standing spec says how it was planned; the driver on Lambda
        // carries the request out after its next commit.
        Backend::Lambda => {
            let (plan, store, _) = lambda_store(&args.query, &args.store).await?;
            (plan, store)
        }
        Backend::Local => {
            // Planned as the query first ran (its store's manifest says how).
            let planning = PlanArgs {
                group_size: None,
                encoding: Default::default(),
                invoke_async: false,
                state_ttl: None,
                state_memory: None,
            };
            let (plan, store, _) =
                local_store(&args.query, args.checkpoint_dir.as_ref(), &planning).await?;
            (plan, store)
        }
    };
    let mut layout = plan.layout();
    if let Some((_, committed)) = store.committed_in().await? {
        layout.extend(committed);
    }
    plan.with_layout(&layout)?
        .with_layout(&Layout::from([(args.stage, args.members)]))?;
    let request = RescaleRequest {
        stage: args.stage,
        members: args.members,
    };
    store.ask_rescale(request).await?;
    let was = layout.get(&args.stage).copied().unwrap_or_default();
    if args.json {
        println!(
            "{}",
            json!({"query_code": plan.query_code, "stage": args.stage, "from": was,
                   "to": args.members, "asked": true})
        );
    } else {
        println!(
            "stage {} of query {}: {} -> {} members, asked; the driver carries it out after \
             its next commit",
            args.stage, plan.query_code, was, args.members
        );
    }
    Ok(())
}
