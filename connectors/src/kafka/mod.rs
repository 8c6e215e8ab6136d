//! Kafka, both directions: the source reads partitions per epoch with
//! offsets it logs (`source`), the sink writes a message per row, in a
//! transaction per epoch when exactly once (`sink`). One `STORED AS KAFKA`
//! table may be read and written, so it takes the options of both.

pub mod changes;
mod sink;
mod source;

pub use sink::*;
pub use skein_clients::kafka::{FETCH_DEFAULTS, KIND, KafkaRole, client_config, client_properties};
pub use source::*;
