//! Benchmark figures over time as one SVG: a panel per series (throughput,
//! window latency, state bytes), stacked over a shared time axis, so each
//! keeps its own scale. SVG only: text is left to the viewer's fonts.

use std::path::Path;

use plotters::prelude::*;

/// One measured quantity over time.
#[derive(Debug, Clone)]
pub struct Series {
    /// What it is, with its unit: "window latency (ms)".
    pub name: String,
    /// (seconds since the start, value).
    pub points: Vec<(f64, f64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("nothing to plot: every series is empty")]
    Empty,
    #[error("drawing {path}: {reason}")]
    Draw { path: String, reason: String },
}

const PANEL_HEIGHT: u32 = 220;
const WIDTH: u32 = 900;
const COLOURS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];

/// Draw `series` under `title` to the SVG file `path`.
pub fn write_svg(path: &Path, title: &str, series: &[Series]) -> Result<(), PlotError> {
    let drawn: Vec<&Series> = series.iter().filter(|s| !s.points.is_empty()).collect();
    if drawn.is_empty() {
        return Err(PlotError::Empty);
    }
    let shown = path.display().to_string();
    let fail = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: shown.clone(),
        reason: e.to_string(),
    };
    let height = PANEL_HEIGHT * drawn.len() as u32 + 40;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let root = root
        .titled(title, ("sans-serif", 20))
        .map_err(|e| fail(&e))?;
    let x_max = drawn
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1.0);
    for (i, (panel, s)) in root
        .split_evenly((drawn.len(), 1))
        .iter()
        .zip(&drawn)
        .enumerate()
    {
        let y_max = s.points.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1.0) * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .caption(&s.name, ("sans-serif", 15))
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_label_formatter(&|v| compact(*v))
            .draw()
            .map_err(|e| fail(&e))?;
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// 1.2M, 350k, 12: axis labels that fit.
fn compact(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v.abs() >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_every_series() {
        let path = std::env::temp_dir().join(format!("skein-plot-{}.svg", std::process::id()));
        let series = vec![
            Series {
                name: "throughput (events/s)".into(),
                points: (0..30).map(|t| (t as f64, 100_000.0 + t as f64)).collect(),
            },
            Series {
                name: "window latency (ms)".into(),
                points: (0..30)
                    .map(|t| (t as f64, 200.0 + (t % 5) as f64))
                    .collect(),
            },
            Series {
                name: "nothing".into(),
                points: vec![],
            },
        ];
        write_svg(&path, "YSB at 100,000 events/s", &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("throughput (events/s)"));
        assert!(svg.contains("window latency (ms)"));
        assert!(svg.contains("YSB at 100,000 events/s"));
        // One line per drawn series, in its colour; an empty one is left out.
        let line = |colour: &str| {
            svg.lines()
                .filter(|l| l.starts_with("<polyline") && l.contains(colour))
                .count()
        };
        assert_eq!(line("#1F77B4"), 1, "{svg}");
        assert_eq!(line("#D62728"), 1, "{svg}");
        assert_eq!(line("#2CA02C"), 0, "{svg}");
        assert!(!svg.contains("nothing"));
    }

    #[test]
    fn nothing_to_draw_is_an_error() {
        let path = std::env::temp_dir().join("skein-plot-empty.svg");
        assert!(matches!(write_svg(&path, "t", &[]), Err(PlotError::Empty)));
    }
}
