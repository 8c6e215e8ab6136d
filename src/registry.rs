//! The one place that lists every source and sink kind this binary knows.
//! Adding a connector is a line here and a module in its crate.

use std::sync::Arc;

use skein_engine::sink::{CollectSinkFactory, SinkRegistry};
use skein_engine::source::SourceRegistry;

/// Registries for a run; `collect` receives results that are not INSERTed
/// into a sink table.
pub struct Registries {
    pub sources: SourceRegistry,
    pub sinks: SinkRegistry,
    pub collect: CollectSinkFactory,
}

pub fn registries() -> Registries {
    let mut sources = SourceRegistry::default();
    skein_generators::table::register(&mut sources);
    skein_connectors::register(&mut sources);
    let collect = CollectSinkFactory::default();
    let mut sinks = SinkRegistry::default();
    sinks.register("COLLECT", Arc::new(collect.clone()));
    skein_connectors::register_sinks(&mut sinks, &mut sources);
    skein_ysb::register_sinks(&mut sinks, &mut sources);
    // `skein deploy` maps a Kinesis table declared 'mode' 'push' to its function.
    sources.allow_options(
        skein_connectors::kinesis::KIND,
        &[skein_lambda::esm::MODE_OPTION],
    );
    sinks.register(
        skein_connectors::results::KIND,
        Arc::new(skein_connectors::results::ResultsSinkFactory),
    );
    sources.know_sinks(&sinks);
    Registries {
        sources,
        sinks,
        collect,
    }
}
