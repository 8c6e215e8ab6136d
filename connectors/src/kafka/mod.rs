//! Kafka: the source reads partitions per epoch with offsets it logs
//! (`source`). The sink is in skein-sinks; the client setup both sides
//! share in skein-clients.

mod source;

pub use skein_clients::kafka::{FETCH_DEFAULTS, KIND, KafkaRole, client_config, client_properties};
pub use source::*;
