//! YSB's window latency: `time_updated - window end` of every (campaign,
//! window), as YSB's `updated.txt` reports it, and its percentiles.

use serde::Serialize;
use skein_generators::ysb::WINDOW_MS;

use crate::Windows;

/// The distribution of `time_updated - window end` over the windows
/// measured.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub windows: usize,
    /// Distinct window ends among them: how many times windows closed.
    pub closings: usize,
    pub p50: i64,
    pub p90: i64,
    pub p99: i64,
    pub max: i64,
}

/// The latency of the windows that ended by `until_ms` if given (a bench
/// measures only those that ended under load), else of every window.
/// Percentiles are nearest-rank over the sorted latencies.
pub fn latencies(windows: &Windows, until_ms: Option<i64>) -> Latency {
    let mut l: Vec<i64> = windows
        .iter()
        .filter(|((_, w), _)| until_ms.is_none_or(|u| w + WINDOW_MS <= u))
        .map(|((_, w), (_, updated))| updated - (w + WINDOW_MS))
        .collect();
    let closings = windows
        .keys()
        .map(|(_, w)| *w)
        .filter(|w| until_ms.is_none_or(|u| w + WINDOW_MS <= u))
        .collect::<std::collections::BTreeSet<i64>>()
        .len();
    l.sort_unstable();
    let pct = |p: f64| -> i64 {
        if l.is_empty() {
            return 0;
        }
        l[((l.len() as f64 - 1.0) * p).round() as usize]
    };
    Latency {
        windows: l.len(),
        closings,
        p50: pct(0.5),
        p90: pct(0.9),
        p99: pct(0.99),
        max: l.last().copied().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One window per latency, all of campaign `c`, starting at `i * WINDOW_MS`.
    fn windows(latencies: &[i64]) -> Windows {
        latencies
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let start = i as i64 * WINDOW_MS;
                (("c".to_string(), start), (1, start + WINDOW_MS + l))
            })
            .collect()
    }

    #[test]
    fn percentiles_of_a_hundred_windows() {
        // Latencies 1..=100 ms, in no particular order of windows.
        let mut l: Vec<i64> = (1..=100).collect();
        l.reverse();
        let got = latencies(&windows(&l), None);
        assert_eq!(
            got,
            Latency {
                windows: 100,
                closings: 100,
                p50: 51,
                p90: 90,
                p99: 99,
                max: 100
            }
        );
    }

    #[test]
    fn only_windows_ended_by_the_cut_count() {
        let w = windows(&[10, 20, 30, 4000]);
        // Windows 0 and 1 end by 2 * WINDOW_MS; 2 and 3 after.
        let got = latencies(&w, Some(2 * WINDOW_MS));
        assert_eq!((got.windows, got.max), (2, 20));
        assert_eq!(latencies(&w, None).max, 4000);
    }

    #[test]
    fn no_windows_is_all_zero() {
        assert_eq!(latencies(&Windows::new(), None), Latency::default());
    }
}
