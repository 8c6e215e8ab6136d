//! A day whose load is not flat: a trough rate most of the day and a peak
//! of some multiple of it for a few hours, priced on Lambda under a fixed
//! group (one size all day, sized for the peak) and under an elastic one
//! (each part of the day at the size its own load needs). Each part is
//! priced from a run measured at its own rate and group size, so what a
//! member costs that the load does not need (requests to it every epoch,
//! its checkpoint objects) is in the figure, not assumed.

use serde::{Deserialize, Serialize};

use crate::{CostError, CostReport};

/// Hours in the day the curve covers.
const HOURS_PER_DAY: f64 = 24.0;

/// The load over a day: `trough_rate` events/s, except `peak_hours` at
/// `peak` times that.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct LoadCurve {
    pub trough_rate: f64,
    /// The peak's rate over the trough's.
    pub peak: f64,
    pub peak_hours: f64,
}

impl LoadCurve {
    /// A curve, or what is wrong with it.
    pub fn new(trough_rate: f64, peak: f64, peak_hours: f64) -> Result<Self, CostError> {
        if !(trough_rate.is_finite() && trough_rate > 0.0) {
            return Err(CostError::Invalid(format!(
                "the trough rate must be a positive number of events per second, not {trough_rate}"
            )));
        }
        if !(peak.is_finite() && peak >= 1.0) {
            return Err(CostError::Invalid(format!(
                "--peak must be at least 1 (times the trough's rate), not {peak}"
            )));
        }
        if !(peak_hours.is_finite() && peak_hours > 0.0 && peak_hours < HOURS_PER_DAY) {
            return Err(CostError::Invalid(format!(
                "--peak-hours must be more than 0 and less than 24, not {peak_hours}"
            )));
        }
        Ok(LoadCurve {
            trough_rate,
            peak,
            peak_hours,
        })
    }

    pub fn peak_rate(&self) -> f64 {
        self.trough_rate * self.peak
    }

    pub fn trough_hours(&self) -> f64 {
        HOURS_PER_DAY - self.peak_hours
    }

    /// Events in the day.
    pub fn events(&self) -> f64 {
        3600.0 * (self.trough_rate * self.trough_hours() + self.peak_rate() * self.peak_hours)
    }
}

/// A part of the day priced: the run measured for it, and the group size it ran at.
#[derive(Debug, Clone, Copy)]
pub struct PricedPart<'a> {
    pub cost: &'a CostReport,
    pub group_size: usize,
}

impl PricedPart<'_> {
    /// Lambda arm64 with its checkpoints on S3 Standard, per hour at `rate`.
    fn usd_per_hour(&self, rate: f64) -> f64 {
        let arm = self
            .cost
            .lambda
            .iter()
            .find(|l| l.arch == crate::Arch::Arm64)
            .expect("a report prices arm64");
        arm.usd_per_million_events * rate * 3600.0 / 1e6
    }
}

/// One way to run the day: the group's size in each part and what it costs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DayPlan {
    pub trough_group_size: usize,
    pub peak_group_size: usize,
    pub trough_usd_per_hour: f64,
    pub peak_usd_per_hour: f64,
    pub usd_per_day: f64,
    pub usd_per_million_events: f64,
    /// Times a day the group changes size.
    pub rescales_per_day: u32,
}

/// The day priced both ways (Lambda arm64, checkpoints on S3 Standard),
/// beside Managed Flink sized for the peak.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DayCost {
    pub curve: LoadCurve,
    pub fixed: DayPlan,
    pub elastic: DayPlan,
    /// `elastic.usd_per_day / fixed.usd_per_day`.
    pub elastic_over_fixed: f64,
    /// KPUs for the peak, running all day (its autoscaler restarts the
    /// job to change them, so it is priced at one size).
    pub flink_usd_per_day: f64,
}

fn plan(curve: &LoadCurve, trough: PricedPart, peak: PricedPart) -> DayPlan {
    let trough_hour = trough.usd_per_hour(curve.trough_rate);
    let peak_hour = peak.usd_per_hour(curve.peak_rate());
    let day = trough_hour * curve.trough_hours() + peak_hour * curve.peak_hours;
    DayPlan {
        trough_group_size: trough.group_size,
        peak_group_size: peak.group_size,
        trough_usd_per_hour: trough_hour,
        peak_usd_per_hour: peak_hour,
        usd_per_day: day,
        usd_per_million_events: day / curve.events() * 1e6,
        rescales_per_day: if trough.group_size == peak.group_size {
            0
        } else {
            2
        },
    }
}

/// Price the day: each group as `(trough, peak)`, each part measured at
/// its own rate and the group's size then.
pub fn price_day(
    curve: LoadCurve,
    fixed: (PricedPart, PricedPart),
    elastic: (PricedPart, PricedPart),
) -> DayCost {
    let fixed_plan = plan(&curve, fixed.0, fixed.1);
    let elastic_plan = plan(&curve, elastic.0, elastic.1);
    // The fixed peak's report was priced at the peak's rate, so it has a
    // month; Flink runs that all day.
    let flink_month = fixed.1.cost.flink.usd_per_month.unwrap_or_default();
    DayCost {
        curve,
        elastic_over_fixed: elastic_plan.usd_per_day
            / fixed_plan.usd_per_day.max(f64::MIN_POSITIVE),
        fixed: fixed_plan,
        elastic: elastic_plan,
        flink_usd_per_day: flink_month / crate::estimate::HOURS_PER_MONTH * HOURS_PER_DAY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Measured, ModelOptions, Prices, estimate};

    fn report(invocations: u64, billed_ms: u64, events: u64, rate: f64) -> CostReport {
        let m = Measured {
            events,
            invocations,
            billed_ms,
            checkpoint_puts: 0,
            checkpoint_bytes: 0,
            checkpoint_gets: 0,
            cpu_s: 1.0,
        };
        let opts = ModelOptions {
            rate: Some(rate),
            ..ModelOptions::default()
        };
        estimate(&m, &Prices::default(), &opts)
    }

    #[test]
    fn a_day_adds_its_hours_at_their_own_rates() {
        let curve = LoadCurve::new(1000.0, 10.0, 4.0).unwrap();
        assert_eq!(curve.events(), 3600.0 * (1000.0 * 20.0 + 10_000.0 * 4.0));
        // Per million events: 1,000 requests (trough, 8 members), 250
        // (trough, 1 member), 400 (peak, 8 members); no billed time.
        let fixed_trough = report(1000, 0, 1_000_000, 1000.0);
        let elastic_trough = report(250, 0, 1_000_000, 1000.0);
        let peak = report(400, 0, 1_000_000, 10_000.0);
        let part = |cost, group_size| PricedPart { cost, group_size };
        let day = price_day(
            curve,
            (part(&fixed_trough, 8), part(&peak, 8)),
            (part(&elastic_trough, 1), part(&peak, 8)),
        );
        let request = Prices::default().lambda_per_million_requests / 1e6;
        // Trough: 3.6 M events an hour; peak: 36 M.
        let fixed = 20.0 * 3.6 * 1000.0 * request + 4.0 * 36.0 * 400.0 * request;
        let elastic = 20.0 * 3.6 * 250.0 * request + 4.0 * 36.0 * 400.0 * request;
        assert!((day.fixed.usd_per_day - fixed).abs() < 1e-9, "{day:?}");
        assert!((day.elastic.usd_per_day - elastic).abs() < 1e-9, "{day:?}");
        assert!((day.elastic_over_fixed - elastic / fixed).abs() < 1e-9);
        assert_eq!(
            (day.fixed.rescales_per_day, day.elastic.rescales_per_day),
            (0, 2)
        );
        assert!(day.flink_usd_per_day > 0.0);
    }

    #[test]
    fn a_curve_that_is_not_a_day_is_refused() {
        assert!(LoadCurve::new(1000.0, 0.5, 4.0).is_err());
        assert!(LoadCurve::new(1000.0, 10.0, 24.0).is_err());
        assert!(LoadCurve::new(0.0, 10.0, 4.0).is_err());
        assert!(LoadCurve::new(f64::NAN, 10.0, 4.0).is_err());
    }
}
