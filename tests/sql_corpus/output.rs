//! A query's answer: the Debezium events its run committed to the output
//! topic, replayed into a table, each value written as tests/sql/README.md
//! says.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::common::kafka::committed_records;

/// The result columns `skein explain --json` gives.
pub struct Columns(Vec<(String, String)>);

impl Columns {
    pub fn of(plan: &Value) -> Result<Self, String> {
        let columns = plan["output"]
            .as_array()
            .ok_or_else(|| format!("skein explain --json has no output columns: {plan}"))?;
        Ok(Columns(
            columns
                .iter()
                .map(|c| {
                    (
                        c["name"].as_str().unwrap_or_default().to_string(),
                        c["type"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect(),
        ))
    }

    /// The columns of the output table, by position (`c0`, `c1`, ...): a
    /// result column may be named `count(*)`, or repeat a name.
    pub fn ddl(&self) -> String {
        self.0
            .iter()
            .enumerate()
            .map(|(i, (_, t))| format!("c{i} {}", written_as(t)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The type an output column is declared with: what a user would declare
/// for the values the debezium-json sink writes (it writes no dates,
/// decimals or unsigned integers; see the issue notes).
fn written_as(t: &str) -> &str {
    let upper = t.to_ascii_uppercase();
    if upper.contains("INT") {
        "BIGINT"
    } else if upper.starts_with("DECIMAL") || upper == "REAL" || upper.starts_with("FLOAT") {
        "DOUBLE"
    } else if upper == "DATE"
        || upper.starts_with("INTERVAL")
        || upper.starts_with("TIME") && !upper.starts_with("TIMESTAMP")
    {
        "VARCHAR"
    } else {
        t
    }
}

/// The table the events of `topic` leave, rows formatted.
pub fn table(brokers: &str, topic: &str, columns: &Columns) -> Result<Vec<Vec<String>>, String> {
    let mut table: BTreeMap<Vec<String>, i64> = BTreeMap::new();
    for (_, _, value) in committed_records(brokers, topic) {
        let e: Value = serde_json::from_slice(&value)
            .map_err(|e| format!("{topic}: an event that is not JSON: {e}"))?;
        let row = |side: &str| -> Result<Vec<String>, String> {
            let r = &e[side];
            (0..columns.0.len())
                .map(|i| format_value(&r[format!("c{i}")], &columns.0[i].1))
                .collect()
        };
        let mut change = |row: Vec<String>, by: i64| *table.entry(row).or_default() += by;
        match e["op"].as_str() {
            Some("c") | Some("r") => change(row("after")?, 1),
            Some("u") => {
                change(row("before")?, -1);
                change(row("after")?, 1);
            }
            Some("d") => change(row("before")?, -1),
            other => return Err(format!("{topic}: op {other:?} in {e}")),
        }
    }
    let mut rows = vec![];
    for (row, n) in table {
        if n < 0 {
            return Err(format!(
                "{topic}: the row {row:?} was taken back {} times more than it was written",
                -n
            ));
        }
        for _ in 0..n {
            rows.push(row.clone());
        }
    }
    Ok(rows)
}

/// A value as the corpus writes it, by its column's SQL type.
fn format_value(v: &Value, sql_type: &str) -> Result<String, String> {
    let t = sql_type.to_ascii_uppercase();
    Ok(match v {
        Value::Null => "NULL".into(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) if s.is_empty() => "(empty)".into(),
        Value::String(s) if is_float(&t) => match s.parse::<f64>() {
            Ok(f) => float(f),
            Err(_) => s.clone(),
        },
        Value::String(s) => s.clone(),
        Value::Number(n) if t.starts_with("TIMESTAMP") => {
            let ms = n.as_i64().ok_or_else(|| format!("timestamp {n}"))?;
            timestamp(ms)
        }
        Value::Number(n) if t == "DATE" => date(n.as_i64().ok_or_else(|| format!("date {n}"))?),
        Value::Number(n) if is_float(&t) => float(n.as_f64().unwrap_or(f64::NAN)),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    })
}

fn is_float(t: &str) -> bool {
    ["DOUBLE", "FLOAT", "REAL", "DECIMAL"]
        .iter()
        .any(|f| t.starts_with(f))
}

/// Rounded to 4 places, trailing zeros (and a bare point) dropped.
pub fn float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let s = format!("{:.4}", f);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.to_string() }
}

fn timestamp(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (h, m, s, frac) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    let mut out = format!("{}T{h:02}:{m:02}:{s:02}", date(days));
    if frac > 0 {
        out.push_str(&format!(".{frac:03}"));
    }
    out
}

/// Days since 1970-01-01 as a civil date.
fn date(days: i64) -> String {
    crate::common::nexmark_reference::day(days * 86_400_000)
}

#[test]
fn values_are_written_as_the_readme_says() {
    assert_eq!(float(2.5), "2.5");
    assert_eq!(float(1.0 / 3.0), "0.3333");
    assert_eq!(float(3.0), "3");
    assert_eq!(float(-0.00001), "0");
    assert_eq!(timestamp(1_704_103_200_000), "2024-01-01T10:00:00");
    assert_eq!(timestamp(1_704_103_200_500), "2024-01-01T10:00:00.500");
    assert_eq!(date(0), "1970-01-01");
}
