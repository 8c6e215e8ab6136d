//! Redis: the sink writes rows as keys, hashes or lists (or in a layout of
//! another crate, such as YSB's campaign windows), exactly once per (run,
//! epoch, member); a lookup table joins a stream with the values at its
//! keys. Both share one connection that waits out outages.

pub mod layout;
pub mod lookup;
mod sink;

pub use layout::{KeyedLayout, Layout, RedisLayout};
pub use sink::*;
/// The connection both share (skein-clients).
pub use skein_clients::redis as conn;
