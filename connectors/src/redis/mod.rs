//! Redis: the sink writes rows as keys, hashes or YSB's campaign windows,
//! exactly once per (run, epoch, member).

mod sink;

pub use sink::*;
