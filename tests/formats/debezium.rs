//! A Debezium change stream as an updating table: products created,
//! updated and deleted (as Debezium's JSON converter and, through the
//! Confluent serializer, its Avro converter write them), joined with a
//! stream of orders and aggregated, gives the final table computed here
//! from the same events: revenue per category over the products as they
//! stand at the end.

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{common, final_rows, produce, temp_dir};

#[derive(Debug, Clone, PartialEq)]
struct Product {
    id: i64,
    category: String,
    price: i64,
}

impl Product {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({"id": self.id, "category": self.category, "price": self.price})
    }
}

/// A change event: op, before, after (None: a tombstone).
type Change = Option<(&'static str, Option<Product>, Option<Product>)>;

/// Snapshot reads, creates, updates, deletes each followed by a tombstone,
/// as a connector emits them; and the table they leave.
fn changes() -> (Vec<Change>, BTreeMap<i64, Product>) {
    let mut rng = SmallRng::seed_from_u64(23);
    let mut table: BTreeMap<i64, Product> = BTreeMap::new();
    let mut out = vec![];
    let category =
        |rng: &mut SmallRng| ["books", "games", "tools"][rng.random_range(0..3)].to_string();
    for id in 0..30 {
        let p = Product {
            id,
            category: category(&mut rng),
            price: rng.random_range(1..100),
        };
        out.push(Some((
            if id < 10 { "r" } else { "c" },
            None,
            Some(p.clone()),
        )));
        table.insert(id, p);
    }
    for step in 0..60 {
        let id = rng.random_range(0..30);
        let Some(before) = table.get(&id).cloned() else {
            continue;
        };
        if step % 12 == 11 {
            out.push(Some(("d", Some(before), None)));
            out.push(None);
            table.remove(&id);
        } else {
            let mut after = before.clone();
            after.price = rng.random_range(1..100);
            if rng.random_bool(0.3) {
                after.category = category(&mut rng);
            }
            out.push(Some(("u", Some(before), Some(after.clone()))));
            table.insert(id, after);
        }
    }
    (out, table)
}

/// Orders: (order id, product id, quantity); some name no product.
fn orders() -> Vec<(i64, i64, i64)> {
    let mut rng = SmallRng::seed_from_u64(5);
    (0..400)
        .map(|i| (i, rng.random_range(0..34), rng.random_range(1..5)))
        .collect()
}

/// Revenue and order count per category, over the final products.
fn reference(products: &BTreeMap<i64, Product>) -> Vec<String> {
    let mut per: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (_, product, qty) in orders() {
        if let Some(p) = products.get(&product) {
            let e = per.entry(p.category.clone()).or_default();
            e.0 += qty * p.price;
            e.1 += 1;
        }
    }
    per.into_iter()
        .map(|(c, (revenue, n))| format!("{c} | {revenue} | {n}"))
        .collect()
}

fn query(brokers: &str, cdc: &str, orders: &str, format: &str, dlt: &str) -> String {
    format!(
        "CREATE EXTERNAL TABLE products (id BIGINT NOT NULL, category VARCHAR NOT NULL, price BIGINT NOT NULL)
           STORED AS KAFKA LOCATION '{cdc}'
           OPTIONS ('bootstrap.servers' '{brokers}', {format}, 'dead.letter.topic' '{dlt}');
         CREATE EXTERNAL TABLE orders (order_id BIGINT NOT NULL, product_id BIGINT NOT NULL, qty BIGINT NOT NULL)
           STORED AS KAFKA LOCATION '{orders}' OPTIONS ('bootstrap.servers' '{brokers}', 'format' 'json');
         SELECT p.category, sum(o.qty * p.price) AS revenue, count(*) AS orders
         FROM orders o JOIN products p ON o.product_id = p.id
         GROUP BY p.category"
    )
}

fn write_orders(brokers: &str, topic: &str) {
    let w = common::kafka::PartitionWriter::new(brokers, topic);
    for (id, product, qty) in orders() {
        w.send(
            0,
            &serde_json::json!({"order_id": id, "product_id": product, "qty": qty}).to_string(),
        );
    }
    w.flush();
}

#[test]
fn a_debezium_json_topic_joined_with_a_stream_gives_the_reference_table() {
    let brokers = common::require_kafka();
    let cdc = common::unique_name("formats-cdc");
    let (events, products) = changes();
    let w = common::kafka::PartitionWriter::new(&brokers, &cdc);
    for (i, e) in events.iter().enumerate() {
        match e {
            None => w.send(0, ""),
            Some((op, before, after)) => {
                let event = serde_json::json!({
                    "before": before.as_ref().map(Product::json),
                    "after": after.as_ref().map(Product::json),
                    "source": {"connector": "postgresql", "table": "products", "lsn": i},
                    "op": op,
                    "ts_ms": 1_700_000_000_000i64 + i as i64,
                });
                // Half as the JSON converter writes them with schemas enabled.
                let event = match i % 2 {
                    0 => event,
                    _ => serde_json::json!({"schema": {"type": "struct"}, "payload": event}),
                };
                w.send(0, &event.to_string())
            }
        }
    }
    // An update without its before image cannot be applied: a dead letter.
    w.send(
        0,
        r#"{"before": null, "after": {"id": 1, "category": "x", "price": 1}, "op": "u"}"#,
    );
    w.flush();
    let orders = format!("{cdc}-orders");
    write_orders(&brokers, &orders);
    let dlt = format!("{cdc}-dead");
    let sql = query(&brokers, &cdc, &orders, "'format' 'debezium-json'", &dlt);
    let expected = reference(&products);
    assert_eq!(expected.len(), 3);
    assert_eq!(final_rows(&sql, &["--group-size", "2"]), expected);
    let letters = common::kafka::committed_records(&brokers, &dlt);
    assert_eq!(letters.len(), 1);
    let letter: serde_json::Value = serde_json::from_slice(&letters[0].2).unwrap();
    assert!(
        letter["reason"]
            .as_str()
            .unwrap()
            .contains("without 'before'"),
        "{letter}"
    );
}

/// Debezium's Avro envelope for the products table.
const ENVELOPE: &str = r#"{"type":"record","name":"Envelope","namespace":"pg.public.products","fields":[
  {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
     {"name":"id","type":"int"},{"name":"category","type":"string"},{"name":"price","type":"long"},
     {"name":"note","type":["null","string"],"default":null}]}],"default":null},
  {"name":"after","type":["null","Value"],"default":null},
  {"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql",
     "fields":[{"name":"connector","type":"string"},{"name":"lsn","type":["null","long"],"default":null}]}},
  {"name":"op","type":"string"},
  {"name":"ts_ms","type":["null","long"],"default":null}]}"#;

#[test]
fn a_debezium_avro_topic_joined_with_a_stream_gives_the_reference_table() {
    let brokers = common::require_kafka();
    let cdc = common::unique_name("formats-cdc-avro");
    let (events, products) = changes();
    let row = |p: &Option<Product>| {
        p.as_ref().map(|p| {
            serde_json::json!({"id": p.id, "category": p.category, "price": p.price, "note": null})
        })
    };
    let lines: Vec<String> = events
        .iter()
        .enumerate()
        .map(|(i, e)| match e {
            None => r#"{"tombstone": true}"#.to_string(),
            Some((op, before, after)) => serde_json::json!({
                "before": row(before),
                "after": row(after),
                "source": {"connector": "postgresql", "lsn": i},
                "op": op,
                "ts_ms": 1_700_000_000_000i64 + i as i64,
            })
            .to_string(),
        })
        .collect();
    let schema = temp_dir("formats-cdc").join("envelope.avsc");
    std::fs::write(&schema, ENVELOPE).unwrap();
    produce(
        &["records", &brokers, &cdc, schema.to_str().unwrap()],
        &lines.join("\n"),
    );
    let orders = format!("{cdc}-orders");
    write_orders(&brokers, &orders);
    let envelope = ENVELOPE.replace('\n', " ");
    let format = format!("'format' 'debezium-avro-confluent', 'avro.schema' '{envelope}'");
    let sql = query(&brokers, &cdc, &orders, &format, &format!("{cdc}-dead"));
    assert_eq!(
        final_rows(&sql, &["--group-size", "2"]),
        reference(&products)
    );
}
