//! The DataFusion session every query is planned in and every function
//! decodes its plan in: our window functions, a table factory for every
//! kind of the catalog, and the optimizer settings a plan cut into
//! functions needs. The catalog rides along as a config extension
//! ([`catalog_of`]), for the planner to ask what a kind can do.

use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::catalog::Catalog;
use crate::catalog::table::CatalogTableFactory;
use crate::window::{hop_udf, session_udwf, tumble_udf};

/// A session with our functions and a table factory for every kind.
pub fn session(catalog: &Catalog, group_size: usize) -> SessionContext {
    let mut config = SessionConfig::new()
        .with_target_partitions(group_size.max(1))
        .with_information_schema(false)
        // The planner asks it what the table a query writes can take.
        .with_extension(Arc::new(catalog.clone()));
    let opts = config.options_mut();
    // Joins must shuffle both sides: a broadcast build side has no place to live.
    opts.optimizer.hash_join_single_partition_threshold = 0;
    opts.optimizer.hash_join_single_partition_threshold_rows = 0;
    // Functions run one partition each; spreading rows over threads is moot.
    opts.optimizer.enable_round_robin_repartition = false;
    // Dynamic filters link operators at run time, which a cut plan cannot do.
    opts.optimizer.enable_dynamic_filter_pushdown = false;
    // A scalar subquery becomes a join: run apart before the main plan
    // (`ScalarSubqueryExec`), its result would have to reach every stage
    // that reads it, which no exchange carries, and its plan does not
    // decode cut in stages. As a join it is one more input that updates.
    opts.optimizer.enable_physical_uncorrelated_scalar_subquery = false;
    let factory = Arc::new(CatalogTableFactory {
        catalog: catalog.clone(),
    });
    let mut builder = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_physical_optimizer_rules(crate::lookup::plan::rules(catalog));
    for kind in catalog.kinds() {
        builder
            .table_factories()
            .get_or_insert_default()
            .insert(kind, factory.clone());
    }
    let ctx = SessionContext::new_with_state(builder.build());
    ctx.register_udf(tumble_udf());
    ctx.register_udf(hop_udf());
    ctx.register_udwf(session_udwf());
    ctx.register_udf(crate::udf::count_char_udf());
    ctx
}

/// Declare table `name` in `ctx` from code, as `CREATE EXTERNAL TABLE name
/// STORED AS <kind> LOCATION '<location>' OPTIONS (...)` does in SQL: the
/// catalog `ctx` plans with checks the kind and options and makes the
/// table. `schema`: its columns, or none for a kind that knows its own
/// (the generators).
pub fn register_table(
    ctx: &SessionContext,
    name: &str,
    config: crate::source::SourceConfig,
    schema: Option<datafusion::arrow::datatypes::SchemaRef>,
) -> crate::Result<()> {
    let catalog = catalog_of(ctx).ok_or_else(|| {
        crate::EngineError::plan("a table is registered in a session made by session()")
    })?;
    let factory = CatalogTableFactory {
        catalog: (*catalog).clone(),
    };
    let schema = schema.unwrap_or_else(|| Arc::new(datafusion::arrow::datatypes::Schema::empty()));
    let table = factory
        .declare(name, config, schema)
        .map_err(|e| crate::EngineError::plan(format!("table {name}: {e}")))?;
    ctx.register_table(name, table)?;
    Ok(())
}

/// The catalog a session made by [`session`] plans with.
pub fn catalog_of(ctx: &SessionContext) -> Option<Arc<Catalog>> {
    ctx.state().config().get_extension::<Catalog>()
}
