//! `ysb bench --rate R --plot FILE.svg`: each window's latency and the
//! views it counted, over the run.

use std::collections::BTreeMap;
use std::path::Path;

use skein_engine::driver::RunReport;
use skein_generators::ysb::WINDOW_MS;
use skein_plot::{Series, write_svg};

use crate::Windows;
use crate::error::Result;

/// Per window (ended before the load stopped): the latest update's latency
/// over its campaigns, and the views counted per second of it.
pub fn latency_plot(
    file: &Path,
    found: &Windows,
    report: &RunReport,
    stopped_ms: i64,
    rate: u64,
) -> Result<()> {
    let mut windows: BTreeMap<i64, (u64, i64)> = BTreeMap::new();
    for ((_, start), (count, updated)) in found {
        if start + WINDOW_MS > stopped_ms {
            continue;
        }
        let w = windows.entry(*start).or_insert((0, i64::MIN));
        w.0 += count;
        w.1 = w.1.max(updated - (start + WINDOW_MS));
    }
    let first = windows.keys().next().copied().unwrap_or(0);
    let at = |start: i64| (start + WINDOW_MS - first) as f64 / 1000.0;
    let latency = windows
        .iter()
        .map(|(s, (_, l))| (at(*s), *l as f64))
        .collect();
    let views = windows
        .iter()
        .map(|(s, (n, _))| (at(*s), *n as f64 * 1000.0 / WINDOW_MS as f64))
        .collect();
    let title = format!(
        "YSB at {rate} events/s: {} events in {} epochs",
        report.events, report.epochs
    );
    write_svg(
        file,
        &title,
        &[
            Series {
                name: "views counted per second, by window".into(),
                points: views,
            },
            Series {
                name: "window latency, slowest campaign (ms)".into(),
                points: latency,
            },
        ],
    )?;
    Ok(())
}
