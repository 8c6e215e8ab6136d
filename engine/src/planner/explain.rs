//! `skein explain`: the stage DAG as text and as JSON.

use std::fmt::Write as _;

use datafusion::physical_plan::displayable;

use crate::context::{EdgeWindow, function_name};

use super::*;

pub(super) fn describe_output(output: Exchange, consumer: Option<u32>, sink: &str) -> String {
    match (output, consumer) {
        (Exchange::Hash(n), Some(c)) => format!("hash exchange -> stage {c} ({n} members)"),
        (Exchange::Single, Some(c)) => format!("gather -> stage {c}"),
        _ => format!("sink {sink}"),
    }
}

/// A column type as SQL names it.
fn sql_type(t: &datafusion::arrow::datatypes::DataType) -> String {
    use datafusion::arrow::datatypes::DataType as T;
    match t {
        T::Int64 => "BIGINT".into(),
        T::Int32 => "INT".into(),
        T::Int16 => "SMALLINT".into(),
        T::Int8 => "TINYINT".into(),
        T::UInt64 => "BIGINT UNSIGNED".into(),
        T::UInt32 => "INT UNSIGNED".into(),
        T::UInt16 => "SMALLINT UNSIGNED".into(),
        T::UInt8 => "TINYINT UNSIGNED".into(),
        T::Float64 => "DOUBLE".into(),
        T::Float32 => "REAL".into(),
        T::Decimal128(p, s) | T::Decimal256(p, s) => format!("DECIMAL({p},{s})"),
        T::Boolean => "BOOLEAN".into(),
        T::Utf8 | T::Utf8View | T::LargeUtf8 => "VARCHAR".into(),
        T::Binary | T::LargeBinary | T::BinaryView => "BYTEA".into(),
        T::Timestamp(..) => "TIMESTAMP".into(),
        T::Date32 => "DATE".into(),
        other => other.to_string(),
    }
}

impl QueryPlan {
    /// Every source table the stages read, once.
    fn distinct_source_leaves(&self) -> Vec<&SourceLeaf> {
        let mut seen: Vec<&SourceLeaf> = vec![];
        for leaf in self.stages.iter().flat_map(|s| &s.sources) {
            if !seen.iter().any(|l| l.table == leaf.table) {
                seen.push(leaf);
            }
        }
        seen
    }

    /// `skein explain`: the DAG in words.
    pub fn explain(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "query {}: {} stages, {} functions, group size {}, sink {} {}",
            self.query_code,
            self.stages.len(),
            self.function_count(),
            self.group_size,
            self.sink.kind,
            self.sink.location
        );
        // The columns of each table read: declared, or taken from its
        // format's schema (an Avro or Protobuf table declared without any).
        for leaf in self.distinct_source_leaves() {
            let columns: Vec<String> = leaf
                .schema
                .fields()
                .iter()
                .map(|f| {
                    let null = if f.is_nullable() { "" } else { " NOT NULL" };
                    format!("{} {}{null}", f.name(), sql_type(f.data_type()))
                })
                .collect();
            let _ = writeln!(
                out,
                "table {} ({} {}{}): {}",
                leaf.table,
                leaf.config.kind,
                leaf.config.location,
                if leaf.changelog { ", a changelog" } else { "" },
                columns.join(", ")
            );
            if let Some(why) = &leaf.parallelism_why {
                let n = leaf.parallelism;
                let _ = writeln!(
                    out,
                    "  read by {n} source instance{}: {why}",
                    if n == 1 { "" } else { "s" }
                );
            }
        }
        for s in &self.stages {
            let names: Vec<String> = (0..s.members)
                .map(|m| function_name(&self.query_code, s.id, m))
                .collect();
            let names = if names.len() > 3 {
                format!("{} .. {}", names[0], names[names.len() - 1])
            } else {
                names.join(", ")
            };
            let output = describe_output(s.output, s.consumer, &self.sink.kind);
            let _ = writeln!(
                out,
                "\nstage {:02} [{:?}, {:?}] members {} concurrency {} -> {}\n  functions: {}",
                s.id, s.kind, s.mode, s.members, s.concurrency, output, names
            );
            if let Some(path) = self.state_path(s) {
                let _ = writeln!(out, "  state: {path}");
            }
            for (i, w) in s.windows.iter().enumerate() {
                let edge = s.inputs[i].0;
                let _ = match w {
                    Some(EdgeWindow::Fixed(w)) => writeln!(
                        out,
                        "  input {edge}: window column #{} size {} ms",
                        w.index, w.size_ms
                    ),
                    Some(EdgeWindow::Session(spec)) => writeln!(
                        out,
                        "  input {edge}: session windows over column #{} keyed by {:?}, gap {} ms",
                        spec.time, spec.keys, spec.gap_ms
                    ),
                    Some(EdgeWindow::SessionStarts) => {
                        writeln!(out, "  input {edge}: whole sessions")
                    }
                    None => Ok(()),
                };
            }
            for line in displayable(s.plan.as_ref())
                .indent(true)
                .to_string()
                .lines()
            {
                let _ = writeln!(out, "    {line}");
            }
            for o in &s.extra_outputs {
                let _ = writeln!(
                    out,
                    "  from the same read, edge {} -> {}",
                    o.shuffle_id,
                    describe_output(o.output, o.consumer, &self.sink.kind)
                );
                for line in displayable(o.plan.as_ref())
                    .indent(true)
                    .to_string()
                    .lines()
                {
                    let _ = writeln!(out, "    {line}");
                }
            }
        }
        out
    }

    /// A JSON description of the DAG for scripts.
    pub fn explain_json(&self) -> serde_json::Value {
        serde_json::json!({
            "query_code": self.query_code,
            "group_size": self.group_size,
            "functions": self.function_count(),
            "updates": self.updates(),
            "output": self.output_schema.fields().iter().map(|f| serde_json::json!({
                "name": f.name(),
                "type": sql_type(f.data_type()),
                "nullable": f.is_nullable(),
            })).collect::<Vec<_>>(),
            "tables": self.distinct_source_leaves().iter().map(|leaf| serde_json::json!({
                "name": leaf.table,
                "kind": leaf.config.kind,
                "location": leaf.config.location,
                "changelog": leaf.changelog,
                "parallelism": leaf.parallelism,
                "parallelism_why": leaf.parallelism_why,
                "columns": leaf.schema.fields().iter().map(|f| serde_json::json!({
                    "name": f.name(),
                    "type": sql_type(f.data_type()),
                    "nullable": f.is_nullable(),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "stages": self.stages.iter().map(|s| serde_json::json!({
                "id": s.id,
                "kind": s.kind,
                "mode": s.mode,
                "members": s.members,
                "concurrency": s.concurrency,
                "output": s.output,
                "consumer": s.consumer,
                "extra_outputs": s.extra_outputs.iter().map(|o| serde_json::json!({
                    "edge": o.shuffle_id,
                    "output": o.output,
                    "consumer": o.consumer,
                })).collect::<Vec<_>>(),
                "functions": (0..s.members).map(|m| function_name(&self.query_code, s.id, m)).collect::<Vec<_>>(),
                "state": self.state_path(s).map(|p| serde_json::json!({
                    "incremental": p.incremental,
                    "operator": p.operator,
                    "keeps": p.keeps,
                })),
                "operators": displayable(s.plan.as_ref()).indent(true).to_string().lines().map(|l| l.trim().to_string()).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}
