//! A query built with DataFusion's DataFrame API instead of SQL: bids per
//! 2-second tumbling window over the NEXMark generator, run by the skein
//! library in-process, as `skein run` runs a SQL file.
//!
//! ```text
//! cargo run --example dataframe
//! ```
//!
//! The same query in SQL would be
//! `SELECT tumble(date_time, INTERVAL '2' SECOND) AS window_start,
//! count(*) AS bids FROM bid GROUP BY 1`. `cargo test` runs this file's
//! test, which checks the counts against the generator's own events.

use anyhow::{Context, Result};
use datafusion::arrow::datatypes::IntervalMonthDayNano;
use datafusion::common::ScalarValue;
use datafusion::execution::FunctionRegistry;
use datafusion::functions_aggregate::count::count_all;
use datafusion::prelude::{col, lit};
use skein::dataframe::DataFrameQuery;
use skein::run::CommonRunArgs;

/// Events the generator makes (persons, auctions and bids).
const EVENTS: u64 = 40_000;
/// Events per second of event time: the run spans 8 s of it.
const RATE: u64 = 5_000;
/// The window.
const WINDOW_MS: i64 = 2_000;

#[tokio::main]
async fn main() -> Result<()> {
    let query = bids_per_window()?;
    let frame = frame(&query).await?;
    print!("{}", query.plan(frame.clone()).await?.explain());
    let (report, _) = query.run(frame).await?;
    println!("{}", report.render(false, 10)?);
    Ok(())
}

/// A session over the binary's catalog with the NEXMark bid table, run
/// for 4 epochs over 2 source instances and 2 members per group.
fn bids_per_window() -> Result<DataFrameQuery> {
    let args = CommonRunArgs::from_flags(["--epochs", "4", "--group-size", "2"])?;
    let query = DataFrameQuery::new(args);
    let (events, rate) = (EVENTS.to_string(), RATE.to_string());
    query.register(
        "bid",
        "NEXMARK",
        "bid",
        &[
            ("events", &events),
            ("rate", &rate),
            ("partitions", "2"),
            ("event_time", "date_time"),
        ],
        None,
    )?;
    Ok(query)
}

/// `SELECT tumble(date_time, 2 s) AS window_start, count(*) AS bids FROM
/// bid GROUP BY 1`, as a DataFrame.
async fn frame(query: &DataFrameQuery) -> Result<datafusion::dataframe::DataFrame> {
    let ctx = query.session();
    let size = ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(
        0,
        0,
        WINDOW_MS * 1_000_000,
    )));
    let tumble = ctx.udf("tumble").context("the session's tumble()")?;
    let frame = ctx.table("bid").await?.aggregate(
        vec![
            tumble
                .call(vec![col("date_time"), lit(size)])
                .alias("window_start"),
        ],
        vec![count_all().alias("bids")],
    )?;
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use datafusion::arrow::array::{AsArray, RecordBatch};
    use datafusion::arrow::datatypes::{Int64Type, TimestampMillisecondType};
    use skein::report::Report;
    use skein_generators::nexmark::{EventRef, NexmarkConfig, NexmarkGenerator};

    use super::*;

    /// What the run reported, read back from its `--json` line.
    fn reread(report: &Report) -> Result<Report> {
        Ok(serde_json::from_str(&report.render(true, 0)?)?)
    }

    /// Window start (ms) -> bids, from the result rows.
    fn counts(rows: &[RecordBatch]) -> BTreeMap<i64, i64> {
        let mut out = BTreeMap::new();
        for batch in rows {
            let starts = batch
                .column_by_name("window_start")
                .expect("a window_start column")
                .as_primitive::<TimestampMillisecondType>();
            let bids = batch
                .column_by_name("bids")
                .expect("a bids column")
                .as_primitive::<Int64Type>();
            for i in 0..batch.num_rows() {
                *out.entry(starts.value(i)).or_default() += bids.value(i);
            }
        }
        out
    }

    /// Bids per window counted straight from the generator's events.
    fn reference() -> BTreeMap<i64, i64> {
        let config = NexmarkConfig {
            first_event_rate: RATE,
            max_events: Some(EVENTS),
            ..NexmarkConfig::default()
        };
        let mut generator = NexmarkGenerator::new(config).expect("a generator");
        let mut out = BTreeMap::new();
        while let Some(event) = generator.next_event() {
            if let EventRef::Bid(bid) = event {
                let window = bid.date_time - bid.date_time.rem_euclid(WINDOW_MS);
                *out.entry(window).or_default() += 1;
            }
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dataframe_runs_in_stages_and_counts_every_bid_once() {
        let query = bids_per_window().unwrap();
        let frame = frame(&query).await.unwrap();
        let plan = query.plan(frame.clone()).await.unwrap();
        assert!(
            plan.stages.len() >= 2,
            "the aggregate runs in a stage of its own:\n{}",
            plan.explain()
        );
        let (report, mismatch) = query.run(frame).await.unwrap();
        assert!(mismatch.is_none());
        let want = reference();
        assert!(want.len() >= 4, "the input spans several windows: {want:?}");
        assert_eq!(counts(&report.rows), want);
        assert_eq!(report.result_rows, want.len());
        assert_eq!(report.events, EVENTS * 46 / 50, "the bids, each read once");
        // The report reads back from its JSON with the same figures.
        let again = reread(&report).unwrap();
        assert_eq!(
            (
                again.query_code,
                again.result_rows,
                again.events,
                again.epochs
            ),
            (report.query_code, report.result_rows, report.events, 4)
        );
    }
}
