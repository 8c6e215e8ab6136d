//! The cost section every run and benchmark report carries: what a run
//! measured, priced on Lambda, a VM and Managed Flink (the model and the
//! prices are skein-cost's); `skein cost` itself is `cost/mod.rs`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde_json::Value;
use skein_cost::{CostReport, Measured, ModelOptions, Prices, estimate};
use skein_engine::driver::RunReport;
use skein_engine::usage::Usage;

/// What the cost model assumes; shared by every command that reports a cost.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A JSON file overriding any of the prices (docs/cost.md lists them).
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
    /// Memory of each Lambda function, MB (1,769 MB is one vCPU); `skein
    /// cost` takes it from --memory.
    #[arg(skip = ONE_VCPU_MB)]
    pub memory: u32,
    /// The events arrive through Kinesis, records of this many bytes.
    #[arg(long, value_name = "BYTES")]
    pub kinesis_record_bytes: Option<u64>,
    /// Events/s one Managed Flink KPU sustains [default: what one core of
    /// Skein did in the measured run].
    #[arg(long, value_name = "EVENTS_PER_S")]
    pub flink_events_per_kpu: Option<f64>,
}

/// A Lambda function's memory with one full vCPU.
pub(crate) const ONE_VCPU_MB: u32 = 1769;

impl Default for ModelArgs {
    fn default() -> Self {
        ModelArgs {
            prices: None,
            memory: ONE_VCPU_MB,
            kinesis_record_bytes: None,
            flink_events_per_kpu: None,
        }
    }
}

pub(crate) fn positive_rate(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        Ok(_) => Err("must be a positive number of events per second".into()),
        Err(e) => Err(e.to_string()),
    }
}

impl ModelArgs {
    pub fn prices(&self) -> Result<Prices> {
        match &self.prices {
            Some(path) => Ok(Prices::load(path)?),
            None => Ok(Prices::default()),
        }
    }

    pub(crate) fn options(&self, rate: Option<f64>) -> ModelOptions {
        ModelOptions {
            rate,
            memory_mb: self.memory,
            kinesis_record_bytes: self.kinesis_record_bytes,
            flink_events_per_kpu_s: self.flink_events_per_kpu,
        }
    }
}

pub use skein_engine::usage::process_cpu_s;

/// What a run measured, for the model.
pub fn measured(report: &RunReport, cpu_s: f64) -> Measured {
    Measured {
        events: report.events,
        invocations: report.invocations,
        billed_ms: report.billed_ms,
        checkpoint_puts: report.checkpoint_puts,
        checkpoint_bytes: report.checkpoint_bytes,
        checkpoint_gets: 0,
        cpu_s,
    }
}

/// The cost section of a run's report; `rate` gives monthly figures.
pub fn section(m: &Measured, rate: Option<f64>, model: &ModelArgs) -> Result<CostReport> {
    Ok(estimate(m, &model.prices()?, &model.options(rate)))
}

/// The section as JSON.
pub fn to_json(c: &CostReport) -> Value {
    serde_json::to_value(c).unwrap_or(Value::Null)
}

/// What a run on Lambda measured: the usage its functions reported in
/// their answers (skein_engine::usage), and the driver's own checkpoint
/// writes (epoch plans, commits).
pub fn measured_on_lambda(events: u64, usage: &Usage, driver_puts: u64) -> Measured {
    Measured {
        events,
        invocations: usage.invocations,
        billed_ms: usage.billed_ms,
        checkpoint_puts: usage.checkpoint_puts + driver_puts,
        checkpoint_bytes: 0,
        checkpoint_gets: 0,
        cpu_s: usage.cpu_ms as f64 / 1000.0,
    }
}

/// How a Lambda run's cost section was measured.
pub fn lambda_note(invoke_async: bool) -> String {
    let mut note = "Lambda: each function's handler time (rounded up to 1 ms) and CPU, as \
                    it reports them in its answer"
        .to_string();
    if invoke_async {
        note.push_str(
            "; async hops answer nobody, so they count as requests of unknown duration \
             and what they invoke is missing",
        );
    }
    note
}

/// One line for a text report.
pub fn one_line(c: &CostReport) -> String {
    if c.measured.events == 0 {
        return "cost per million events: no events, nothing to price".into();
    }
    let money = |x: f64| format!("${}", dollars(x));
    let mut line = format!(
        "cost per million events: Lambda {} (x86_64) / {} (arm64) at {} MB; {} {}; Managed Flink {} (prices of {})",
        money(c.lambda[0].usd_per_million_events),
        money(c.lambda[1].usd_per_million_events),
        c.lambda[0].memory_mb,
        c.vm.unit,
        money(c.vm.usd_per_million_events),
        money(c.flink.usd_per_million_events),
        c.prices
    );
    if let Some(on) = &c.measured_on {
        line.push_str(&format!("; measured on {on}"));
    }
    line
}

/// Dollars with the digits that matter: cents above $10, four significant
/// figures below.
pub(crate) fn dollars(x: f64) -> String {
    if x >= 10.0 {
        let whole = format!("{:.2}", x);
        let (int, frac) = whole.split_once('.').unwrap_or((&whole, "00"));
        format!("{}.{frac}", thousands(int))
    } else if x == 0.0 {
        "0".into()
    } else {
        let digits = (3 - x.log10().floor() as i32).max(0) as usize;
        format!("{x:.digits$}")
    }
}

pub(crate) fn thousands(int: &str) -> String {
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_keep_their_digits() {
        assert_eq!(dollars(1234.567), "1,234.57");
        assert_eq!(dollars(0.004033), "0.004033");
        assert_eq!(dollars(1.5), "1.500");
    }
}
