//! A Redis lookup table for NEXMARK bids: the seller of every second
//! auction, under a prefix of the test's own, so the query (and its code)
//! is new each run.

/// Sets `<prefix>:auction:<id>` to `seller-<id>` for every second auction
/// id from 1000 below `end`; returns the declaration of the lookup table
/// `sellers (id BIGINT NOT NULL, seller VARCHAR)` over them. The other
/// auctions have no seller.
pub fn declare(name: &str, end: i64) -> String {
    let url = super::require_redis();
    let prefix = super::unique_name(name);
    let mut con = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("Redis");
    let mut pipe = redis::pipe();
    for id in (1000..end).step_by(2) {
        pipe.set(format!("{prefix}:auction:{id}"), format!("seller-{id}"));
    }
    let _: () = pipe.query(&mut con).expect("writing the sellers");
    format!(
        "CREATE EXTERNAL TABLE sellers (id BIGINT NOT NULL, seller VARCHAR)
           STORED AS REDIS LOCATION '{url}'
           OPTIONS ('lookup.key' 'id', 'lookup.key.prefix' '{prefix}:auction:');"
    )
}
