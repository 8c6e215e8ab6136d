//! NEXMark q0–q8 over Kafka: the same events as JSON (`skein gen`), as Avro
//! and as Protobuf (re-written by the Confluent serializers) give the same
//! rows. The Avro tables declare no columns: they take them from the
//! schema. The Protobuf tables declare them, as the JSON ones must.

use std::path::PathBuf;
use std::sync::OnceLock;

use datafusion::arrow::datatypes::DataType;
use skein_generators::nexmark::{auction_schema, bid_schema, person_schema};

use super::{common, final_rows, produce, temp_dir};

const TABLES: [&str; 3] = ["person", "auction", "bid"];

/// The topics of one run: `<prefix>-{json,avro,pb}-<table>`.
struct Topics {
    brokers: String,
    prefix: String,
    schemas: PathBuf,
}

/// `skein gen nexmark` of 20,000 events over 20 s of event time (several
/// windows) to `to`.
fn gen_nexmark(to: &str, extra: &[&str]) {
    let mut args = vec![
        "gen",
        "nexmark",
        "--to",
        to,
        "--events",
        "20000",
        "--event-rate",
        "1000",
    ];
    args.extend_from_slice(extra);
    let (ok, _, stderr) = common::skein(&args);
    assert!(ok, "skein {args:?} failed:\n{stderr}");
}

/// Generated once for every test of this file.
fn topics() -> &'static Topics {
    static TOPICS: OnceLock<Topics> = OnceLock::new();
    TOPICS.get_or_init(|| {
        let brokers = common::require_kafka();
        let prefix = common::unique_name("formats-nx");
        let to = format!("kafka://{brokers}/{prefix}-json");
        gen_nexmark(&to, &[]);
        let schemas = temp_dir("formats-schemas");
        let dir = schemas.to_str().unwrap();
        for (format, tag) in [("avro", "avro"), ("protobuf", "pb")] {
            let from = format!("{prefix}-json");
            let to = format!("{prefix}-{tag}");
            produce(&["nexmark", &brokers, &from, &to, format, dir], "");
        }
        Topics {
            brokers,
            prefix,
            schemas,
        }
    })
}

/// The brokers and the topic of `table` in `format` (`json`, `avro`, `pb`).
pub(crate) fn topic(format: &str, table: &str) -> (String, String) {
    let t = topics();
    (t.brokers.clone(), format!("{}-{format}-{table}", t.prefix))
}

/// Where the Avro schemas and the descriptor set of the topics are.
pub(crate) fn schemas_dir() -> PathBuf {
    topics().schemas.clone()
}

/// A query over `bid` with one row that every bid counts in.
pub(crate) fn totals_sql() -> &'static str {
    "SELECT count(*) AS bids, sum(price) AS price, min(auction) AS first, max(bidder) AS last \
     FROM bid"
}

/// The declared columns of a NEXMark table.
pub(crate) fn columns(table: &str) -> String {
    let schema = match table {
        "person" => person_schema(),
        "auction" => auction_schema(),
        _ => bid_schema(),
    };
    schema
        .fields()
        .iter()
        .map(|f| {
            let t = match f.data_type() {
                DataType::Int64 => "BIGINT",
                DataType::Utf8 => "VARCHAR",
                _ => "TIMESTAMP",
            };
            format!("{} {t} NOT NULL", f.name())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The three tables of `format` and NEXMark query `query`.
fn sql(format: &str, query: u32) -> String {
    let t = topics();
    let mut sql = String::new();
    for table in TABLES {
        let common = format!(
            "'bootstrap.servers' '{}', 'event_time' 'date_time'",
            t.brokers
        );
        let (cols, location, options) = match format {
            "json" => (
                format!("({})", columns(table)),
                format!("{}-json-{table}", t.prefix),
                "'format' 'json'".to_string(),
            ),
            "avro" => (
                String::new(),
                format!("{}-avro-{table}", t.prefix),
                format!(
                    "'format' 'avro-confluent', 'avro.schema' '{}'",
                    t.schemas.join(format!("{table}.avsc")).display()
                ),
            ),
            _ => (
                format!("({})", columns(table)),
                format!("{}-pb-{table}", t.prefix),
                format!(
                    "'format' 'protobuf-confluent', 'protobuf.descriptor' '{}', \
                     'protobuf.message' 'nexmark.{}{}'",
                    t.schemas.join("nexmark.desc").display(),
                    table[..1].to_uppercase(),
                    &table[1..]
                ),
            ),
        };
        sql.push_str(&format!(
            "CREATE EXTERNAL TABLE {table} {cols} STORED AS KAFKA LOCATION '{location}' \
             OPTIONS ({common}, {options});\n"
        ));
    }
    let body = skein::run::nexmark_sql(query, 1, 1, 1).expect("NEXMark SQL");
    let body: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with("CREATE EXTERNAL TABLE"))
        .collect();
    sql + &body.join("\n")
}

fn same_rows_in_every_format(query: u32) {
    let flags = ["--group-size", "2"];
    let json = final_rows(&sql("json", query), &flags);
    assert!(
        !json.is_empty(),
        "q{query} gives no rows from JSON: a test that cannot fail"
    );
    let avro = final_rows(&sql("avro", query), &flags);
    assert_eq!(avro, json, "q{query}: Avro and JSON differ");
    let protobuf = final_rows(&sql("protobuf", query), &flags);
    assert_eq!(protobuf, json, "q{query}: Protobuf and JSON differ");
}

macro_rules! same_rows {
    ($($name:ident: $q:expr,)*) => {
        $(
            #[test]
            fn $name() {
                same_rows_in_every_format($q);
            }
        )*
    };
}

same_rows! {
    q0_same_rows_from_avro_and_protobuf: 0,
    q1_same_rows_from_avro_and_protobuf: 1,
    q2_same_rows_from_avro_and_protobuf: 2,
    q3_same_rows_from_avro_and_protobuf: 3,
    q4_same_rows_from_avro_and_protobuf: 4,
    q5_same_rows_from_avro_and_protobuf: 5,
    q6_same_rows_from_avro_and_protobuf: 6,
    q7_same_rows_from_avro_and_protobuf: 7,
    q8_same_rows_from_avro_and_protobuf: 8,
}

#[test]
fn explain_shows_the_columns_an_avro_table_takes_from_its_schema() {
    let t = topics();
    let path = temp_dir("formats-explain").join("q1.sql");
    std::fs::write(&path, sql("avro", 1)).unwrap();
    let (ok, stdout, stderr) = common::skein(&["explain", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("bid")
            && stdout.contains("auction BIGINT NOT NULL")
            && stdout.contains("date_time TIMESTAMP"),
        "{stdout}"
    );
    let _ = t;
}

/// q5's rows computed here from bids (auction, time in ms): the auctions
/// with the most bids in each 10 s window sliding by 5 s.
fn hot_items(bids: &[(i64, i64)]) -> Vec<(i64, i64, i64)> {
    let mut counts: std::collections::BTreeMap<(i64, i64), i64> = Default::default();
    for &(auction, t) in bids {
        let last = t - t.rem_euclid(5_000);
        for start in [last - 5_000, last] {
            *counts.entry((start, auction)).or_default() += 1;
        }
    }
    let mut best: std::collections::BTreeMap<i64, i64> = Default::default();
    for (&(start, _), &n) in &counts {
        let b = best.entry(start).or_default();
        *b = (*b).max(n);
    }
    counts
        .into_iter()
        .filter(|((start, _), n)| best[start] == *n)
        .map(|((start, auction), n)| (auction, n, start))
        .collect()
}

#[test]
fn gen_writes_avro_that_q5_reads() {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Int64Type, TimeUnit, TimestampMillisecondType};
    let brokers = common::require_kafka();
    let prefix = common::unique_name("formats-gen");
    let to = format!("kafka://{brokers}/{prefix}");
    gen_nexmark(&to, &["--format", "avro", "--table", "bid"]);
    let schema = skein_formats::avro::encode::schema_for(&bid_schema()).unwrap();
    let table = |query: &str| {
        format!(
            "CREATE EXTERNAL TABLE bid STORED AS KAFKA LOCATION '{prefix}' OPTIONS (
               'bootstrap.servers' '{brokers}', 'format' 'avro', 'avro.schema' '{schema}',
               'event_time' 'date_time');
             {query}"
        )
    };
    // The bids as read back, and q5 over them.
    let args = skein::run::CommonRunArgs::from_flags(["--until-drained", "--json"]).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (report, _) = rt
        .block_on(skein::run::run_report(
            &table("SELECT auction, date_time FROM bid"),
            &args,
            None,
        ))
        .unwrap();
    let millis = |c: &datafusion::arrow::array::ArrayRef| -> Vec<i64> {
        let t =
            datafusion::arrow::compute::cast(c, &DataType::Timestamp(TimeUnit::Millisecond, None));
        t.unwrap()
            .as_primitive::<TimestampMillisecondType>()
            .values()
            .to_vec()
    };
    let ints = |c: &datafusion::arrow::array::ArrayRef| -> Vec<i64> {
        c.as_primitive::<Int64Type>().values().to_vec()
    };
    let mut bids = vec![];
    for b in &report.rows {
        bids.extend(ints(b.column(0)).into_iter().zip(millis(b.column(1))));
    }
    assert_eq!(
        bids.len(),
        20_000,
        "--table bid: every event published is a bid"
    );
    let q5 = skein::run::nexmark_sql(5, 1, 1, 1).unwrap();
    let q5: Vec<&str> = q5.lines().filter(|l| !l.starts_with("CREATE")).collect();
    let (report, _) = rt
        .block_on(skein::run::run_report(&table(&q5.join("\n")), &args, None))
        .unwrap();
    let mut rows = vec![];
    for b in &report.rows {
        let (a, n, t) = (ints(b.column(0)), ints(b.column(1)), millis(b.column(2)));
        rows.extend((0..b.num_rows()).map(|i| (a[i], n[i], t[i])));
    }
    rows.sort();
    let mut expected = hot_items(&bids);
    expected.sort();
    assert!(!expected.is_empty());
    assert_eq!(rows, expected);

    // The Confluent format needs a registry to register its schema in.
    let (ok, _, stderr) = common::skein(&[
        "gen",
        "nexmark",
        "--to",
        &to,
        "--events",
        "10",
        "--format",
        "avro-confluent",
    ]);
    assert!(!ok);
    assert!(stderr.contains("schema.registry.url"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
