//! The stage DAG as the page draws it: a node per stage with what its
//! members measured (invocation time p50/p99, retries, state bytes,
//! watermark), a node for the sink, and an edge per exchange labelled with
//! the rows and bytes per second its senders sent.

use std::collections::BTreeMap;

use serde::Serialize;
use skein_engine::checkpoint::{FIGURES_EVERY, MemberFigures, MemberRecord};
use skein_engine::context::function_name;
use skein_engine::planner::{Exchange, QueryPlan, Stage};

/// Figures older than this are from a query that no longer runs: its
/// rates are shown as zero.
const STALE_AFTER_MS: i64 = 6 * FIGURES_EVERY.as_millis() as i64;

/// The DAG.
#[derive(Debug, Clone, Serialize)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
}

/// A stage, or the sink (`id` "sink").
#[derive(Debug, Clone, Default, Serialize)]
pub struct Node {
    pub id: String,
    /// `source`, `group`, `single` or `sink`.
    pub kind: String,
    /// `stream`, `accumulate` or `complete` (stages).
    pub mode: Option<serde_json::Value>,
    /// What it reads (source tables) or where it writes (the sink).
    pub label: String,
    pub functions: Vec<String>,
    pub invocations: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub retries: u64,
    pub state_bytes: u64,
    /// The lowest watermark of its members, Unix ms.
    pub watermark_ms: Option<i64>,
    /// How far that trails the wall clock, ms.
    pub watermark_delay_ms: Option<i64>,
    /// The last epoch a member ran.
    pub epoch: Option<u64>,
}

/// An exchange between two nodes.
#[derive(Debug, Clone, Serialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
    /// `hash(N)`, `single` or `sink`.
    pub exchange: String,
    pub rows_per_s: f64,
    /// Payload bytes per second; none into the sink (its writes are not
    /// payloads).
    pub bytes_per_s: Option<f64>,
}

fn exchange_name(e: &Exchange) -> String {
    match e {
        Exchange::Hash(n) => format!("hash({n})"),
        Exchange::Single => "single".into(),
        Exchange::Sink => "sink".into(),
    }
}

/// The value at quantile `q` of `sorted` (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// The DAG of `plan` with the figures in `members`, at `now_ms`.
pub fn graph(plan: &QueryPlan, members: &[((u32, u32), MemberRecord)], now_ms: i64) -> Graph {
    let mut by_stage: BTreeMap<u32, Vec<&MemberFigures>> = BTreeMap::new();
    for ((stage, _), r) in members {
        if let Some(f) = &r.figures {
            by_stage.entry(*stage).or_default().push(f);
        }
    }
    let mut nodes = vec![];
    let mut edges = vec![];
    for s in &plan.stages {
        let figures = by_stage.get(&s.id).map(Vec::as_slice).unwrap_or_default();
        nodes.push(stage_node(plan, s, figures, now_ms));
        let fresh: Vec<&&MemberFigures> = figures
            .iter()
            .filter(|f| now_ms - f.at_ms <= STALE_AFTER_MS)
            .collect();
        let rows: f64 = fresh.iter().map(|f| f.rows_per_s).sum();
        let bytes: f64 = fresh.iter().map(|f| f.bytes_per_s).sum();
        let target = |consumer: Option<u32>| consumer.map_or("sink".to_string(), |c| c.to_string());
        let payload_bytes = |e: &Exchange| (*e != Exchange::Sink).then_some(bytes);
        edges.push(Edge {
            from: s.id.to_string(),
            to: target(s.consumer),
            exchange: exchange_name(&s.output),
            rows_per_s: rows,
            bytes_per_s: payload_bytes(&s.output),
        });
        // A merged read's further outputs: its members count their rows
        // together, so each edge shows the stage's total.
        for o in &s.extra_outputs {
            edges.push(Edge {
                from: s.id.to_string(),
                to: target(o.consumer),
                exchange: exchange_name(&o.output),
                rows_per_s: rows,
                bytes_per_s: payload_bytes(&o.output),
            });
        }
    }
    nodes.push(Node {
        id: "sink".into(),
        kind: "sink".into(),
        label: format!("{} {}", plan.sink.kind, plan.sink.location),
        ..Default::default()
    });
    Graph { nodes, edges }
}

fn stage_node(plan: &QueryPlan, s: &Stage, figures: &[&MemberFigures], now_ms: i64) -> Node {
    let mut durations: Vec<f64> = figures
        .iter()
        .flat_map(|f| f.durations_ms.iter().copied())
        .collect();
    durations.sort_by(f64::total_cmp);
    let watermark_ms = figures.iter().filter_map(|f| f.watermark_ms).min();
    let tables: Vec<&str> = s.sources.iter().map(|l| l.table.as_str()).collect();
    Node {
        id: s.id.to_string(),
        kind: serde_json::to_value(s.kind)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default(),
        mode: serde_json::to_value(s.mode).ok(),
        label: if tables.is_empty() {
            format!("stage {}", s.id)
        } else {
            format!("stage {} · {}", s.id, tables.join(", "))
        },
        functions: (0..s.members)
            .map(|m| function_name(&plan.query_code, s.id, m))
            .collect(),
        invocations: figures.iter().map(|f| f.invocations).sum(),
        p50_ms: quantile(&durations, 0.50),
        p99_ms: quantile(&durations, 0.99),
        retries: figures.iter().map(|f| f.retries).sum(),
        state_bytes: figures.iter().map(|f| f.state_bytes).sum(),
        watermark_ms,
        watermark_delay_ms: watermark_ms.map(|w| now_ms - w),
        epoch: figures.iter().filter_map(|f| f.epoch).max(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(50.0));
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&[3.0], 0.99), Some(3.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
