//! `'startup' 'checkpoint'`: a Kafka source resumes from the offsets the
//! query's exactly-once sink committed. The sink kinds that keep offsets
//! (Kafka with transactions, Redis with MULTI/EXEC) each store them their own
//! way; this reads them before the query starts and turns the source's
//! startup into explicit offsets, in the plan every function is built from.

use anyhow::{Context, Result, bail};
use skein_engine::planner::QueryPlan;

/// Resolves every checkpointed Kafka source of `plan`; returns the tables
/// resolved with their offsets, for the log.
pub async fn resume_from_sink(plan: &mut QueryPlan) -> Result<Vec<(String, String)>> {
    let sink = plan.sink.clone();
    let mut resolved = vec![];
    for stage in &mut plan.stages {
        for leaf in &mut stage.sources {
            let config = &mut leaf.config;
            let checkpointed = config.kind.eq_ignore_ascii_case("KAFKA")
                && config.option("startup") == Some("checkpoint");
            if !checkpointed {
                continue;
            }
            let Some(checkpoint) = sink.options.get("checkpoint").filter(|c| !c.is_empty()) else {
                bail!(
                    "table {}: 'startup' 'checkpoint' needs a sink that keeps offsets under a \
                     'checkpoint' option (STORED AS KAFKA or REDIS); this query's sink ({} {}) has none",
                    leaf.table,
                    sink.kind,
                    sink.location
                );
            };
            let topic = config.location.clone();
            let offsets = match sink.kind.to_ascii_uppercase().as_str() {
                "KAFKA" => {
                    let brokers = sink
                        .options
                        .get("bootstrap.servers")
                        .context("the Kafka sink has no 'bootstrap.servers'")?
                        .clone();
                    let offsets_topic = sink
                        .options
                        .get("offsets.topic")
                        .cloned()
                        .unwrap_or_else(|| skein_connectors::kafka::DEFAULT_OFFSETS_TOPIC.into());
                    let (c, t) = (checkpoint.clone(), topic.clone());
                    tokio::task::spawn_blocking(move || {
                        skein_connectors::kafka::stored_offsets(&brokers, &offsets_topic, &c, &t)
                    })
                    .await?
                    .context("reading the Kafka sink's committed offsets")?
                }
                "REDIS" => {
                    skein_connectors::redis::stored_offsets(&sink.location, checkpoint, &topic)
                        .await
                        .context("reading the Redis sink's committed offsets")?
                }
                other => bail!(
                    "table {}: 'startup' 'checkpoint' needs a Kafka or Redis sink, not {other}",
                    leaf.table
                ),
            };
            let text = skein_connectors::kafka::format_offsets(&offsets);
            config.options.insert("startup".into(), "offsets".into());
            config.options.insert("offsets".into(), text.clone());
            resolved.push((leaf.table.clone(), text));
        }
    }
    Ok(resolved)
}
