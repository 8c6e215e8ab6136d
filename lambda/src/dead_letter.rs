//! Dead letters of async invocations. Every function of a query has the
//! query's dead-letter function `<query-code>-dlq` (the same binary) as its
//! on-failure destination: after Lambda's retries, Lambda invokes it with
//! the failed request and the error, and it records them in the object store
//! under `skein/dead-letters/<query-code>/`, where `skein run` and `skein
//! status` count them.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::Value;
use skein_engine::Result;
use skein_engine::checkpoint::PoisonRecord;

pub const PREFIX: &str = "skein/dead-letters";

/// Where dead letters go once the epochs they failed were run again from
/// the last commit: kept for a reader, no longer holding up commits.
pub const HANDLED_PREFIX: &str = "skein/dead-letters-handled";

/// The dead-letter function of a query.
pub fn function_name(query_code: &str) -> String {
    format!("{query_code}-dlq")
}

/// Whether a payload is Lambda's on-failure record of an async invocation.
pub fn is_failure_record(payload: &Value) -> bool {
    payload.get("requestContext").is_some() && payload.get("requestPayload").is_some()
}

/// Record a failure record; returns its key. The key is derived from the
/// failed function's name (`...:function:<name>`) and the request id.
pub async fn record(
    store: &Arc<dyn ObjectStore>,
    payload: &Value,
    request_id: &str,
) -> Result<String> {
    let arn = payload["requestContext"]["functionArn"]
        .as_str()
        .unwrap_or_default();
    let function = arn
        .rsplit(':')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("unknown");
    let query = function.rsplitn(3, '-').nth(2).unwrap_or(function);
    let key = format!("{PREFIX}/{query}/{function}-{request_id}.json");
    let body = serde_json::to_vec_pretty(payload).expect("JSON value serialises");
    store
        .put(&StorePath::from(key.as_str()), body.into())
        .await?;
    Ok(key)
}

/// Record a pushed record the function could not take (see
/// docs/lambda.md, poison records); returns its key. The key names the
/// shard and sequence number, so a redelivery overwrites the same letter.
pub async fn record_poison(
    store: &Arc<dyn ObjectStore>,
    query_code: &str,
    function: &str,
    poison: &PoisonRecord,
) -> Result<String> {
    let key = format!(
        "{PREFIX}/{query_code}/{function}-poison-{}-{}.json",
        poison.partition, poison.position
    );
    let body = serde_json::json!({
        "poison": true,
        "function": function,
        "shard": poison.partition,
        "sequence_number": poison.position,
        "reason": poison.reason,
    });
    store
        .put(
            &StorePath::from(key.as_str()),
            serde_json::to_vec_pretty(&body)
                .expect("JSON value serialises")
                .into(),
        )
        .await?;
    Ok(key)
}

/// The failure records of a query.
pub async fn list(store: &Arc<dyn ObjectStore>, query_code: &str) -> Result<Vec<Value>> {
    let mut out = vec![];
    for key in collect_keys(store, &format!("{PREFIX}/{query_code}")).await? {
        let bytes = store.get(&key).await?.bytes().await?;
        out.push(serde_json::from_slice(&bytes).unwrap_or(Value::Null));
    }
    Ok(out)
}

/// Move the query's dead letters aside (under [`HANDLED_PREFIX`]): every
/// instance was replaced and the epochs after the last commit run again, so
/// the failures they record are accounted for. Returns how many moved.
pub async fn set_aside(store: &Arc<dyn ObjectStore>, query_code: &str) -> Result<usize> {
    let keys = collect_keys(store, &format!("{PREFIX}/{query_code}")).await?;
    for key in &keys {
        let to = StorePath::from(key.as_ref().replacen(PREFIX, HANDLED_PREFIX, 1));
        store.copy(key, &to).await?;
        store.delete(key).await?;
    }
    Ok(keys.len())
}

/// Keys under a prefix, sorted.
async fn collect_keys(store: &Arc<dyn ObjectStore>, prefix: &str) -> Result<Vec<StorePath>> {
    let mut keys: Vec<StorePath> = store
        .list(Some(&StorePath::from(prefix)))
        .map_ok(|m| m.location)
        .try_collect()
        .await?;
    keys.sort();
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use serde_json::json;

    #[tokio::test]
    async fn records_are_kept_per_query() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let record_of = |f: &str| {
            json!({
                "requestContext": {"functionArn": format!("arn:aws:lambda:us-east-1:0:function:{f}")},
                "requestPayload": {"uuid": {}}, "responsePayload": {"errorMessage": "bad"}
            })
        };
        assert!(is_failure_record(&record_of("qabc-02-01")));
        assert!(!is_failure_record(&json!({"uuid": {}})));
        record(&store, &record_of("qabc-02-01"), "r1")
            .await
            .unwrap();
        record(&store, &record_of("qother-01-00"), "r2")
            .await
            .unwrap();
        assert_eq!(list(&store, "qabc").await.unwrap().len(), 1);
        assert_eq!(function_name("qabc"), "qabc-dlq");

        // Set aside after a recovery: no longer listed, still kept, and
        // another query's letters stay where they are.
        assert_eq!(set_aside(&store, "qabc").await.unwrap(), 1);
        assert!(list(&store, "qabc").await.unwrap().is_empty());
        assert_eq!(list(&store, "qother").await.unwrap().len(), 1);
        let kept = collect_keys(&store, &format!("{HANDLED_PREFIX}/qabc"))
            .await
            .unwrap();
        assert_eq!(kept.len(), 1);
    }
}
