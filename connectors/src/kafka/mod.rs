//! Kafka, both directions: the source reads partitions per epoch with
//! offsets it logs (`source`), the sink writes a message per row, in a
//! transaction per epoch when exactly once (`sink`). One `STORED AS KAFKA`
//! table may be read and written, so it takes the options of both.

pub mod changes;
mod options;
mod sink;
mod source;

pub use options::{SINK_OPTIONS, SOURCE_OPTIONS, client_properties, is_skein_option};
pub use sink::*;
pub use source::*;

/// The `STORED AS` name of a Kafka table.
pub const KIND: &str = "KAFKA";
