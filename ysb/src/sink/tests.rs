//! The sink kind's options and the commands it writes, without a server.

use std::collections::BTreeMap;

use datafusion::arrow::array::{
    ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use skein_engine::source::SourceConfig;

use super::*;

fn table(options: &[(&str, &str)]) -> EngineResult<()> {
    let mut catalog = Catalog::default();
    register_sinks(&mut catalog);
    let schema = Arc::new(Schema::new(vec![Field::new("c", DataType::Utf8, true)]));
    let tables = skein_engine::catalog::table::CatalogTableFactory { catalog };
    tables
        .declare(
            "out",
            SourceConfig {
                kind: "ysb_redis".into(),
                location: "redis://127.0.0.1:1".into(),
                options: options
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
            schema,
        )
        .map(drop)
}

#[test]
fn options_are_checked_when_the_table_is_declared() {
    table(&[]).expect("no options: the defaults");
    table(&[
        ("campaign.column", "c"),
        ("window.column", "w"),
        ("count.column", "n"),
        ("checkpoint", "ysb:t"),
        ("ttl.seconds", "60"),
        ("retry.timeout.ms", "500"),
        ("emit", "updates"),
    ])
    .expect("every option it takes");
    let err = table(&[("layout", "ysb")]).unwrap_err().to_string();
    assert!(
        err.contains("unknown option 'layout' for a YSB_REDIS table")
            && err.contains("campaign.column")
            && err.contains("retry.timeout.ms")
            && !err.contains('\n'),
        "{err}"
    );
    for (option, value) in [("ttl.seconds", "0"), ("retry.timeout.ms", "soon")] {
        let err = table(&[(option, value)]).unwrap_err().to_string();
        assert!(err.contains(option) && err.contains(KIND), "{err}");
    }
}

#[test]
fn the_shared_options_are_the_redis_sinks() {
    for shared in skein_sinks::redis::SHARED_OPTIONS {
        assert!(OPTIONS.contains(shared), "{shared}");
    }
}

#[test]
fn names_are_uuid_shaped_and_stable() {
    let a = name_uuid(&[b"c1", b"1000"]);
    assert_eq!(a, name_uuid(&[b"c1", b"1000"]));
    assert_ne!(a, name_uuid(&[b"c1", b"2000"]));
    assert_eq!(a.len(), 36);
}

fn write_of(batch: &RecordBatch) -> SinkWrite<'_> {
    SinkWrite {
        query: "q",
        run: "r",
        epoch: 0,
        member: 0,
        schema: batch.schema(),
        rows: SinkRows::Append(vec![batch.clone()]),
        offsets: vec![],
        last: false,
    }
}

fn batch(
    names: [&str; 3],
    campaigns: &[Option<&str>],
    windows: &[i64],
    counts: &[i64],
) -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(campaigns.to_vec())),
        Arc::new(TimestampMillisecondArray::from(windows.to_vec())),
        Arc::new(Int64Array::from(counts.to_vec())),
    ];
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new(names[0], DataType::Utf8, true),
            Field::new(names[1], columns[1].data_type().clone(), false),
            Field::new(names[2], DataType::Int64, false),
        ])),
        columns,
    )
    .unwrap()
}

#[test]
fn a_write_is_one_script_adding_each_windows_sum() {
    let layout = YsbLayout::from_sink_config(&SinkConfig {
        kind: KIND.into(),
        location: String::new(),
        options: BTreeMap::new(),
    });
    let rows = batch(
        ["campaign_id", "window_start", "seen_count"],
        &[Some("c1"), Some("c1"), Some("c2"), None],
        &[10_000, 10_000, 20_000, 10_000],
        &[3, 4, 5, 100],
    );
    let mut pipe = redis::pipe();
    layout
        .add_commands(&write_of(&rows), Some(60), &mut pipe)
        .unwrap();
    let packed = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
    // RESP: each argument on its own line after its length.
    let args: Vec<&str> = packed
        .split("\r\n")
        .filter(|l| !l.is_empty() && !l.starts_with(['*', '$']))
        .collect();
    assert_eq!(args[0], "EVAL");
    assert_eq!(args[1], WINDOWS_SCRIPT);
    assert_eq!(args[2], "0", "no keys: the script names them");
    assert_eq!(args[4], "60", "the TTL");
    // c1's two rows summed; the row without a campaign skipped.
    let windows: Vec<(&str, &str, &str)> =
        args[5..].chunks(5).map(|w| (w[0], w[1], w[4])).collect();
    assert_eq!(windows, [("c1", "10000", "7"), ("c2", "20000", "5")]);
    assert_eq!(args[7], name_uuid(&[b"c1", b"10000"]));
    assert_eq!(args[8], name_uuid(&[b"c1", b"windows"]));

    // Nothing to count: nothing written.
    let mut pipe = redis::pipe();
    let empty = batch(["campaign_id", "window_start", "seen_count"], &[], &[], &[]);
    layout
        .add_commands(&write_of(&empty), None, &mut pipe)
        .unwrap();
    assert!(pipe.get_packed_pipeline().is_empty());
}

#[test]
fn columns_come_from_the_options_and_must_exist() {
    let layout = YsbLayout::from_sink_config(&SinkConfig {
        kind: KIND.into(),
        location: String::new(),
        options: [
            ("campaign.column", "c"),
            ("window.column", "w"),
            ("count.column", "n"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    });
    let rows = batch(["c", "w", "n"], &[Some("c1")], &[10_000], &[2]);
    layout
        .add_commands(&write_of(&rows), None, &mut redis::pipe())
        .expect("named columns");
    let rows = batch(["campaign_id", "w", "n"], &[Some("c1")], &[10_000], &[2]);
    let err = layout
        .add_commands(&write_of(&rows), None, &mut redis::pipe())
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs a column \"c\""), "{err}");
}
