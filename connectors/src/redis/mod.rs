//! Redis: a lookup table joins a stream with the values at its keys,
//! through the connection the Redis sink (skein-sinks) uses too, which
//! waits out outages.

pub mod lookup;

/// The connection the lookup shares with the sink (skein-clients).
pub use skein_clients::redis as conn;
pub use skein_clients::redis::KIND;
