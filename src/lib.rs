//! The `skein` library: what the `skein` CLI and the `skein-function`
//! Lambda bootstrap share. The registry of source and sink kinds, the drivers
//! that run a query locally, on Lambda and as YSB, and the reports they print.
//! `src/main.rs` only parses the command line and calls in here.
//!
//! A module per command, named after it: `run/` (`skein run`, `explain`,
//! `nexmark`), `lambda/` (`deploy`, `destroy`, `stop`, `start`, `package`,
//! `run --backend lambda`, `bench lambda`), `bench/`, `cost/`, `gen/`,
//! `ysb/`, `status.rs`, `ui.rs`. What several share: `args.rs` (flags),
//! `report.rs` (a run's report), `dataframe.rs` (queries built in Rust) and
//! `registry.rs` (the table kinds, the one module both binaries use).

/// Modules of the `skein` command (the `cli` feature); the Lambda bootstrap
/// builds without them, and so without the SQL front end.
macro_rules! cli_modules {
    ($($vis:vis mod $name:ident;)*) => { $( #[cfg(feature = "cli")] $vis mod $name; )* };
}

cli_modules! {
    pub mod args;
    pub mod bench;
    pub mod cost;
    pub mod dataframe;
    // `skein gen` (src/gen/): `gen` is a keyword in Rust 2024, hence `r#`.
    pub mod r#gen;
    pub mod lambda;
    pub mod preview;
    pub mod report;
    pub mod rescale;
    pub mod run;
    pub mod status;
    pub mod ui;
    pub mod ysb;
}

pub mod registry;

use clap::Args;
use skein_engine::payload::Encoding;

/// How a query is planned.
#[derive(Args, Clone, Debug)]
pub struct PlanArgs {
    /// Members of each function group (hash partitions of a shuffle)
    /// [default: 8; `skein cost`: sized from the query's measured work].
    #[arg(long, value_parser = positive)]
    pub group_size: Option<usize>,
    /// Compression of payload data: zstd, lz4 or none.
    #[arg(long, default_value = "zstd")]
    pub encoding: Encoding,
    /// Invoke the next stage asynchronously (Event) instead of synchronously.
    #[arg(long)]
    pub invoke_async: bool,
    /// How long an updating query keeps the state of a key nothing touched
    /// (e.g. 1h), for tables without a 'state.ttl' option; default forever.
    #[arg(long, value_parser = duration)]
    pub state_ttl: Option<std::time::Duration>,
    /// Bytes of an updating aggregate's groups each member keeps in memory
    /// (e.g. 64MiB); past them, the groups no epoch touched lately go to
    /// local disk. `unlimited` keeps them all in memory [default: 16MiB].
    #[arg(long, value_parser = memory_budget)]
    pub state_memory: Option<MemoryBudget>,
}

/// `--state-memory`: a size, or no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryBudget(pub Option<u64>);

/// A size in bytes (`1048576`, `512KiB`, `64MiB`, `1GiB`, or KB/MB/GB in
/// thousands), or `unlimited`.
pub fn memory_budget(s: &str) -> std::result::Result<MemoryBudget, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("unlimited") {
        return Ok(MemoryBudget(None));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let unit_bytes: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?}: use B, KiB, MiB, GiB, KB, MB, GB, or unlimited"
            ));
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 64MiB) or unlimited"))?;
    match n.checked_mul(unit_bytes) {
        Some(0) => Err("must be more than zero (or unlimited)".into()),
        Some(bytes) => Ok(MemoryBudget(Some(bytes))),
        None => Err(format!("{s:?} is too large")),
    }
}

impl PlanArgs {
    /// Members of each function group: as given, else the planner's default.
    pub fn group_size(&self) -> usize {
        self.group_size
            .unwrap_or(skein_engine::planner::DEFAULT_GROUP_SIZE)
    }

    /// The planner's options; the run's lineage and checkpointing are the
    /// runner's to fill in.
    pub fn options(&self) -> skein_engine::planner::PlanOptions {
        skein_engine::planner::PlanOptions {
            group_size: self.group_size(),
            encoding: self.encoding,
            invoke_async: self.invoke_async,
            state_ttl: self.state_ttl,
            state_memory: match self.state_memory {
                Some(MemoryBudget(budget)) => budget,
                None => Some(skein_engine::planner::DEFAULT_STATE_MEMORY),
            },
            ..Default::default()
        }
    }
}

/// A duration flag longer than zero (`500ms`, `30s`, `2m`, `1h`).
pub fn duration(s: &str) -> std::result::Result<std::time::Duration, String> {
    match skein_engine::interval::parse_duration(s)? {
        d if d.is_zero() => Err("must be longer than zero".into()),
        d => Ok(d),
    }
}

/// A count that must be at least one (`--group-size`, `--repeat`, ...):
/// zero would plan no members or take the median of nothing.
pub fn positive(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// jemalloc as the global allocator of both binaries (feature `jemalloc`).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// mimalloc as the global allocator of both binaries (feature `mimalloc`).
#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The global allocator this build uses, for benchmark reports.
pub const ALLOCATOR_NAME: &str = if cfg!(feature = "jemalloc") {
    "jemalloc"
} else if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "glibc"
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_budget_is_a_size_or_unlimited() {
        assert_eq!(memory_budget("64MiB"), Ok(MemoryBudget(Some(64 << 20))));
        assert_eq!(memory_budget("512 KiB"), Ok(MemoryBudget(Some(512 << 10))));
        assert_eq!(memory_budget("2GB"), Ok(MemoryBudget(Some(2_000_000_000))));
        assert_eq!(memory_budget("4096"), Ok(MemoryBudget(Some(4096))));
        assert_eq!(memory_budget("unlimited"), Ok(MemoryBudget(None)));
        for bad in ["", "0", "64TB", "MiB", "-1MiB", "99999999999999999999GiB"] {
            assert!(memory_budget(bad).is_err(), "{bad:?}");
        }
    }
}
