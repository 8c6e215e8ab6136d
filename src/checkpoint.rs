//! `'startup' 'checkpoint'`: a source resumes from the offsets the query's
//! exactly-once sink committed. Sinks that keep offsets store them their
//! own way and hand them back through the catalog; this reads them before
//! the query starts and turns the source's startup into explicit offsets,
//! in the plan every function is built from.

use anyhow::Result;
use skein_engine::catalog::Catalog;
use skein_engine::planner::QueryPlan;

/// Resolves every source of `plan` that resumes from its sink; returns the
/// tables resolved with their offsets, for the log.
pub async fn resume_from_sink(
    catalog: &Catalog,
    plan: &mut QueryPlan,
) -> Result<Vec<(String, String)>> {
    let sink = plan.sink.clone();
    let mut resolved = vec![];
    for stage in &mut plan.stages {
        for leaf in &mut stage.sources {
            if !catalog.resumes_from_sink(&leaf.config) {
                continue;
            }
            let (config, offsets) = catalog
                .resume_from_sink(&leaf.table, &leaf.config, &sink)
                .await?;
            leaf.config = config;
            let text = offsets
                .iter()
                .map(|(p, o)| format!("{p}:{o}"))
                .collect::<Vec<_>>()
                .join(",");
            resolved.push((leaf.table.clone(), text));
        }
    }
    Ok(resolved)
}
