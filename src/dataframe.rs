//! Queries built in Rust with DataFusion's DataFrame API instead of SQL
//! text: a [`DataFrameQuery`] is a session over this binary's catalog,
//! where a program declares its tables (as `CREATE EXTERNAL TABLE` would),
//! builds a [`DataFrame`] over them, and hands it back to be explained or
//! run in-process like a SQL file. docs/library.md shows the whole API.

use anyhow::{Context, Result};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrame;
use datafusion::prelude::SessionContext;
use skein_engine::planner::{QueryPlan, plan_dataframe, session};
use skein_engine::query::prepare_dataframe;
use skein_engine::source::SourceConfig;
use skein_engine::verify::Comparison;

use crate::args::CommonRunArgs;
use crate::registry::{Registries, registries};
use crate::report::Report;

/// A session to build one query in, with the arguments it runs with.
pub struct DataFrameQuery {
    regs: Registries,
    ctx: SessionContext,
    args: CommonRunArgs,
}

impl DataFrameQuery {
    /// A session over this binary's table kinds, planned and run as
    /// `skein run` would with `args` (see [`CommonRunArgs::from_flags`]).
    pub fn new(args: CommonRunArgs) -> Self {
        let regs = registries();
        let ctx = session(&regs.catalog, args.plan.group_size());
        DataFrameQuery { regs, ctx, args }
    }

    /// The session to build the DataFrame in: its tables, and DataFusion's
    /// functions with ours (`tumble`, `hop`, `session`).
    pub fn session(&self) -> &SessionContext {
        &self.ctx
    }

    /// Declare table `name` of `kind` at `location` with `options`, as
    /// `CREATE EXTERNAL TABLE name STORED AS kind LOCATION 'location'
    /// OPTIONS (...)` does; `schema`: its columns, or none for a kind that
    /// knows its own (NEXMARK, YSB). The catalog checks the options.
    pub fn register(
        &self,
        name: &str,
        kind: &str,
        location: &str,
        options: &[(&str, &str)],
        schema: Option<SchemaRef>,
    ) -> Result<()> {
        let config = SourceConfig {
            kind: kind.to_ascii_uppercase(),
            location: location.to_string(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        skein_engine::session::register_table(&self.ctx, name, config, schema)?;
        Ok(())
    }

    /// The stages `frame` is cut into, as `skein explain` prints them.
    pub async fn plan(&self, frame: DataFrame) -> Result<QueryPlan> {
        plan_dataframe(&self.ctx, frame, &self.args.options())
            .await
            .context("planning the DataFrame")
    }

    /// Run `frame` on the in-process runtime, as `skein run` runs a SQL
    /// file: the typed report (with the result rows), and the differences
    /// from single-process DataFusion when `--verify` found any.
    pub async fn run(self, frame: DataFrame) -> Result<(Report, Option<Comparison>)> {
        let DataFrameQuery { regs, ctx, args } = self;
        let prepared = prepare_dataframe(&regs.catalog, ctx, frame, &args.options())
            .await
            .context("planning the DataFrame")?;
        crate::run::run_prepared(regs, prepared, &args, None).await
    }
}
