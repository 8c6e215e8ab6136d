//! Redis: the sink writes rows as keys, hashes or YSB's campaign windows,
//! exactly once per (run, epoch, member); a lookup table joins a stream with
//! the values at its keys. Both share one connection that waits out outages.

pub mod conn;
pub mod lookup;
mod sink;

pub use sink::*;
