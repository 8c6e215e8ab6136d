//! What a function measures, as CloudWatch embedded-metric-format (EMF)
//! log lines: a `metrics` recorder that keeps each series since the last
//! flush, and renders one JSON document per label set when asked (once per
//! invocation). Lambda sends stdout to CloudWatch Logs, which turns the
//! documents into metrics; the names are those of docs/metrics.md.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use serde_json::{Map, Value, json};

/// The CloudWatch namespace of Skein's metrics.
pub const NAMESPACE: &str = "Skein";

/// The variable that gives a deployed function its query's name (a
/// property of every document, beside the function's name).
pub const QUERY_NAME_ENV: &str = "SKEIN_QUERY_NAME";

/// EMF takes at most 100 values per metric in one document.
const MAX_VALUES: usize = 100;

/// One series' value since the last flush.
#[derive(Debug, Clone)]
enum Reading {
    /// Increments since the last flush.
    Count(u64),
    /// The last value, and whether it was set since the last flush.
    Gauge(f64, bool),
    /// Values recorded since the last flush.
    Values(Vec<f64>),
}

type Series = Arc<Mutex<BTreeMap<Key, Reading>>>;

/// The recorder; clones share their series, so one clone can be installed
/// globally and another flushed.
#[derive(Debug, Clone, Default)]
pub struct EmfRecorder {
    series: Series,
}

struct Handle {
    series: Series,
    key: Key,
}

impl Handle {
    fn update(&self, f: impl FnOnce(&mut Reading)) {
        let mut series = self.series.lock().expect("emf series");
        if let Some(r) = series.get_mut(&self.key) {
            f(r);
        }
    }
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.update(|r| {
            if let Reading::Count(n) = r {
                *n += value;
            }
        });
    }
    fn absolute(&self, value: u64) {
        self.update(|r| *r = Reading::Count(value));
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.update(|r| {
            if let Reading::Gauge(g, fresh) = r {
                *g += value;
                *fresh = true;
            }
        });
    }
    fn decrement(&self, value: f64) {
        GaugeFn::increment(self, -value);
    }
    fn set(&self, value: f64) {
        self.update(|r| *r = Reading::Gauge(value, true));
    }
}

impl HistogramFn for Handle {
    fn record(&self, value: f64) {
        self.update(|r| {
            if let Reading::Values(v) = r {
                v.push(value);
            }
        });
    }
}

impl EmfRecorder {
    fn handle(&self, key: &Key, empty: Reading) -> Arc<Handle> {
        self.series
            .lock()
            .expect("emf series")
            .entry(key.clone())
            .or_insert(empty);
        Arc::new(Handle {
            series: self.series.clone(),
            key: key.clone(),
        })
    }

    /// Install a recorder as the process's; `None` if one was installed
    /// already.
    pub fn install() -> Option<EmfRecorder> {
        let recorder = EmfRecorder::default();
        metrics::set_global_recorder(recorder.clone()).ok()?;
        Some(recorder)
    }

    /// Print what was recorded since the last call to stdout, one EMF line
    /// per label set, stamped now and naming the function and its query.
    pub fn print(&self, function_name: &str) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let query_name = std::env::var(QUERY_NAME_ENV).ok();
        let mut properties = vec![("function_name", function_name)];
        if let Some(name) = &query_name {
            properties.push(("query_name", name));
        }
        for line in self.flush(now_ms, &properties) {
            println!("{line}");
        }
    }

    /// The EMF documents of what was recorded since the last flush, one per
    /// label set (its labels are the dimensions), stamped `timestamp_ms`;
    /// `properties` (e.g. the function name) go into every document without
    /// being dimensions. Counts and values start again from nothing; a
    /// gauge is written again once it is set again.
    pub fn flush(&self, timestamp_ms: i64, properties: &[(&str, &str)]) -> Vec<String> {
        let taken: Vec<(Key, Reading)> = {
            let mut series = self.series.lock().expect("emf series");
            let out = series
                .iter()
                .filter(|(_, r)| match r {
                    Reading::Count(n) => *n > 0,
                    Reading::Values(v) => !v.is_empty(),
                    Reading::Gauge(_, fresh) => *fresh,
                })
                .map(|(k, r)| (k.clone(), r.clone()))
                .collect();
            for r in series.values_mut() {
                match r {
                    Reading::Count(n) => *n = 0,
                    Reading::Values(v) => v.clear(),
                    Reading::Gauge(_, fresh) => *fresh = false,
                }
            }
            out
        };
        // Group by label set: one document each.
        let mut groups: BTreeMap<Vec<(String, String)>, Vec<(String, Reading)>> = BTreeMap::new();
        for (key, reading) in taken {
            let labels = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            groups
                .entry(labels)
                .or_default()
                .push((key.name().to_string(), reading));
        }
        let mut lines = vec![];
        for (labels, metrics) in groups {
            // Values past the first 100 go into further documents.
            let mut chunk = 0;
            loop {
                let doc = document(timestamp_ms, properties, &labels, &metrics, chunk);
                match doc {
                    Some(d) => lines.push(d.to_string()),
                    None => break,
                }
                chunk += 1;
            }
        }
        lines
    }
}

/// The `chunk`-th document of one label set; `None` when nothing is left.
fn document(
    timestamp_ms: i64,
    properties: &[(&str, &str)],
    labels: &[(String, String)],
    metrics: &[(String, Reading)],
    chunk: usize,
) -> Option<Value> {
    let mut root = Map::new();
    let mut defs = vec![];
    for (name, reading) in metrics {
        let (value, unit) = match reading {
            Reading::Count(n) if chunk == 0 => (json!(n), "Count"),
            Reading::Gauge(g, _) if chunk == 0 => (json!(g), unit_of(name)),
            Reading::Values(v) => {
                let part: Vec<f64> = v.chunks(MAX_VALUES).nth(chunk)?.to_vec();
                (json!(part), unit_of(name))
            }
            _ => continue,
        };
        root.insert(name.clone(), value);
        defs.push(json!({"Name": name, "Unit": unit}));
    }
    if defs.is_empty() {
        return None;
    }
    for (k, v) in properties {
        root.insert(k.to_string(), json!(v));
    }
    for (k, v) in labels {
        root.insert(k.clone(), json!(v));
    }
    let dimensions: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
    root.insert(
        "_aws".into(),
        json!({
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": [dimensions],
                "Metrics": defs,
            }]
        }),
    );
    Some(Value::Object(root))
}

/// CloudWatch's unit from the metric's name suffix.
fn unit_of(name: &str) -> &'static str {
    if name.ends_with("_seconds") {
        "Seconds"
    } else if name.ends_with("_bytes") {
        "Bytes"
    } else if name.ends_with("_total") || name.ends_with("_records") {
        "Count"
    } else {
        "None"
    }
}

impl Recorder for EmfRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key, Reading::Count(0)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key, Reading::Gauge(0.0, false)))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key, Reading::Values(vec![])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_valid_emf_per_label_set_and_resets() {
        let r = EmfRecorder::default();
        metrics::with_local_recorder(&r, || {
            metrics::counter!("skein_invocations_total", "stage" => "1").increment(3);
            metrics::counter!("skein_invocations_total", "stage" => "1").increment(2);
            metrics::gauge!("skein_state_bytes", "function" => "f-1").set(4096.0);
            for i in 0..150 {
                metrics::histogram!("skein_checkpoint_write_seconds").record(i as f64 / 1000.0);
            }
        });
        let lines = r.flush(1_700_000_000_000, &[("function_name", "skein-q-1")]);
        let docs: Vec<Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).expect("valid JSON"))
            .collect();
        // No labels (2 documents: 100 + 50 values), function, stage.
        assert_eq!(docs.len(), 4, "{lines:#?}");
        for d in &docs {
            let cw = &d["_aws"]["CloudWatchMetrics"][0];
            assert_eq!(d["_aws"]["Timestamp"], 1_700_000_000_000i64);
            assert_eq!(cw["Namespace"], NAMESPACE);
            assert_eq!(d["function_name"], "skein-q-1");
            // Every metric named in the directive is a member of the document,
            // and so is every dimension.
            for m in cw["Metrics"].as_array().unwrap() {
                assert!(d.get(m["Name"].as_str().unwrap()).is_some());
            }
            for dim in cw["Dimensions"][0].as_array().unwrap() {
                assert!(d.get(dim.as_str().unwrap()).is_some());
            }
        }
        let stage = docs.iter().find(|d| d.get("stage").is_some()).unwrap();
        assert_eq!(stage["skein_invocations_total"], 5);
        assert_eq!(
            stage["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["stage"]])
        );
        let values: usize = docs
            .iter()
            .filter_map(|d| d["skein_checkpoint_write_seconds"].as_array())
            .map(|a| a.len())
            .sum();
        assert_eq!(values, 150);
        let state = docs.iter().find(|d| d.get("function").is_some()).unwrap();
        assert_eq!(
            state["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"],
            "Bytes"
        );
        // Flushed: nothing new to say.
        assert!(r.flush(0, &[]).is_empty());
        metrics::with_local_recorder(&r, || {
            metrics::counter!("skein_invocations_total", "stage" => "1").increment(1);
        });
        let again: Value = serde_json::from_str(&r.flush(0, &[])[0]).unwrap();
        assert_eq!(again["skein_invocations_total"], 1);
    }
}
