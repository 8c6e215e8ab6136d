//! `skein preview FILE.sql`: the query run in-process on its live tables,
//! its rows printed as each epoch completes (a changelog's with their kind),
//! writing no sink and committing no offsets; see `skein_engine::preview`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use skein_engine::preview::{PreviewEvent, PreviewOptions, PreviewRow, PreviewStart, preview};

use crate::args::read_sql;
use crate::registry::registries;

#[derive(Args, Debug)]
pub struct PreviewArgs {
    /// The query.
    pub file: PathBuf,
    /// Stop once this many rows came out.
    #[arg(long, default_value_t = 20, value_parser = crate::positive)]
    pub rows: usize,
    /// Stop after this long (e.g. 30s, 2m).
    #[arg(long, default_value = "30s", value_parser = crate::duration)]
    pub seconds: Duration,
    /// Where tables that take a 'startup' option start reading, unless they
    /// declare one: latest (records produced from now on), earliest, or a
    /// time (2026-11-28T10:00:00Z, or ms since the epoch).
    #[arg(long, default_value = "latest", value_parser = parse_start)]
    pub from: PreviewStart,
    /// The time between epochs.
    #[arg(long, default_value = "500ms", value_parser = crate::duration)]
    pub interval: Duration,
    /// JSON lines (one event each) instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_start(s: &str) -> std::result::Result<PreviewStart, String> {
    PreviewStart::parse(s).map_err(|e| e.to_string())
}

pub async fn preview_command(args: PreviewArgs) -> Result<()> {
    let sql = read_sql(&args.file)?;
    let options = PreviewOptions {
        rows: args.rows,
        seconds: args.seconds,
        from: args.from,
        interval: args.interval,
        group_size: 1,
    };
    let mut table = Table::default();
    let json = args.json;
    preview(&registries().catalog, &sql, &options, |event| {
        let mut out = std::io::stdout().lock();
        let printed = if json {
            serde_json::to_string(&event)
                .map_err(std::io::Error::other)
                .and_then(|line| writeln!(out, "{line}"))
        } else {
            table.print(&mut out, &event)
        };
        // A closed terminal or pipe ends the preview.
        printed.and_then(|()| out.flush()).is_ok()
    })
    .await
    .with_context(|| format!("previewing {}", args.file.display()))
}

/// The rows as a table in the terminal: a header once, then a line per row
/// as it comes, `+` for a row added and `-` for one taken back.
#[derive(Default)]
struct Table {
    columns: Vec<String>,
}

impl Table {
    fn print(&mut self, out: &mut impl Write, event: &PreviewEvent) -> std::io::Result<()> {
        match event {
            PreviewEvent::Started { columns, updates } => {
                self.columns = columns.clone();
                if *updates {
                    writeln!(out, "(an updating result: '-' takes a row back, '+' adds one)")?;
                }
                writeln!(out, "  {}", columns.join(" | "))?;
            }
            PreviewEvent::Rows { rows, .. } => {
                for r in rows {
                    writeln!(out, "{}", self.line(r))?;
                }
            }
            PreviewEvent::Ended {
                rows,
                events,
                epochs,
                reason,
                ..
            } => writeln!(
                out,
                "({rows} rows from {events} records in {epochs} epochs; stopped after the {reason} asked for)"
            )?,
        }
        Ok(())
    }

    fn line(&self, r: &PreviewRow) -> String {
        let kind = if r.op == "delete" { '-' } else { '+' };
        let cells: Vec<String> = self
            .columns
            .iter()
            .map(|c| match r.row.get(c) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Null) | None => "NULL".into(),
                Some(other) => other.to_string(),
            })
            .collect();
        format!("{kind} {}", cells.join(" | "))
    }
}
