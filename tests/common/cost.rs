//! The arithmetic of a `skein cost --json` report, redone here from the
//! run's measured counts and the published price table: requests × the
//! request price, GB-seconds × the GB-s price of each architecture, and the
//! checkpoint store's PUTs, GETs and uploaded bytes at their prices.

use serde_json::Value;
use skein_cost::{Arch, CostReport, Prices};

/// Memory at which a function has a whole vCPU (AWS: 1,769 MB); below it
/// the model stretches the measured time in proportion (docs/cost.md).
const ONE_VCPU_MB: f64 = 1769.0;

/// `skein cost --json`: its cost section, typed, and the whole object for
/// what the command adds to it (the query, its epochs and group size: an
/// object of its own, src/cost/mod.rs).
pub fn cost_json(stdout: &str) -> (CostReport, Value) {
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    (super::typed(&v, stdout), v)
}

fn close(what: &str, got: f64, want: f64, report: &CostReport) {
    let scale = want.abs().max(1e-12);
    assert!(
        ((got - want) / scale).abs() < 1e-9,
        "{what}: reported {got}, the measured counts at the published prices give {want}\n{report:?}"
    );
}

/// Checks every Lambda row of `report` against the run's measured counts
/// priced at `prices`; returns the x86_64 S3 row's dollars per million
/// events. The input must not be Kinesis (its share is asserted zero).
pub fn assert_lambda_priced(report: &CostReport, prices: &Prices) -> f64 {
    let m = &report.measured;
    let (events, invocations, billed_ms) =
        (m.events as f64, m.invocations as f64, m.billed_ms as f64);
    let (puts, gets, bytes) = (
        m.checkpoint_puts as f64,
        m.checkpoint_gets as f64,
        m.checkpoint_bytes as f64,
    );
    assert!(
        events > 0.0 && invocations > 0.0 && billed_ms > 0.0,
        "{report:?}"
    );
    assert_eq!(report.kinesis_usd_per_million_events, 0.0, "{report:?}");
    let millions = events / 1e6;
    let month_events = report.rate.map(|r| r * 730.0 * 3600.0);
    let mut x86_s3 = None;
    for (section, rows, put, get, per_gb) in [
        (
            "lambda",
            &report.lambda,
            prices.s3_put_per_thousand,
            prices.s3_get_per_thousand,
            0.0,
        ),
        (
            "lambda_s3_express",
            &report.lambda_s3_express,
            prices.s3_express_put_per_thousand,
            prices.s3_express_get_per_thousand,
            prices.s3_express_upload_per_gb,
        ),
    ] {
        assert_eq!(rows.len(), 2, "x86_64 and arm64: {report:?}");
        for row in rows {
            let memory = row.memory_mb as f64;
            let gb_s = billed_ms / 1000.0 * (ONE_VCPU_MB / memory).max(1.0) * memory / 1024.0;
            let gb_s_price = match row.arch {
                Arch::X86_64 => prices.lambda_x86_per_gb_s,
                Arch::Arm64 => prices.lambda_arm_per_gb_s,
            };
            let store = puts / 1000.0 * put + gets / 1000.0 * get + bytes / 1e9 * per_gb;
            let usd =
                invocations / 1e6 * prices.lambda_per_million_requests + gb_s * gb_s_price + store;
            let at = |k: &str| format!("{section} {:?} {k}", row.arch);
            close(
                &at("requests_per_million_events"),
                row.requests_per_million_events,
                invocations / millions,
                report,
            );
            close(
                &at("gb_s_per_million_events"),
                row.gb_s_per_million_events,
                gb_s / millions,
                report,
            );
            close(
                &at("object_store_usd_per_million_events"),
                row.object_store_usd_per_million_events,
                store / millions,
                report,
            );
            close(
                &at("usd_per_million_events"),
                row.usd_per_million_events,
                usd / millions,
                report,
            );
            match month_events {
                Some(e) => close(
                    &at("usd_per_month"),
                    row.usd_per_month.unwrap_or_else(|| {
                        panic!("{}: not a number in {report:?}", at("usd_per_month"))
                    }),
                    usd / events * e,
                    report,
                ),
                None => assert!(row.usd_per_month.is_none(), "{report:?}"),
            }
            if section == "lambda" && row.arch == Arch::X86_64 {
                x86_s3 = Some(usd / millions);
            }
        }
    }
    x86_s3.expect("an x86_64 row")
}
