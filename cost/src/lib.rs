//! The cost model: what a query measured (invocations, billed
//! milliseconds, checkpoint writes, CPU time) priced as a standing query on
//! Lambda (x86_64 and arm64), on always-on VMs and on Managed Service for
//! Apache Flink. Prices live in one table ([`Prices`]) with their date and
//! source, overridable by a JSON file. docs/cost.md explains the model.

mod day;
mod estimate;
mod exchange;
mod prices;

pub use day::{DayCost, DayPlan, LoadCurve, PricedPart, price_day};
pub use estimate::{
    Arch, CostReport, LambdaCost, Measured, ModelOptions, ObjectStore, ServerCost, estimate,
};
pub use exchange::{ExchangeCost, ExchangeUsage, exchange_cost};
pub use prices::{PRICES_DATE, PRICES_SOURCE, Prices};

/// What can go wrong reading a price file.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    #[error("reading the price file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the price file {path} is not a price table: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("{0}")]
    Invalid(String),
}
