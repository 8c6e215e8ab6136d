//! The catalog of this binary: every crate's table kinds. A crate lists
//! its own kinds (a line each); adding a crate of kinds is a line here.

use std::sync::Arc;

use skein_engine::catalog::Catalog;
use skein_engine::sink::CollectSinkFactory;

/// The catalog for a run; `collect` receives results that are not
/// INSERTed into a sink table.
pub struct Registries {
    pub catalog: Catalog,
    pub collect: CollectSinkFactory,
}

pub fn registries() -> Registries {
    let mut catalog = Catalog::default();
    skein_generators::table::register(&mut catalog);
    skein_connectors::register(&mut catalog);
    skein_sinks::register(&mut catalog);
    skein_ysb::register_sinks(&mut catalog);
    let collect = CollectSinkFactory::default();
    catalog.register_sink(skein_engine::sink::COLLECT_KIND, Arc::new(collect.clone()));
    catalog.register_sink(
        skein_sinks::results::KIND,
        Arc::new(skein_sinks::results::ResultsSinkFactory),
    );
    // `skein deploy` maps a Kinesis table declared 'mode' 'push' to its function.
    catalog.add_backend_options(
        skein_connectors::kinesis::KIND,
        &[skein_lambda::esm::MODE_OPTION],
    );
    Registries { catalog, collect }
}
