//! What the benchmarks measure and share: medians, a run's series of
//! epochs, the throughput of each epoch, and where plots go.

use std::path::{Path, PathBuf};

pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Per epoch: seconds since the start, events so far, and bytes (here:
/// checkpoint bytes so far).
pub type EpochSeries = Vec<(f64, u64, u64)>;

/// Events per second of each epoch of a series.
pub fn throughput(series: &EpochSeries) -> Vec<(f64, f64)> {
    let mut out = vec![];
    let mut last = (0.0, 0);
    for &(t, events, _) in series {
        let dt = t - last.0;
        if dt > 0.0 {
            out.push((t, events.saturating_sub(last.1) as f64 / dt));
        }
        last = (t, events);
    }
    out
}

/// `FILE.svg` for one query, `FILE-qN.svg` for each of several.
pub fn plot_file(file: &Path, query: u32, queries: usize) -> PathBuf {
    if queries == 1 {
        return file.to_path_buf();
    }
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("plot");
    file.with_file_name(format!("{stem}-q{query}.svg"))
}
