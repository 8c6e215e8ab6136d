//! Kinesis, both directions: the source reads shards per epoch (or takes
//! the batches a Lambda event-source mapping pushes), the sink puts a record
//! per row. One `STORED AS KINESIS` table may be read and written.

mod shards;
mod sink;
mod source;

pub use sink::*;
pub use source::*;

pub use skein_clients::kinesis::KIND;
