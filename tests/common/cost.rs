//! The arithmetic of a `skein cost --json` report, redone here from the
//! run's measured counts and the published price table: requests × the
//! request price, GB-seconds × the GB-s price of each architecture, and the
//! checkpoint store's PUTs, GETs and uploaded bytes at their prices.

use serde_json::Value;
use skein_cost::Prices;

/// Memory at which a function has a whole vCPU (AWS: 1,769 MB); below it
/// the model stretches the measured time in proportion (docs/cost.md).
const ONE_VCPU_MB: f64 = 1769.0;

fn close(what: &str, got: &Value, want: f64, report: &Value) {
    let got = got
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: not a number in {report}"));
    let scale = want.abs().max(1e-12);
    assert!(
        ((got - want) / scale).abs() < 1e-9,
        "{what}: reported {got}, the measured counts at the published prices give {want}\n{report}"
    );
}

/// Checks every Lambda row of `report` against the run's measured counts
/// priced at `prices`; returns the x86_64 S3 row's dollars per million
/// events. The input must not be Kinesis (its share is asserted zero).
pub fn assert_lambda_priced(report: &Value, prices: &Prices) -> f64 {
    let m = &report["measured"];
    let count = |k: &str| {
        m[k].as_u64()
            .unwrap_or_else(|| panic!("measured.{k} in {report}")) as f64
    };
    let (events, invocations, billed_ms) =
        (count("events"), count("invocations"), count("billed_ms"));
    let (puts, gets, bytes) = (
        count("checkpoint_puts"),
        count("checkpoint_gets"),
        count("checkpoint_bytes"),
    );
    assert!(
        events > 0.0 && invocations > 0.0 && billed_ms > 0.0,
        "{report}"
    );
    assert_eq!(report["kinesis_usd_per_million_events"], 0.0, "{report}");
    let millions = events / 1e6;
    let month_events = report["rate"].as_f64().map(|r| r * 730.0 * 3600.0);
    let mut x86_s3 = None;
    for (section, put, get, per_gb) in [
        (
            "lambda",
            prices.s3_put_per_thousand,
            prices.s3_get_per_thousand,
            0.0,
        ),
        (
            "lambda_s3_express",
            prices.s3_express_put_per_thousand,
            prices.s3_express_get_per_thousand,
            prices.s3_express_upload_per_gb,
        ),
    ] {
        let rows = report[section]
            .as_array()
            .unwrap_or_else(|| panic!("{section} in {report}"));
        assert_eq!(rows.len(), 2, "x86_64 and arm64: {report}");
        for row in rows {
            let memory = row["memory_mb"].as_f64().expect("memory_mb");
            let gb_s = billed_ms / 1000.0 * (ONE_VCPU_MB / memory).max(1.0) * memory / 1024.0;
            let gb_s_price = match row["arch"].as_str() {
                Some("x86_64") => prices.lambda_x86_per_gb_s,
                Some("arm64") => prices.lambda_arm_per_gb_s,
                other => panic!("arch {other:?} in {report}"),
            };
            let store = puts / 1000.0 * put + gets / 1000.0 * get + bytes / 1e9 * per_gb;
            let usd =
                invocations / 1e6 * prices.lambda_per_million_requests + gb_s * gb_s_price + store;
            let at = |k: &str| format!("{section} {} {k}", row["arch"]);
            close(
                &at("requests_per_million_events"),
                &row["requests_per_million_events"],
                invocations / millions,
                report,
            );
            close(
                &at("gb_s_per_million_events"),
                &row["gb_s_per_million_events"],
                gb_s / millions,
                report,
            );
            close(
                &at("object_store_usd_per_million_events"),
                &row["object_store_usd_per_million_events"],
                store / millions,
                report,
            );
            close(
                &at("usd_per_million_events"),
                &row["usd_per_million_events"],
                usd / millions,
                report,
            );
            match month_events {
                Some(e) => close(
                    &at("usd_per_month"),
                    &row["usd_per_month"],
                    usd / events * e,
                    report,
                ),
                None => assert!(row["usd_per_month"].is_null(), "{report}"),
            }
            if section == "lambda" && row["arch"] == "x86_64" {
                x86_s3 = Some(usd / millions);
            }
        }
    }
    x86_s3.expect("an x86_64 row")
}
