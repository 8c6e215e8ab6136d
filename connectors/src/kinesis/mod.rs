//! Kinesis: the source reads shards per epoch, or takes the batches a
//! Lambda event-source mapping pushes. The sink is in skein-sinks.

mod reader;
mod shards;
mod source;

pub use source::*;

pub use skein_clients::kinesis::KIND;
