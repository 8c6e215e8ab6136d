//! Redis smoke test: plain commands and an atomic MULTI/EXEC pipeline (the
//! shape of the Redis sink's result + offset write) on the real server.

use crate::common;

use redis::AsyncCommands;

#[tokio::test]
async fn redis_round_trip() {
    let url = common::require_redis();
    let client = redis::Client::open(url.as_str()).expect("redis URL");
    let mut con = common::within(
        10,
        "connecting to Redis",
        client.get_multiplexed_async_connection(),
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to {url}: {e} ({})", common::START_HINT));

    let key = common::unique_name("skein-smoke");
    let offsets = format!("{key}:offsets");

    let _: () = con.set_ex(&key, "hello", 60).await.expect("SET");
    let value: String = con.get(&key).await.expect("GET");
    assert_eq!(value, "hello");

    // Result and source offset in one atomic step.
    let (count, offset): (i64, String) = redis::pipe()
        .atomic()
        .set(&key, 41)
        .ignore()
        .incr(&key, 1)
        .hset(&offsets, "partition-0", "1234")
        .ignore()
        .hget(&offsets, "partition-0")
        .query_async(&mut con)
        .await
        .expect("MULTI/EXEC");
    assert_eq!((count, offset.as_str()), (42, "1234"));

    let removed: i64 = con.del(&[&key, &offsets]).await.expect("DEL");
    assert_eq!(removed, 2);
}
