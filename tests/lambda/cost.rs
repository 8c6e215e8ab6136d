//! `skein cost --backend lambda` on ministack: the measured epochs run on
//! Lambda with the real `skein-function` bootstrap, and the report prices
//! what the functions reported of their invocations.

use crate::common;

#[test]
fn cost_measured_on_lambda_prices_the_functions_reports() {
    let store = format!("s3://{}", common::unique_name("skein-lambda-cost"));
    let (ok, stdout, stderr) = common::skein_on_aws(
        Some(&store),
        &[
            "cost",
            "queries/cost/ysb.sql",
            "--rate",
            "2000",
            "--seconds",
            "3",
            "--backend",
            "lambda",
            "--json",
        ],
    );
    assert!(ok, "{stdout}\n{stderr}");
    let (c, v) = common::cost::cost_json(&stdout);
    assert_eq!(v["backend"], "lambda", "{v}");
    assert_eq!(v["epochs"].as_u64(), Some(3), "{v}");
    let m = &c.measured;
    // Every trigger, payload and probe, as the functions answered them.
    assert!(m.invocations > v["functions"].as_u64().unwrap(), "{v}");
    assert!(m.billed_ms > 0, "{c:?}");
    // Checkpointed every epoch: each member's writes and the driver's commits.
    assert!(m.checkpoint_puts >= 3, "{c:?}");
    // What the functions reported, priced at the published prices: the
    // report's figures are that arithmetic and nothing else.
    let prices = skein_cost::Prices::default();
    assert_eq!(c.prices, prices.date, "{c:?}");
    common::cost::assert_lambda_priced(&c, &prices);
    assert!(
        c.measured_on
            .as_deref()
            .is_some_and(|s| s.starts_with("Lambda")),
        "{c:?}"
    );

    // The scratch checkpoints and the functions are gone.
    let (ok, stdout, stderr) = common::skein_on_aws(Some(&store), &["status", "--json"]);
    assert!(ok, "{stderr}");
    let status: serde_json::Value = serde_json::from_str(
        stdout
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap_or("{}"),
    )
    .unwrap();
    let code = v["query_code"].as_str().expect("query_code");
    assert!(status["queries"].get(code).is_none(), "{status}");
}
