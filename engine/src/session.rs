//! The DataFusion session every query is planned in and every function
//! decodes its plan in: our window functions, a table factory per source
//! kind, and the optimizer settings a plan cut into functions needs.

use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::exec::SourceTableFactory;
use crate::source::SourceRegistry;
use crate::window::{hop_udf, session_udwf, tumble_udf};

/// A session with our functions and a table factory for every source kind.
pub fn session(registry: &SourceRegistry, group_size: usize) -> SessionContext {
    let mut config = SessionConfig::new()
        .with_target_partitions(group_size.max(1))
        .with_information_schema(false)
        // The planner asks it what the table a query writes can take.
        .with_extension(Arc::new(registry.clone()));
    let opts = config.options_mut();
    // Joins must shuffle both sides: a broadcast build side has no place to live.
    opts.optimizer.hash_join_single_partition_threshold = 0;
    opts.optimizer.hash_join_single_partition_threshold_rows = 0;
    // Functions run one partition each; spreading rows over threads is moot.
    opts.optimizer.enable_round_robin_repartition = false;
    // Dynamic filters link operators at run time, which a cut plan cannot do.
    opts.optimizer.enable_dynamic_filter_pushdown = false;
    let factory = Arc::new(SourceTableFactory {
        registry: registry.clone(),
    });
    let mut builder = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_physical_optimizer_rules(crate::lookup::plan::rules(registry));
    for kind in registry.kinds().into_iter().chain(registry.lookup_kinds()) {
        builder
            .table_factories()
            .get_or_insert_default()
            .insert(kind, factory.clone());
    }
    let ctx = SessionContext::new_with_state(builder.build());
    ctx.register_udf(tumble_udf());
    ctx.register_udf(hop_udf());
    ctx.register_udwf(session_udwf());
    ctx.register_udf(crate::functions::count_char_udf());
    ctx
}
