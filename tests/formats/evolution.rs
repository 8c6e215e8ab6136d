//! A schema that evolves mid-topic loses nothing: the Confluent serializer
//! writes readings with version 1 of the subject's schema (`value` an
//! `int`), then version 2 (`value` a `long`, a new field `unit` with a
//! default), and a record with an id the registry does not know. The table
//! reads each record by the id it carries, resolved against its columns.
//! Then the registry goes away, and `skein status` of the query says so.
//!
//! A table that declares no columns takes those of the subject's latest
//! schema; records of the version before it, which lacks a field the latest
//! added with a default, take that default (Avro's resolution: the latest
//! schema is the reader's) instead of being dead letters.
//!
//! No registry server can be installed here (docs/formats.md), so the test
//! serves, over HTTP, the Confluent REST answer for exactly the schemas the
//! serializer's registry assigned ids to (`GET /schemas/ids/<id>`), the
//! subject's latest version (`GET /subjects/<subject>/versions/latest`) when
//! a test says which it is, and 404 with the registry's error body for
//! anything else.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{common, final_rows, produce, temp_dir};
use skein_engine::status::QueryStatus;

const V1: &str = r#"{"type":"record","name":"Reading","namespace":"skein.tests","fields":[{"name":"sensor","type":"string"},{"name":"value","type":"int"}]}"#;
const V2: &str = r#"{"type":"record","name":"Reading","namespace":"skein.tests","fields":[{"name":"sensor","type":"string"},{"name":"value","type":"long"},{"name":"unit","type":["null","string"],"default":null}]}"#;

/// Serves `schemas` (id -> schema text) as a schema registry's
/// `GET /schemas/ids/<id>`, and with `latest` (a subject and an id) that
/// schema as the subject's latest version, on a port of 127.0.0.1 until
/// dropped.
struct Schemas {
    url: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Schemas {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept; the port is closed once the thread ends.
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn serve_schemas(schemas: BTreeMap<String, String>, latest: Option<(&str, &str)>) -> Schemas {
    let latest = latest.map(|(subject, id)| {
        (
            format!("/subjects/{subject}/versions/latest"),
            serde_json::json!({
                "subject": subject,
                "version": schemas.len(),
                "id": id.parse::<u32>().unwrap(),
                "schema": schemas[id],
            }),
        )
    });
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            if stopped.load(Ordering::SeqCst) {
                return;
            }
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut first = String::new();
            reader.read_line(&mut first).unwrap_or_default();
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let path = first.split_whitespace().nth(1).unwrap_or_default();
            let id = path.strip_prefix("/schemas/ids/").unwrap_or_default();
            let (status, body) = match (schemas.get(id), &latest) {
                (Some(s), _) => ("200 OK", serde_json::json!({ "schema": s })),
                (None, Some((latest, body))) if path == latest => ("200 OK", body.clone()),
                (None, _) => (
                    "404 Not Found",
                    serde_json::json!({"error_code": 40403, "message": "Schema not found"}),
                ),
            };
            let body = body.to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Schemas {
        url,
        stop,
        thread: Some(thread),
    }
}

#[test]
fn a_schema_evolving_mid_topic_loses_nothing() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("formats-evolution");
    let dlt = format!("{topic}-dead");
    let dir = temp_dir("formats-evolution");
    let (v1, v2, ids) = (
        dir.join("v1.avsc"),
        dir.join("v2.avsc"),
        dir.join("ids.json"),
    );
    std::fs::write(&v1, V1).unwrap();
    std::fs::write(&v2, V2).unwrap();
    let lines = [
        r#"{"sensor": "a", "value": 1}"#.to_string(),
        r#"{"sensor": "b", "value": 2}"#.to_string(),
        serde_json::json!({ "schema": v2 }).to_string(),
        r#"{"sensor": "c", "value": 3000000000, "unit": "kW"}"#.to_string(),
        r#"{"sensor": "d", "value": 4, "unit": null}"#.to_string(),
        // Schema id 99, which the registry does not know.
        r#"{"raw_hex": "00000000630261"}"#.to_string(),
        r#"{"sensor": "e", "value": 5, "unit": "W"}"#.to_string(),
    ];
    produce(
        &[
            "records",
            &brokers,
            &topic,
            v1.to_str().unwrap(),
            ids.to_str().unwrap(),
        ],
        &lines.join("\n"),
    );
    let schemas: BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(&ids).unwrap()).unwrap();
    assert_eq!(schemas.len(), 2, "two versions, two ids: {schemas:?}");
    let registry = serve_schemas(schemas, None);
    let url = registry.url.clone();
    let sql = format!(
        "CREATE EXTERNAL TABLE readings (sensor VARCHAR NOT NULL, value BIGINT NOT NULL, unit VARCHAR)
         STORED AS KAFKA LOCATION '{topic}' OPTIONS ('bootstrap.servers' '{brokers}',
           'format' 'avro-confluent', 'schema.registry.url' '{url}',
           'dead.letter.topic' '{dlt}');
         SELECT sensor, value, coalesce(unit, '-') FROM readings"
    );
    let checkpoints = dir.join("checkpoints");
    let checkpoints = checkpoints.to_str().unwrap();
    assert_eq!(
        final_rows(&sql, &["--checkpoint-dir", checkpoints]),
        [
            "a | 1 | -",
            "b | 2 | -",
            "c | 3000000000 | kW",
            "d | 4 | -",
            "e | 5 | W"
        ]
    );
    let letters: Vec<serde_json::Value> = common::kafka::committed_records(&brokers, &dlt)
        .into_iter()
        .map(|(_, _, v)| serde_json::from_slice(&v).unwrap())
        .collect();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let reason = letters[0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("schema id 99: HTTP 404"), "{reason}");
    assert_eq!(reason.matches("schema id").count(), 1, "{reason}");

    // The registry goes away: `skein status` of the query names it.
    drop(registry);
    let query = dir.join("q.sql");
    std::fs::write(&query, &sql).unwrap();
    let (ok, stdout, stderr) = common::skein(&[
        "status",
        query.to_str().unwrap(),
        "--checkpoint-dir",
        checkpoints,
        "--json",
    ]);
    assert!(ok, "skein status: {stderr}");
    let status: QueryStatus = serde_json::from_str(stdout.trim()).unwrap();
    let problems = &status.problems;
    assert_eq!(problems.len(), 1, "{status:?}");
    let problem = &problems[0];
    assert!(
        problem.starts_with("readings: ") && problem.contains(&format!("schema registry {url}")),
        "{problem}"
    );
}

const ORDER_V1: &str = r#"{"type":"record","name":"Order","namespace":"skein.tests","fields":[{"name":"id","type":"long"},{"name":"cents","type":"long"}]}"#;
const ORDER_V2: &str = r#"{"type":"record","name":"Order","namespace":"skein.tests","fields":[{"name":"id","type":"long"},{"name":"cents","type":"long"},{"name":"channel","type":"string","default":"web"}]}"#;

#[test]
fn columns_from_the_latest_schema_read_older_records_with_its_defaults() {
    let brokers = common::require_kafka();
    let topic = common::unique_name("formats-defaults");
    let dlt = format!("{topic}-dead");
    let dir = temp_dir("formats-defaults");
    let (v1, v2, ids) = (
        dir.join("v1.avsc"),
        dir.join("v2.avsc"),
        dir.join("ids.json"),
    );
    std::fs::write(&v1, ORDER_V1).unwrap();
    std::fs::write(&v2, ORDER_V2).unwrap();
    // (id, cents, channel): None for the records written with version 1.
    let orders: Vec<(i64, i64, Option<&str>)> = (1..=12)
        .map(|i| match i {
            1..=6 => (i, i * 150, None),
            _ => (i, i * 150, Some(if i % 2 == 0 { "app" } else { "store" })),
        })
        .collect();
    let mut lines = vec![];
    for (k, (id, cents, channel)) in orders.iter().enumerate() {
        if k > 0 && orders[k - 1].2.is_none() && channel.is_some() {
            lines.push(serde_json::json!({ "schema": v2 }).to_string());
        }
        let mut record = serde_json::json!({"id": id, "cents": cents});
        if let Some(c) = channel {
            record["channel"] = (*c).into();
        }
        lines.push(record.to_string());
    }
    // Schema id 99, which the registry does not know.
    lines.push(r#"{"raw_hex": "00000000630261"}"#.to_string());
    produce(
        &[
            "records",
            &brokers,
            &topic,
            v1.to_str().unwrap(),
            ids.to_str().unwrap(),
        ],
        &lines.join("\n"),
    );
    let schemas: BTreeMap<String, String> =
        serde_json::from_slice(&std::fs::read(&ids).unwrap()).unwrap();
    assert_eq!(schemas.len(), 2, "two versions, two ids: {schemas:?}");
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
    let latest = schemas
        .iter()
        .find(|(_, s)| parse(s) == parse(ORDER_V2))
        .map(|(id, _)| id.clone())
        .expect("the serializer's registry holds version 2");
    let subject = format!("{topic}-value");
    let registry = serve_schemas(schemas, Some((&subject, &latest)));
    let url = registry.url.clone();
    let sql = format!(
        "CREATE EXTERNAL TABLE orders
         STORED AS KAFKA LOCATION '{topic}' OPTIONS ('bootstrap.servers' '{brokers}',
           'format' 'avro-confluent', 'schema.registry.url' '{url}',
           'dead.letter.topic' '{dlt}');
         SELECT id, cents, channel FROM orders"
    );

    // The columns are those of version 2, `channel` among them.
    let query = dir.join("q.sql");
    std::fs::write(&query, &sql).unwrap();
    let (ok, stdout, stderr) = common::skein(&["explain", query.to_str().unwrap(), "--json"]);
    assert!(ok, "skein explain: {stderr}");
    let plan: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let columns: Vec<(String, String, bool)> = plan["tables"][0]["columns"]
        .as_array()
        .expect("the table's columns")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["type"].as_str().unwrap().to_string(),
                c["nullable"].as_bool().unwrap(),
            )
        })
        .collect();
    let names: Vec<&str> = columns.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, ["id", "cents", "channel"], "{plan}");
    assert_eq!(columns[2], ("channel".into(), "VARCHAR".into(), false));

    // Expected: every record, version 1's with version 2's default.
    let v2: serde_json::Value = parse(ORDER_V2);
    let default = v2["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "channel")
        .and_then(|f| f["default"].as_str())
        .unwrap();
    let mut expected: Vec<String> = orders
        .iter()
        .map(|(id, cents, channel)| format!("{id} | {cents} | {}", channel.unwrap_or(default)))
        .collect();
    expected.sort();
    let checkpoints = dir.join("checkpoints");
    let rows = final_rows(&sql, &["--checkpoint-dir", checkpoints.to_str().unwrap()]);
    assert_eq!(rows, expected);
    assert_eq!(rows.iter().filter(|r| r.ends_with("| web")).count(), 6);

    // Only the record of an unknown id is a dead letter.
    let letters: Vec<serde_json::Value> = common::kafka::committed_records(&brokers, &dlt)
        .into_iter()
        .map(|(_, _, v)| serde_json::from_slice(&v).unwrap())
        .collect();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let reason = letters[0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("schema id 99: HTTP 404"), "{reason}");
    assert_eq!(reason.matches("schema id").count(), 1, "{reason}");
}
