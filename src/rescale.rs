//! `skein rescale QUERY.sql --stage N --group-size M`: change a function
//! group's size while the query runs. The request goes into the query's
//! checkpoint store; the running driver carries it out right after its
//! next commit (a query not running takes it when it starts), moving whole
//! key groups between members. `skein status` shows the sizes.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use serde_json::json;
use skein_engine::checkpoint::{Layout, RescaleRequest};

use crate::PlanArgs;
use crate::lambda::Backend;
use crate::status::local_store;

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
    #[arg(long)]
    pub json: bool,
}

pub async fn rescale(args: RescaleArgs) -> Result<()> {
    if args.backend == Backend::Lambda {
        bail!(
            "skein rescale runs in-process queries only so far; a query on Lambda keeps the \
             size it was deployed with"
        );
    }
    // Planned as the query first ran (its store's manifest says how).
    let planning = PlanArgs {
        group_size: None,
        encoding: Default::default(),
        invoke_async: false,
        state_ttl: None,
        state_memory: None,
    };
    let (plan, store, _) = local_store(&args.query, args.checkpoint_dir.as_ref(), &planning).await?;
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
