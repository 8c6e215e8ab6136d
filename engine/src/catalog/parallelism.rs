//! How many instances read a source table that does not say (`'parallelism'`):
//! one per partition (Kafka) or open shard (Kinesis), bounded by what can
//! run at once — the cores this process may use in-process, the group size
//! on Lambda. A query resumed from a checkpoint keeps the instances its
//! checkpoint was written with: the offsets log is kept per instance.
//!
//! The choice is written into the table's declaration, so every function
//! built from the plan reads the same number, and kept with the reason for
//! `skein explain`.

use std::collections::BTreeMap;

use super::Catalog;
use crate::error::Result;
use crate::source::SourceConfig;

/// The option a source table sets its instances with.
pub const PARALLELISM_OPTION: &str = "parallelism";

/// What bounds a source's default instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceBudget {
    /// In-process: the cores the process may use.
    Cores(usize),
    /// On Lambda: the members of a function group.
    Members(usize),
}

impl SourceBudget {
    /// The cores this process may use (its affinity and cgroup quota).
    pub fn cores() -> Self {
        SourceBudget::Cores(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    fn bound(self) -> usize {
        match self {
            SourceBudget::Cores(n) | SourceBudget::Members(n) => n.max(1),
        }
    }

    fn describe(self) -> String {
        match self {
            SourceBudget::Cores(n) => format!("{n} core{}", plural(n)),
            SourceBudget::Members(n) => format!("group size {n}"),
        }
    }
}

impl Default for SourceBudget {
    fn default() -> Self {
        Self::cores()
    }
}

/// The instances a checkpoint was written with, per table name, which a
/// resumed query keeps.
pub type SourcePins = BTreeMap<String, usize>;

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

impl Catalog {
    /// Set what bounds a source table's default instances.
    pub fn set_source_budget(&mut self, budget: SourceBudget) {
        self.source_budget = budget;
    }

    /// Keep the instances a checkpoint was written with.
    pub fn pin_sources(&mut self, pins: SourcePins) {
        self.source_pins = pins;
    }

    /// Give table `name` its instances when it does not say, in `config`;
    /// returns why it reads with as many as it does (`None`: its kind is not
    /// partitioned, and it reads as it always did).
    pub async fn choose_parallelism(
        &self,
        name: &str,
        config: &mut SourceConfig,
    ) -> Result<Option<String>> {
        let (kind, factory) = self.source_factory(config)?;
        if config.option(PARALLELISM_OPTION).is_some() {
            return Ok(Some("set by the table's 'parallelism'".into()));
        }
        // A backend option (Lambda's 'mode' 'push') hands the table's
        // batches to the backend, which decides who reads them.
        if kind.backend.iter().any(|o| config.option(o).is_some()) {
            return Ok(None);
        }
        let view = self.source_view_of(kind, config).into_owned();
        let (instances, why) = match factory.partitions(&view).await {
            Ok(None) => return Ok(None),
            Ok(Some(partitions)) => {
                let partitions = partitions.max(1);
                let budget = self.source_budget;
                let chosen = partitions.min(budget.bound());
                let why = format!(
                    "the fewer of {partitions} partition{} and {}",
                    plural(partitions),
                    budget.describe()
                );
                match self.source_pins.get(name).copied() {
                    Some(pinned) if pinned != chosen => (
                        pinned,
                        format!(
                            "as its checkpoint was written (a fresh start would take {chosen}: {why})"
                        ),
                    ),
                    _ => (chosen, why),
                }
            }
            Err(e) => {
                let one = self.source_pins.get(name).copied().unwrap_or(1);
                // Said by `skein explain`; a warning here would be a second
                // line before the one-line error of a run that then fails.
                tracing::debug!(table = name, error = %e, "sizing the source: its partitions could not be read");
                (one, format!("its partitions could not be read ({e})"))
            }
        };
        config
            .options
            .insert(PARALLELISM_OPTION.into(), instances.to_string());
        Ok(Some(why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_bounds_and_describes() {
        assert_eq!(SourceBudget::Cores(0).bound(), 1);
        assert_eq!(SourceBudget::Cores(1).describe(), "1 core");
        assert_eq!(SourceBudget::Members(8).describe(), "group size 8");
    }
}
