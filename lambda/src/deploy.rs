//! Deploying a planned query as Lambda functions.
//!
//! Like `skein_engine::driver::deploy`, with one difference Lambda needs:
//! the context is spilled whenever the whole environment, not only the
//! context, would pass Lambda's 4 KB limit. (The planner already gives every
//! function that receives payloads concurrency 1: its arena lives in one
//! warm instance.)

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use skein_engine::Result;
use skein_engine::context::{CONTEXT_ENV, CloudContext, LAMBDA_ENV_LIMIT};
use skein_engine::invoke::{FunctionService, FunctionSpec};
use skein_engine::planner::{PlanOptions, QueryPlan};

/// One deployed function.
#[derive(Debug, Clone)]
pub struct Deployed {
    pub name: String,
    pub concurrency: usize,
    /// Whether the context was spilled to the object store.
    pub spilled: bool,
}

/// Create or update every function of the query. `extra_env` is what the
/// service adds to each function's environment (it counts toward the limit).
pub async fn deploy(
    plan: &QueryPlan,
    service: &dyn FunctionService,
    store: &Arc<dyn ObjectStore>,
    options: &PlanOptions,
    epochs: Option<u64>,
    extra_env: &BTreeMap<String, String>,
) -> Result<Vec<Deployed>> {
    let extra: usize = extra_env.iter().map(|(k, v)| k.len() + v.len()).sum();
    let mut out = vec![];
    for (ctx, concurrency) in plan.contexts(options, epochs)? {
        let value = context_value(&ctx, store, extra).await?;
        let spilled = value.starts_with("store:");
        let name = ctx.function_name();
        let environment = BTreeMap::from([(CONTEXT_ENV.to_string(), value)]);
        service
            .create(FunctionSpec {
                name: name.clone(),
                environment,
                concurrency,
            })
            .await?;
        out.push(Deployed {
            name,
            concurrency,
            spilled,
        });
    }
    Ok(out)
}

/// The context's environment value: inline if the environment stays under
/// the limit, else a reference to it in the store (as `CloudContext::to_env`
/// writes it, which only counts the context itself).
async fn context_value(
    ctx: &CloudContext,
    store: &Arc<dyn ObjectStore>,
    extra: usize,
) -> Result<String> {
    let value = ctx.to_env(store).await?;
    if value.starts_with("store:") || value.len() + CONTEXT_ENV.len() + extra <= LAMBDA_ENV_LIMIT {
        return Ok(value);
    }
    let key = format!(
        "skein/contexts/{}",
        hex::encode(Sha256::digest(value.as_bytes()))
    );
    store
        .put(&StorePath::from(key.as_str()), value.into_bytes().into())
        .await?;
    Ok(format!("store:{key}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use skein_engine::context::{NextHop, StageMode};
    use skein_engine::payload::Encoding;

    #[tokio::test]
    async fn context_near_the_limit_is_spilled_when_extras_would_pass_it() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let ctx = CloudContext {
            query_code: "q".into(),
            stage: 0,
            member: 0,
            members: 1,
            mode: StageMode::Stream,
            plan: vec![7; 100],
            inputs: vec![],
            sources: vec![],
            next: NextHop::Single { stage: 1 },
            extra_outputs: vec![],
            encoding: Encoding::Zstd,
            invoke_async: false,
            epochs: None,
            run: String::new(),
            checkpoint: None,
            updating: None,
        };
        let inline = context_value(&ctx, &store, 10).await.unwrap();
        assert!(!inline.starts_with("store:"));
        let spilled = context_value(&ctx, &store, LAMBDA_ENV_LIMIT).await.unwrap();
        assert!(spilled.starts_with("store:"), "{spilled}");
        assert_eq!(
            CloudContext::from_env(&spilled, Some(&store))
                .await
                .unwrap(),
            ctx
        );
    }
}
