//! skein-sinks: where a query's results go, one module per system (the
//! shape of Vector's `src/sinks/<name>/`):
//! * [`kafka`]: a message per row, in a transaction per epoch when exactly
//!   once; upserts and Debezium change events for an updating query;
//! * [`kinesis`]: a record per row (at least once);
//! * [`redis`]: rows as keys, hashes or lists, or in a layout of another
//!   crate ([`redis::RedisLayout`], YSB's campaign windows), exactly once;
//! * [`files`]: objects on a local disk or S3, exactly once;
//! * [`blackhole`]: drops rows and counts them (a benchmark's sink);
//! * [`results`]: a query's rows as Arrow IPC objects, which `skein run
//!   --backend lambda` reads back;
//! * [`encode`]: the row encoders of the message sinks.
//!
//! Redis, Kafka and files are exactly once at any group size: each write is
//! keyed by (run, epoch, member) and a replay changes nothing (see
//! [`epochs`]). Client setup shared with the sources (Kafka properties,
//! the Redis connection, the Kinesis client, S3) is in skein-clients.

pub mod blackhole;
pub mod encode;
pub mod epoch_markers;
pub mod files;
pub mod kafka;
pub mod kinesis;
pub mod redis;
pub mod results;

pub use skein_clients::{error, store};

use std::sync::Arc;

use skein_engine::catalog::Catalog;

/// Register every sink kind of this crate in the catalog, a line each.
/// The RESULTS sink is not among them: the Lambda backend routes a query's
/// plain SELECT there itself.
pub fn register(catalog: &mut Catalog) {
    catalog.register_sink(kafka::KIND, Arc::new(kafka::KafkaSinkFactory));
    catalog.register_sink(kinesis::KIND, Arc::new(kinesis::KinesisSinkFactory));
    catalog.register_sink(redis::KIND, Arc::new(redis::RedisSinkFactory));
    catalog.register_sink(files::KIND, Arc::new(files::FilesSinkFactory));
    catalog.register_sink(
        blackhole::KIND,
        Arc::new(blackhole::BlackholeSinkFactory::default()),
    );
}
